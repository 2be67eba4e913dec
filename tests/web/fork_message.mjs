// Fork from a message: its Fork button makes a new session with the
// conversation up to the end of that message's exchange and switches to it;
// the fork shows the conversation it inherited (the first exchange) above a
// divider that names the parent and links back; a message sent there goes
// on from the fork point.

import {
  assert,
  conversation,
  createSession,
  exchange,
  openedFork,
  scenario,
  send,
  until,
  waitForAnswer,
  waitForInherited,
  waitForSession,
} from "./lib.mjs";

scenario("fork_message", async ({ page, base, params, log }) => {
  await page.goto(base);
  const parentId = await createSession(page);
  await exchange(page, params.questions, params.answers);

  const fork = page.getByTestId("user-message").first().getByRole("button", { name: "Fork the conversation after this exchange" });
  await fork.click();
  const { forkId, marker } = await openedFork(page, parentId);
  assert.equal(await marker.getAttribute("data-parent"), parentId);
  const at = Number(await marker.getAttribute("data-at"));
  log(`forked into ${forkId} at ${at}`);
  await until("the divider to name the parent by its title", async () =>
    (await marker.textContent()).startsWith(`Forked from ${params.questions[0]}`));
  assert.deepEqual((await conversation(page)).users, [], "the fork's own log has no messages yet");
  assert.deepEqual(
    await waitForInherited(page),
    [
      { role: "user", text: params.questions[0] },
      { role: "assistant", text: params.answers[0] },
    ],
    "the fork shows the exchange it inherited, not the later one",
  );

  await send(page, params.fork_question);
  await waitForAnswer(page, params.fork_answer);
  assert.deepEqual((await conversation(page)).users, [params.fork_question]);

  await marker.getByRole("link", { name: `Open the parent session ${parentId}` }).click();
  await waitForSession(page, parentId);
  await waitForAnswer(page, params.answers[1]);
  assert.deepEqual((await conversation(page)).users, params.questions, "the parent is unchanged");
  return { session_id: parentId, fork_id: forkId, at_sequence: at };
});
