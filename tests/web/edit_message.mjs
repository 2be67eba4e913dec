// Edit a past message: its Edit button opens an editor with its text;
// sending the edited text forks the session just before that message's
// turn, with the new text, and the page switches to the fork, which shows
// where it came from (a divider naming the parent, under the conversation
// the fork inherited), the edited message and its answer. The parent stays
// as it was, and so does its draft: the fork's message box starts empty.

import {
  assert,
  assertFits,
  conversation,
  createSession,
  exchange,
  openedFork,
  scenario,
  until,
  waitForAnswer,
  waitForInherited,
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

  // A draft typed in the parent stays the parent's.
  const box = page.getByTestId("message-input");
  const draft = "a draft that belongs to the parent";
  await box.fill(draft);
  await second.getByRole("button", { name: "Edit this message" }).click();
  await editor.fill(params.edited);
  await second.getByTestId("edit-submit").click();
  const { forkId, marker } = await openedFork(page, parentId);
  log("forked into", forkId);
  assert.equal(await marker.getAttribute("data-parent"), parentId);
  assert.equal(await box.inputValue(), "", "the parent's draft is not in the fork's message box");
  // The divider names the parent by its title and links to it.
  await until("the divider to name the parent", async () => (await marker.getByTestId("open-parent").textContent()) === params.first_question);
  assert.match(await marker.textContent(), new RegExp(`^Forked from ${params.first_question.replace("?", "\\?")}`));
  // The fork shows what it inherited, the first exchange, above the divider.
  assert.deepEqual(await waitForInherited(page), [
    { role: "user", text: params.first_question },
    { role: "assistant", text: params.answers[0] },
  ]);
  const above = await page.evaluate(() => {
    const marker = document.querySelector("[data-testid=fork-marker]");
    return Array.from(document.querySelectorAll("[data-testid=inherited-message]")).every(
      (item) => item.compareDocumentPosition(marker) & Node.DOCUMENT_POSITION_FOLLOWING,
    );
  });
  assert.ok(above, "the inherited conversation is above the divider");
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
  assert.equal(await box.inputValue(), draft, "the parent's draft is back in its message box");
  const parent = await conversation(page);
  assert.deepEqual(parent.users, [params.first_question, params.second_question]);
  return { session_id: parentId, fork_id: forkId };
});
