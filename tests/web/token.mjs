// A server with a token: the page asks for it (again when it is wrong),
// keeps it in sessionStorage for the reload, sends it with every call and
// on the event stream; a fresh tab opened on a session asks once, however
// many of its first requests were refused.

import { assert, createSession, scenario, send, sessionIdOf, until } from "./lib.mjs";

// Counts the token prompts of each page load.
function countPrompts() {
  window.tokenPrompts = 0;
  const showModal = HTMLDialogElement.prototype.showModal;
  HTMLDialogElement.prototype.showModal = function counted() {
    if (this.id === "token-dialog") {
      window.tokenPrompts += 1;
    }
    return showModal.call(this);
  };
}

scenario("token", async ({ browser, page, base, params, log, newPage }) => {
  await page.context().addInitScript(countPrompts);
  const prompts = (on) => on.evaluate(() => window.tokenPrompts);
  const dialog = page.getByTestId("token-dialog");

  await page.goto(base);
  await dialog.waitFor({ state: "visible" });
  assert.match(await page.getByTestId("token-message").textContent(), /needs an access token/);
  await page.getByTestId("token-input").fill("not-the-token");
  await page.getByTestId("token-submit").click();
  await until("the page to ask again", async () => (await prompts(page)) === 2);
  await dialog.waitFor({ state: "visible" });
  assert.match(await page.getByTestId("token-message").textContent(), /refused/);
  await page.getByTestId("token-input").fill(params.token);
  await page.getByTestId("token-input").press("Enter");
  await dialog.waitFor({ state: "hidden" });
  await page.getByTestId("session-list-status").filter({ hasText: "No sessions yet." }).waitFor();
  log("token accepted");

  const sessionId = await createSession(page);
  await send(page, "Hello behind a token");
  const final = page.locator('[data-testid=assistant-message][data-state="final"]');
  await final.waitFor();
  assert.equal(await final.getByTestId("assistant-text").textContent(), params.full_text);
  assert.equal(await prompts(page), 2, "no prompt once the token was given");
  assert.equal(await page.evaluate(() => sessionStorage.getItem("keel.token")), params.token);
  assert.ok(!page.url().includes(params.token), "the token stays out of the page's URL");

  // A reload keeps the token: no prompt, the stream replays.
  await page.reload();
  await final.waitFor();
  assert.equal(await final.getByTestId("assistant-text").textContent(), params.full_text);
  await page.locator('[data-testid=stream-status][data-state="live"]').waitFor();
  assert.equal(await prompts(page), 0);
  assert.equal(await dialog.isVisible(), false);
  log("reload kept the token");

  // A new tab of a new browser context has no token: one prompt for the
  // list, the session and the stream together.
  const context = await browser.newContext();
  await context.addInitScript(countPrompts);
  const fresh = await newPage(context);
  await fresh.goto(`${base}/#/sessions/${encodeURIComponent(sessionId)}`);
  await fresh.getByTestId("token-dialog").waitFor({ state: "visible" });
  await fresh.getByTestId("token-input").fill(params.token);
  await fresh.getByTestId("token-submit").click();
  const freshFinal = fresh.locator('[data-testid=assistant-message][data-state="final"]');
  await freshFinal.waitFor();
  assert.equal(await freshFinal.getByTestId("assistant-text").textContent(), params.full_text);
  await fresh.locator(`[data-testid=session-item][data-session-id="${sessionId}"]`).waitFor();
  await fresh.locator('[data-testid=stream-status][data-state="live"]').waitFor();
  assert.equal(sessionIdOf(fresh), sessionId);
  assert.equal(await prompts(fresh), 1, "one prompt, however many requests were refused");
  await context.close();
  return { session_id: sessionId };
});
