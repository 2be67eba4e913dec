// Titles, rename and delete. A session is titled by its first message (in
// the header and the list); Rename edits the title in place (Escape
// cancels); the new title survives a reload. Delete asks first (Keep it
// keeps it); once confirmed the session leaves the list and the page
// leaves the session.

import { assert, createSession, menuAction, scenario, send, until, waitForAnswer, waitForSession } from "./lib.mjs";

scenario("rename_delete", async ({ page, base, params, log }) => {
  await page.goto(base);
  const id = await createSession(page);
  const title = page.getByTestId("chat-title");
  const item = page.locator(`[data-testid=session-item][data-session-id="${id}"]`);
  const listedTitle = item.getByTestId("session-title");
  await send(page, params.first_message);
  await waitForAnswer(page, params.answer);
  await until("the header to show the title", async () => (await title.textContent()) === params.auto_title);
  await until("the list to show the title", async () => (await listedTitle.textContent()) === params.auto_title);
  assert.equal(await page.getByTestId("chat-id").textContent(), id, "the id shows under the title");

  // Rename, then think better of it.
  await (await menuAction(page, "Rename this session")).click();
  const input = page.getByTestId("rename-input");
  assert.equal(await input.inputValue(), params.auto_title, "the editor starts from the title");
  await input.fill("Never saved");
  await input.press("Escape");
  await input.waitFor({ state: "hidden" });
  assert.equal(await title.textContent(), params.auto_title);

  await (await menuAction(page, "Rename this session")).click();
  await input.fill(params.new_title);
  await input.press("Enter");
  await until("the header to show the new title", async () => (await title.textContent()) === params.new_title);
  await until("the list to show the new title", async () => (await listedTitle.textContent()) === params.new_title);
  await input.waitFor({ state: "hidden" });

  await page.reload();
  await waitForSession(page, id);
  await until("the title after a reload", async () => (await title.textContent()) === params.new_title);
  await until("the listed title after a reload", async () => (await listedTitle.textContent()) === params.new_title);

  // Delete: first kept, then deleted for good.
  const confirm = page.getByTestId("delete-confirm");
  await (await menuAction(page, "Delete this session")).click();
  await confirm.waitFor({ state: "visible" });
  await page.getByTestId("delete-confirm-no").click();
  await confirm.waitFor({ state: "hidden" });
  assert.equal(await page.getByTestId("chat-view").isVisible(), true, "Keep it keeps the session open");

  await (await menuAction(page, "Delete this session")).click();
  await page.getByRole("button", { name: "Delete for good" }).click();
  await page.getByTestId("empty-chat").waitFor({ state: "visible" });
  assert.ok(!/#\/sessions\//.test(page.url()), `the page left the session: ${page.url()}`);
  await item.waitFor({ state: "detached" });
  await page.locator(`[data-testid=session-item][data-session-id="${params.other}"]`).waitFor();
  assert.match(await page.getByTestId("notice").textContent(), new RegExp(`Deleted the session “${params.new_title}”`));
  log("deleted", id);
  return { session_id: id };
});
