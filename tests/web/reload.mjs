// The page reloaded in the middle of a slow stream rebuilds the view from
// the start of the log and goes on live. At every instant sampled after the
// reload, the timeline lists sequences 1..N once each, matching the server's
// log event for event, and the streamed text is exactly the deltas of those
// N events (a duplicated or missed delta would show); the answer then
// streams on to its final text.

import {
  assert,
  assertGapless,
  createSession,
  pageApi,
  send,
  scenario,
  serverLog,
  sessionPath,
  snapshot,
  timelineSequences,
  until,
  waitForSession,
} from "./lib.mjs";

/** Checks one snapshot against the server's log; answers its last sequence. */
function checkAgainstLog(shown, log) {
  const last = shown.timeline.length;
  assertGapless(
    shown.timeline.map((entry) => entry.sequence),
    last,
  );
  assert.ok(log.length >= last, `the page shows ${last} events, the server has ${log.length}`);
  assert.deepEqual(
    shown.timeline,
    log.slice(0, last).map((event) => ({ sequence: event.sequence, kind: event.msg.type })),
    "the timeline matches the server's log",
  );
  for (const answer of shown.answers) {
    const deltas = log
      .slice(0, last)
      .filter((event) => event.msg.type === "assistant_content_delta" && event.msg.turn_id === answer.turn_id)
      .map((event) => event.msg.delta)
      .join("");
    const message = log
      .slice(0, last)
      .find((event) => event.msg.type === "assistant_message" && event.msg.turn_id === answer.turn_id);
    assert.equal(answer.text, message ? message.msg.text : deltas, "the chat shows each delta exactly once");
  }
  return last;
}

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
  await waitForSession(page, sessionId);
  await page.locator('[data-testid=assistant-message][data-state="streaming"]').waitFor();
  // Sample the page while the answer streams on: each sample must agree
  // with the log as the server stored it.
  let samples = 0;
  let streamingSamples = 0;
  for (;;) {
    const shown = await snapshot(page);
    const stored = await serverLog(page, sessionId);
    checkAgainstLog(shown, stored);
    samples += 1;
    const state = shown.answers[0]?.state;
    if (state === "streaming") {
      streamingSamples += 1;
    }
    if (state === "final" || samples > 400) {
      break;
    }
  }
  log(`${samples} samples after the reload, ${streamingSamples} while streaming`);
  assert.ok(streamingSamples >= 2, "the page was sampled while the answer still streamed");

  const final = page.locator('[data-testid=assistant-message][data-state="final"]');
  await final.waitFor({ timeout: 30000 });
  assert.equal(await final.getByTestId("assistant-text").textContent(), params.full_text);
  await page.getByTestId("interrupt").waitFor({ state: "hidden" });

  const session = await pageApi(page, sessionPath(sessionId));
  assert.equal(session.status, 200);
  const last = session.body.last_sequence;
  await until("the timeline to reach the last event", async () => (await timelineSequences(page)).length >= last);
  const shown = await snapshot(page);
  assert.equal(checkAgainstLog(shown, await serverLog(page, sessionId)), last);
  assert.equal(Number(await page.getByTestId("timeline-count").textContent()), last);
  assert.equal(await page.getByTestId("user-message").count(), 1);
  assert.equal(await page.getByTestId("assistant-message").count(), 1);
  assert.ok(before.length < last, "the reload came before the end of the turn");
  return {
    session_id: sessionId,
    timeline: shown.timeline,
    rendered_before_reload: before.length,
    samples_while_streaming: streamingSamples,
  };
});
