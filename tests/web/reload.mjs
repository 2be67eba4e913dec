// The page reloaded in the middle of a slow stream rebuilds the view from
// the start of the log and goes on live: the timeline lists every sequence
// once, and the answer streams on to its final text.

import { assert, assertGapless, createSession, pageApi, send, scenario, sessionPath, timelineSequences, until } from "./lib.mjs";

scenario("reload", async ({ page, base, params, log }) => {
  await page.goto(base);
  const sessionId = await createSession(page);
  await send(page, "Count slowly");
  const text = page.getByTestId("assistant-text");
  await until("a few words to stream", async () => ((await text.first().textContent()) ?? "").includes("word5"));
  const before = await timelineSequences(page);
  assertGapless(before, before.length);
  log(`reloading after ${before.length} events`);

  await page.reload();
  // The same session, rebuilt from sequence 1, still streaming.
  await until("the session to reopen", async () => (await page.getByTestId("chat-title").textContent()) === sessionId);
  await page.locator('[data-testid=assistant-message][data-state="streaming"]').waitFor();
  const final = page.locator('[data-testid=assistant-message][data-state="final"]');
  await final.waitFor({ timeout: 30000 });
  assert.equal(await final.getByTestId("assistant-text").textContent(), params.full_text);
  await page.getByTestId("interrupt").waitFor({ state: "hidden" });

  const session = await pageApi(page, sessionPath(sessionId));
  assert.equal(session.status, 200);
  const last = session.body.last_sequence;
  await until("the timeline to reach the last event", async () => (await timelineSequences(page)).length >= last);
  const timeline = await timelineSequences(page);
  assertGapless(timeline, last);
  assert.equal(Number(await page.getByTestId("timeline-count").textContent()), last);
  assert.equal(await page.getByTestId("user-message").count(), 1);
  assert.equal(await page.getByTestId("assistant-message").count(), 1);
  assert.ok(before.length < last, "the reload came before the end of the turn");
  return { session_id: sessionId, timeline, rendered_before_reload: before.length };
});
