// Lifecycle events are status, not conversation. A session unloaded while
// idle (`shutdown_complete`, with `--idle-unload-secs 1` and no page open)
// and reopened by the next message (`session_started`, resumed) shows no
// note in the conversation for either: the header's status says it. A
// turn's error, which the user must see, stays in the conversation.

import { assert, createSession, scenario, send, sessionPath, until, waitForAnswer, waitForSession } from "./lib.mjs";

/** The texts of the conversation's items. */
async function items(page) {
  return page.getByTestId("messages").evaluate((list) => Array.from(list.children, (item) => item.textContent));
}

/** The session's stored log, read by the scenario itself (the page may be away). */
async function storedKinds(base, sessionId) {
  const reply = await fetch(`${base}${sessionPath(sessionId)}/events?after=0&limit=1000`);
  const body = await reply.json();
  return body.events.map((event) => event.msg.type);
}

function assertNoLifecycle(texts, when) {
  const noted = texts.filter((text) => /shut down|reopened|unloaded/i.test(text));
  assert.deepEqual(noted, [], `${when}: no lifecycle note in the conversation`);
}

scenario("lifecycle", async ({ page, base, params, log }) => {
  await page.goto(base);
  const sessionId = await createSession(page);
  await send(page, "Hello");
  await waitForAnswer(page, params.answers[0]);

  // Away from the page, the idle session is unloaded.
  await page.goto("about:blank");
  await until("the session to be unloaded", async () => (await storedKinds(base, sessionId)).includes("shutdown_complete"), {
    timeout: 30000,
    every: 200,
  });
  log("unloaded");
  await page.goto(`${base}/#/sessions/${encodeURIComponent(sessionId)}`);
  await waitForSession(page, sessionId);
  await page.locator('[data-testid=timeline-event][data-kind="shutdown_complete"]').waitFor({ state: "attached" });
  await waitForAnswer(page, params.answers[0]);
  assertNoLifecycle(await items(page), "after the unload");
  assert.equal(await page.locator("[data-testid=note]").count(), 0, "no note at all");
  const status = page.getByTestId("session-status");
  assert.match(await status.textContent(), /Unloaded/, "the header says the session was unloaded");
  assert.ok(await status.isVisible(), "and shows it");

  // The next message reopens it: status again.
  await send(page, "Again");
  await waitForAnswer(page, params.answers[1]);
  await until("the reopening in the timeline", async () => {
    const started = page.locator('[data-testid=timeline-event][data-kind="session_started"]');
    return (await started.count()) >= 2;
  });
  assertNoLifecycle(await items(page), "after the reopening");
  assert.doesNotMatch(await status.textContent(), /Unloaded/, "the status no longer says unloaded");

  // A turn's error stays in the conversation, visible.
  await send(page, "Fail");
  const error = page.locator('[data-testid=note][data-kind="error"], [data-testid=note][data-kind="turn_aborted"]').first();
  await error.waitFor({ state: "visible" });
  assert.match(await error.textContent(), new RegExp(params.model_error));
  assertNoLifecycle(await items(page), "after the error");
  return { session_id: sessionId };
});
