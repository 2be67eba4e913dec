// The server restarts while the page is open: the page shows that its
// stream is reconnecting, resumes it by itself once the server is back
// (EventSource with Last-Event-ID), and goes on with no gap and no
// duplicate: the next turn streams in and the timeline still matches the
// server's log event for event.
//
// The restart is done by the Rust side: this script writes
// `{signal_dir}/restart` when it wants the server restarted and waits for
// `{signal_dir}/restarted`.

import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { assert, assertGapless, createSession, send, scenario, serverLog, snapshot, until } from "./lib.mjs";

scenario("restart", async ({ page, base, params, log }) => {
  await page.goto(base);
  const sessionId = await createSession(page);
  await send(page, "Before the restart");
  const finals = page.locator('[data-testid=assistant-message][data-state="final"]');
  await finals.filter({ hasText: params.first_text }).waitFor();
  const before = await snapshot(page);
  log(`asking for a restart after ${before.timeline.length} events`);

  // Record each stream status the page shows from here on.
  await page.evaluate(() => {
    window.streamStates = [];
    const badge = document.querySelector("[data-testid=stream-status]");
    new MutationObserver(() => window.streamStates.push(badge.dataset.state)).observe(badge, {
      attributes: true,
      attributeFilter: ["data-state"],
    });
  });
  writeFileSync(join(params.signal_dir, "restart"), "");
  await until("the page to notice the server went away", () =>
    page.evaluate(() => window.streamStates.some((state) => state !== "live")),
  { timeout: 30000 });
  await until("the server to be back", () => existsSync(join(params.signal_dir, "restarted")), { timeout: 60000 });
  await page.locator('[data-testid=stream-status][data-state="live"]').waitFor({ timeout: 30000 });
  log("stream states:", JSON.stringify(await page.evaluate(() => window.streamStates)));

  await send(page, "After the restart");
  await finals.filter({ hasText: params.second_text }).waitFor({ timeout: 30000 });
  const stored = await serverLog(page, sessionId);
  await until("the timeline to reach the last event", async () => (await snapshot(page)).timeline.length === stored.length);
  const shown = await snapshot(page);
  assertGapless(
    shown.timeline.map((entry) => entry.sequence),
    stored.length,
  );
  assert.deepEqual(
    shown.timeline,
    stored.map((event) => ({ sequence: event.sequence, kind: event.msg.type })),
    "the timeline matches the server's log",
  );
  assert.deepEqual(
    shown.answers.map((answer) => answer.text),
    [params.first_text, params.second_text],
  );
  assert.equal(await page.getByTestId("user-message").count(), 2);
  assert.ok(before.timeline.length < shown.timeline.length);
  return { session_id: sessionId, timeline: shown.timeline };
});
