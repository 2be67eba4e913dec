// Makes the screenshots of docs/screenshots/ (PNG) from a real `keel serve`:
// a conversation with a code block on a wide screen, an approval card, the
// same conversation on a phone, and the event timeline open. Run by the
// ignored test `web_ui_screenshots` (tests/suite/web_chat.rs), which writes
// them into params.out.

import { join } from "node:path";

import { assert, createSession, scenario, send, until } from "./lib.mjs";

const DESKTOP = { viewport: { width: 1280, height: 800 }, colorScheme: "light" };
const PHONE = { viewport: { width: 390, height: 844 }, hasTouch: true, isMobile: true, colorScheme: "light" };

/** Settles the page (renders, fonts, layout) before a screenshot. */
async function settle(page) {
  await page.evaluate(async () => {
    document.querySelector("[data-testid=messages]").dispatchEvent(new Event("keel-render"));
    await document.fonts.ready;
    await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  });
}

scenario("screenshots", async ({ browser, base, params, log, newPage }) => {
  const files = [];
  const shoot = async (page, name) => {
    await settle(page);
    const path = join(params.out, `${name}.png`);
    await page.screenshot({ path });
    files.push(path);
    log("wrote", path);
  };

  const desktop = await newPage(await browser.newContext(DESKTOP));
  await desktop.goto(base);
  const sessionId = await createSession(desktop);
  await send(desktop, "Write me a health check for an HTTP service in Rust");
  await desktop.locator('[data-testid=assistant-message][data-state="final"]').waitFor();
  await desktop.locator('[data-testid=chat-title][data-untitled="false"]').waitFor();
  await desktop.locator('[data-testid=session-item] [data-testid=session-title].session-title').waitFor();
  await shoot(desktop, "desktop-conversation");

  await send(desktop, "Save it to health.rs");
  await desktop.getByTestId("approve").waitFor();
  await shoot(desktop, "approval");

  await desktop.getByTestId("events-toggle").click();
  await desktop.getByTestId("timeline").waitFor({ state: "visible" });
  await shoot(desktop, "timeline-open");
  await desktop.getByTestId("events-toggle").click();

  const phone = await newPage(await browser.newContext(PHONE));
  await phone.goto(`${base}/#/sessions/${encodeURIComponent(sessionId)}`);
  await phone.getByTestId("approve").waitFor();
  await until("the conversation", async () => (await phone.getByTestId("assistant-message").count()) >= 2);
  await shoot(phone, "phone-conversation");
  await phone.getByTestId("events-toggle").tap();
  await phone.getByTestId("timeline").waitFor({ state: "visible" });
  await shoot(phone, "phone-timeline-open");

  await desktop.getByTestId("approve").click();
  await desktop.locator('[data-testid=tool-card][data-state="done"]').waitFor();
  assert.ok(files.length >= 4);
  return { session_id: sessionId, files };
});
