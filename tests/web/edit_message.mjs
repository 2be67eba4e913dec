// Edit a past message: its Edit button opens an editor with its text;
// sending the edited text forks the session just before that message's
// turn, with the new text, and the page switches to the fork, which shows
// where it came from, the edited message and its answer. The parent stays
// as it was.

import {
  assert,
  assertFits,
  conversation,
  createSession,
  exchange,
  openedFork,
  scenario,
  waitForAnswer,
  waitForSession,
} from "./lib.mjs";

scenario("edit_message", async ({ page, base, params, log }) => {
  await page.goto(base);
  const parentId = await createSession(page);
  await exchange(page, [params.first_question, params.second_question], params.answers);

  const second = page.getByTestId("user-message").nth(1);
  await second.getByRole("button", { name: "Edit this message" }).click();
  const editor = second.getByTestId("edit-input");
  assert.equal(await editor.inputValue(), params.second_question, "the editor holds the message's text");
  await assertFits(page, "the message editor");
  // Cancel leaves the message as it was.
  await second.getByTestId("edit-cancel").click();
  await editor.waitFor({ state: "detached" });
  assert.equal(await second.getByTestId("message-text").isVisible(), true);

  await second.getByRole("button", { name: "Edit this message" }).click();
  await editor.fill(params.edited);
  await second.getByTestId("edit-submit").click();
  const { forkId, marker } = await openedFork(page, parentId);
  log("forked into", forkId);
  assert.equal(await marker.getAttribute("data-parent"), parentId);
  assert.equal(await marker.getByTestId("open-parent").textContent(), parentId);
  await waitForAnswer(page, params.fork_answer);
  const shown = await conversation(page);
  assert.deepEqual(shown.users, [params.edited], "the fork shows the edited message");
  assert.deepEqual(shown.answers.map((answer) => answer.text), [params.fork_answer]);
  // The fork is listed.
  await page.locator(`[data-testid=session-item][data-session-id="${forkId}"]`).waitFor();

  // The parent is unchanged.
  await marker.getByTestId("open-parent").click();
  await waitForSession(page, parentId);
  await waitForAnswer(page, params.answers[1]);
  const parent = await conversation(page);
  assert.deepEqual(parent.users, [params.first_question, params.second_question]);
  return { session_id: parentId, fork_id: forkId };
});
