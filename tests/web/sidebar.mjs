// The sidebar of a chat app, at the width given (1280 or 390 px): a "New
// chat" button instead of a permanent form (its dialog offers the server's
// models with the default shown, bot id and instructions folded under
// "More options"); sessions most recently active first, grouped by day;
// and a session whose model the server no longer offers says why and
// offers to switch its model, after which a message is answered.

import {
  assert,
  assertFits,
  assertOnScreen,
  scenario,
  send,
  until,
  waitForAnswer,
  waitForSession,
} from "./lib.mjs";

const width = Number(JSON.parse(process.argv[3] ?? "{}").width ?? 1280);
const phone = width < 600;
const context = phone
  ? { viewport: { width, height: 844 }, hasTouch: true, isMobile: true }
  : { viewport: { width, height: 900 } };

async function openDrawer(page) {
  if (!phone) {
    return;
  }
  // Whether the drawer is open is its button's state: "New chat" inside it
  // stays hidden until the page knows its principal's scopes (GET
  // /v1/whoami), and clicking the button of a drawer already open would
  // hit the drawer over it.
  const toggle = page.getByTestId("sessions-toggle");
  if ((await toggle.getAttribute("aria-expanded")) !== "true") {
    await toggle.click();
  }
  await page.getByTestId("sidebar").waitFor({ state: "visible" });
  await page.locator("body:not(.scopes-pending)").waitFor({ state: "attached" });
}

scenario(
  "sidebar",
  async ({ page, base, params, log }) => {
    await page.goto(base);
    await openDrawer(page);

    // Sessions by last activity, under day headings.
    const listed = () =>
      page.evaluate(() =>
        Array.from(document.querySelectorAll("[data-testid=session-list] > li"), (item) =>
          item.dataset.sessionId ? item.dataset.sessionId : `# ${item.textContent}`,
        ),
      );
    await until("the list", async () => (await listed()).length >= params.grouped.length);
    assert.deepEqual(await listed(), params.grouped, "most recently active first, grouped by day");

    // No permanent form: a button, and a dialog it opens.
    assert.equal(await page.getByTestId("new-session-form").isVisible(), false, "no form in the sidebar");
    await assertOnScreen(page, page.getByTestId("new-chat"), "the New chat button");
    await page.getByTestId("new-chat").click();
    const dialog = page.getByTestId("new-chat-dialog");
    await dialog.waitFor({ state: "visible" });
    await until("the default model shown", async () =>
      (await page.getByTestId("new-model-default").textContent()).includes(params.default_model),
    );
    const offered = await page
      .getByTestId("new-model-choices")
      .locator("option")
      .evaluateAll((options) => options.map((option) => option.value));
    assert.deepEqual(offered, params.models, "the server's models are offered");
    assert.equal(await page.getByTestId("new-session-bot").isVisible(), false, "bot id under More options");
    await assertOnScreen(page, page.getByTestId("new-session-submit"), "Start chat");
    await assertFits(page, "the New chat dialog");
    await page.getByTestId("new-session-more").locator("summary").click();
    await page.getByTestId("new-session-bot").waitFor({ state: "visible" });
    await page.getByTestId("new-chat-cancel").click();
    await dialog.waitFor({ state: "hidden" });

    // A session whose model is gone: why, and a switch.
    await openDrawer(page);
    const stale = page.locator(`[data-testid=session-item][data-session-id="${params.stale}"]`);
    await stale.getByTestId("session-link").click();
    await waitForSession(page, params.stale);
    // Refused: the message stays in the box.
    await page.getByTestId("message-input").fill("Still there?");
    await page.getByTestId("message-input").press("Enter");
    const refusal = page.getByTestId("model-refusal");
    await refusal.waitFor({ state: "visible" });
    const why = await page.getByTestId("model-refusal-message").textContent();
    log("refusal:", why);
    assert.match(why, /PATCH|switch its model/i, "the refusal names the fix");
    await assertOnScreen(page, page.getByTestId("model-switch-submit"), "the Switch model button");
    await assertFits(page, "the model refusal");
    await until("the picker filled", async () => (await page.getByTestId("model-switch-picker").inputValue()) !== "");
    assert.equal(await page.getByTestId("model-switch-picker").inputValue(), params.default_model, "the default is chosen");
    await page.getByTestId("model-switch-submit").click();
    await refusal.waitFor({ state: "hidden" });
    assert.equal(await page.getByTestId("message-input").inputValue(), "Still there?", "the draft is kept");
    await page.getByTestId("message-input").fill("");
    await send(page, "Now?");
    await waitForAnswer(page, params.answer);

    // It is now the most recently active session: first under Today.
    await openDrawer(page);
    await page.getByTestId("refresh-sessions").click();
    await until("the switched session first", async () => (await listed())[1] === params.stale);
    assert.equal((await listed())[0], "# Today");
    return { session_id: params.stale };
  },
  { context },
);
