// Signing in with an API key, a JWT or the server's token: the header shows
// the tenant and the name the server knows the credential by (GET
// /v1/whoami), and what the scopes forbid is not shown (no Approve without
// `approve`; no message box, New chat, Fork, Edit or Regenerate without
// `submit`; no Delete without `admin`). A message sent by someone else
// names them. When the credential is revoked mid-session, the page goes
// back to the sign-in box and says why; signing out forgets it.
//
// Params: `credential`; `session_id`, a session of the credential's tenant
// with one answered message and a tool call waiting for approval;
// `badge` (a regex source) and `tenant` (the header's data-tenant);
// `scopes`; optionally `sender`, how the first message's author is shown, and
// `revoke` {method, path, token}: an API call that revokes the credential.

import { assert, scenario, until } from "./lib.mjs";

scenario("principals", async ({ page, base, params, log }) => {
  const has = (scope) => params.scopes.includes(scope);
  const dialog = page.getByTestId("token-dialog");

  await page.goto(`${base}/#/sessions/${encodeURIComponent(params.session_id)}`);
  await dialog.waitFor({ state: "visible" });
  await page.getByTestId("token-input").fill(params.credential);
  await page.getByTestId("token-submit").click();
  await dialog.waitFor({ state: "hidden" });
  const badge = page.getByTestId("principal");
  await badge.waitFor();
  assert.match(await badge.textContent(), new RegExp(params.badge));
  assert.equal(await badge.getAttribute("data-tenant"), params.tenant);
  assert.ok(await page.getByTestId("sign-out").isVisible(), "a signed-in page can sign out");
  assert.ok(!page.url().includes(params.credential), "the credential stays out of the page's URL");
  log("signed in as", await badge.textContent());

  const message = page.getByTestId("user-message").first();
  await message.waitFor();
  if (params.sender) {
    assert.equal(await message.getByTestId("message-author").textContent(), params.sender);
  }
  await page.locator('[data-testid=assistant-message][data-state="final"]').first().waitFor();
  const card = page.locator('[data-testid=tool-card][data-state="awaiting"]');
  await card.waitFor();
  await page.locator('[data-testid=stream-status][data-state="live"]').waitFor();

  const visible = async (locator) => (await locator.count()) > 0 && (await locator.first().isVisible());
  const shown = {
    approve: await visible(card.getByTestId("approve")),
    deny: await visible(card.getByTestId("deny")),
    cannot_approve: await visible(card.getByTestId("cannot-approve")),
    composer: await visible(page.getByTestId("composer")),
    read_only: await visible(page.getByTestId("read-only")),
    new_chat: await visible(page.getByTestId("new-chat")),
    fork: await visible(message.getByTestId("fork-message")),
    edit: await visible(message.getByTestId("edit-message")),
    interrupt: await visible(page.getByTestId("interrupt")),
  };
  await page.getByTestId("session-menu-button").click();
  shown.delete = await visible(page.getByTestId("delete-session"));
  shown.rename = await visible(page.getByTestId("rename-session"));
  await page.getByTestId("session-menu-button").click();
  log("shown", JSON.stringify(shown));
  const expected = {
    approve: has("approve"),
    deny: has("approve"),
    cannot_approve: !has("approve"),
    composer: has("submit"),
    read_only: !has("submit"),
    new_chat: has("submit"),
    fork: has("submit"),
    edit: has("submit"),
    interrupt: has("submit"),
    delete: has("admin"),
    rename: has("submit"),
  };
  assert.deepEqual(shown, expected, "the page shows what the scopes allow, and only that");

  if (params.revoke) {
    const { method, path, token } = params.revoke;
    const response = await fetch(`${base}${path}`, { method, headers: { Authorization: `Bearer ${token}` } });
    assert.ok(response.ok, `the revocation was refused: ${response.status} ${await response.text()}`);
    log("revoked");
    // The open stream is closed by the server; the page's next request is
    // refused, and it asks again.
    await dialog.waitFor({ state: "visible", timeout: 15000 });
    assert.match(await page.getByTestId("token-message").textContent(), /no longer accepts/);
    await until("the stream to stop", async () => (await page.getByTestId("stream-status").getAttribute("data-state")) !== "live");
    log("back at the sign-in box");
  } else {
    // Signing out forgets the credential: the page asks again.
    await page.getByTestId("sign-out").click();
    await dialog.waitFor({ state: "visible" });
    assert.equal(await page.evaluate(() => sessionStorage.getItem("keel.token")), null);
    log("signed out");
  }
  return { session_id: params.session_id, shown };
});
