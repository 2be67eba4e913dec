// Keyboard shortcuts: "/" goes to the message box (when not typing), "?"
// opens their list and Esc closes it; Esc closes the session menu and the
// event timeline; Esc interrupts a running turn; Ctrl+Shift+O starts a new
// chat. Shift+Enter and Enter are covered by create_and_stream.

import { assert, createSession, scenario, send, until } from "./lib.mjs";

/** The `data-testid` of the focused element. */
async function focused(page) {
  return page.evaluate(() => document.activeElement?.dataset?.testid ?? document.activeElement?.tagName);
}

async function blur(page) {
  await page.evaluate(() => document.activeElement?.blur());
}

scenario("shortcuts", async ({ page, base, log }) => {
  await page.goto(base);
  const sessionId = await createSession(page);
  const box = page.getByTestId("message-input");

  // "/" focuses the message box, and types nothing.
  await blur(page);
  await page.keyboard.press("/");
  assert.equal(await focused(page), "message-input", "/ goes to the message box");
  assert.equal(await box.inputValue(), "", "the / is not typed");
  // Typed in the box, "/" and "?" are text.
  await page.keyboard.type("a/b?");
  assert.equal(await box.inputValue(), "a/b?");
  assert.equal(await page.getByTestId("shortcuts-dialog").isVisible(), false);
  await box.fill("");

  // "?" lists the shortcuts; Esc closes the list.
  await blur(page);
  await page.keyboard.press("?");
  const help = page.getByTestId("shortcuts-dialog");
  await help.waitFor({ state: "visible" });
  assert.match(await help.textContent(), /Esc/);
  assert.match(await help.textContent(), /Shift/);
  await page.keyboard.press("Escape");
  await help.waitFor({ state: "hidden" });

  // Esc closes the menu, then the timeline.
  await page.getByTestId("session-menu-button").click();
  await page.getByRole("button", { name: "Delete this session" }).waitFor();
  await page.keyboard.press("Escape");
  await page.getByRole("button", { name: "Delete this session" }).waitFor({ state: "hidden" });
  await page.getByTestId("events-toggle").click();
  await page.getByTestId("timeline").waitFor({ state: "visible" });
  await page.keyboard.press("Escape");
  await page.getByTestId("timeline").waitFor({ state: "hidden" });

  // Esc in the message box interrupts the running turn.
  await send(page, "Talk slowly");
  await page.locator('[data-testid=assistant-message][data-state="streaming"]').waitFor();
  await page.getByTestId("interrupt").waitFor();
  await box.focus();
  await page.keyboard.press("Escape");
  await page.locator('[data-testid=note][data-kind="turn_aborted"][data-reason="interrupted"]').waitFor();
  await page.getByTestId("interrupt").waitFor({ state: "hidden" });
  log("interrupted with Esc");

  // Ctrl+Shift+O: a new chat, ready to be filled in.
  await box.focus();
  await page.keyboard.press("Control+Shift+O");
  await until("a new-chat control to take the focus", () =>
    page.evaluate(() => {
      const active = document.activeElement;
      return Boolean(active?.closest("[data-testid=new-session-form], dialog[open]"));
    }),
  );
  return { session_id: sessionId };
});
