// The whole flow on a phone (390×844, touch): the session list is a drawer
// opened by its button (open by itself when no session is shown), every
// action is reachable by touch (no hover), and nothing overflows sideways
// at any step: create, send, regenerate, events pane, fork, rename,
// compact (refused), delete.

import {
  assert,
  assertFits,
  assertOnScreen,
  conversation,
  menuAction,
  openedFork,
  scenario,
  sessionIdOf,
  until,
  waitForAnswer,
  waitForSession,
} from "./lib.mjs";

const PHONE = { viewport: { width: 390, height: 844 }, hasTouch: true, isMobile: true };

async function flow({ page, base, params, log }) {
  await page.goto(base);
  const sidebar = page.getByTestId("sidebar");
  const toggle = page.getByTestId("sessions-toggle");

  // No session: the drawer is open, its "New chat" button on screen; the
  // dialog it opens fits too.
  await sidebar.waitFor({ state: "visible" });
  await assertOnScreen(page, page.getByTestId("new-chat"), "the New chat button");
  await assertFits(page, "the drawer");
  await page.getByTestId("new-chat").tap();
  await assertOnScreen(page, page.getByTestId("new-session-submit"), "the Start chat button");
  await assertFits(page, "the New chat dialog");
  await page.getByTestId("new-session-submit").tap();
  await until("the new session", () => /#\/sessions\//.test(page.url()));
  const parentId = sessionIdOf(page);
  await waitForSession(page, parentId);
  await sidebar.waitFor({ state: "hidden" });
  await page.locator('[data-testid=stream-status][data-state="live"]').waitFor();
  await assertFits(page, "a new session");

  // Send and regenerate, by touch.
  const box = page.getByTestId("message-input");
  await assertOnScreen(page, box, "the message box");
  await box.fill(params.question);
  await page.getByTestId("send").tap();
  // The first answer has a code block wider than the screen: it scrolls
  // inside its bubble, which fits.
  await waitForAnswer(page, params.first_shown);
  await assertFits(page, "a wide code block");
  const user = page.getByTestId("user-message").first();
  await assertOnScreen(page, user.getByRole("button", { name: "Edit this message" }), "Edit");
  await assertOnScreen(page, user.getByRole("button", { name: "Fork the conversation after this exchange" }), "Fork");
  // The editor of a past message fits too.
  await user.getByRole("button", { name: "Edit this message" }).tap();
  await assertOnScreen(page, user.getByTestId("edit-submit"), "the editor's Send button");
  await assertFits(page, "the message editor");
  await user.getByTestId("edit-cancel").tap();
  await user.getByTestId("message-editor").waitFor({ state: "detached" });
  const regenerate = page.getByRole("button", { name: "Regenerate this answer" });
  await assertOnScreen(page, regenerate, "Regenerate");
  await regenerate.tap();
  await waitForAnswer(page, params.answers[1]);
  const shown = await conversation(page);
  assert.deepEqual(shown.replacedAnswers, [params.first_shown], "the first answer is hidden");
  assert.deepEqual(shown.users, [params.question]);
  assert.deepEqual(shown.answers.map((answer) => answer.text), [params.answers[1]]);
  await assertFits(page, "after regenerating");

  // The events pane folds.
  const events = page.getByTestId("events-toggle");
  const timeline = page.getByTestId("timeline");
  assert.equal(await timeline.isVisible(), false);
  await events.tap();
  await timeline.waitFor({ state: "visible" });
  await assertFits(page, "with the events pane open");
  await events.tap();
  await timeline.waitFor({ state: "hidden" });

  // Fork from the message.
  // The message shown is the regenerated turn's (the undone one is hidden).
  const shownUser = page.locator("[data-testid=user-message]:not([data-replaced])");
  assert.equal(await shownUser.count(), 1);
  await shownUser.getByRole("button", { name: "Fork the conversation after this exchange" }).tap();
  const { forkId } = await openedFork(page, parentId, "the fork to open");
  await assertFits(page, "the fork");

  // The drawer lists both; the parent opens from it and the drawer closes.
  assert.equal(await toggle.getAttribute("aria-expanded"), "false");
  await toggle.tap();
  await sidebar.waitFor({ state: "visible" });
  assert.equal(await toggle.getAttribute("aria-expanded"), "true");
  const parentItem = page.locator(`[data-testid=session-item][data-session-id="${parentId}"]`);
  await page.locator(`[data-testid=session-item][data-session-id="${forkId}"]`).waitFor();
  await assertOnScreen(page, parentItem.getByTestId("session-link"), "the parent's list entry");
  await assertFits(page, "the drawer over a session");
  await parentItem.getByTestId("session-link").tap();
  await waitForSession(page, parentId);
  await sidebar.waitFor({ state: "hidden" });
  // And the drawer's own Close button closes it.
  await toggle.tap();
  await sidebar.waitFor({ state: "visible" });
  await page.getByTestId("sessions-close").tap();
  await sidebar.waitFor({ state: "hidden" });

  // Rename, with a long title that has nowhere to break.
  await (await menuAction(page, "Rename this session", "tap")).tap();
  await page.getByTestId("rename-input").fill(params.title);
  await page.getByTestId("rename-save").tap();
  await until("the new title", async () => (await page.getByTestId("chat-title").textContent()) === params.title);
  await assertFits(page, "a long title");

  // Compact: nothing to compact yet, said once.
  await (await menuAction(page, /Compact the context/, "tap")).tap();
  const refused = page.locator('[data-testid=note][data-kind="submission_rejected"]');
  await refused.waitFor();
  await page.waitForTimeout(300);
  assert.equal(await refused.count(), 1);
  await assertFits(page, "after the refusal");

  // Delete the fork from its own page.
  await toggle.tap();
  await page.locator(`[data-testid=session-item][data-session-id="${forkId}"] [data-testid=session-link]`).tap();
  await waitForSession(page, forkId);
  await (await menuAction(page, "Delete this session", "tap")).tap();
  await assertOnScreen(page, page.getByTestId("delete-confirm-yes"), "the confirm button");
  await assertFits(page, "the delete question");
  await page.getByTestId("delete-confirm-yes").tap();
  await page.getByTestId("empty-chat").waitFor({ state: "attached" });
  await sidebar.waitFor({ state: "visible" });
  await page.locator(`[data-testid=session-item][data-session-id="${forkId}"]`).waitFor({ state: "detached" });
  await parentItem.waitFor();
  await assertFits(page, "after deleting");
  log("done");
  return { session_id: parentId, fork_id: forkId };
}

scenario("phone", flow, { context: PHONE });
