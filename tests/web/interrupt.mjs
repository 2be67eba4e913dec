// A slow turn stopped with the Interrupt button; a second slow turn stopped
// by a message sent with the busy policy "interrupt", which then runs.

import { assert, createSession, send, scenario, until } from "./lib.mjs";

scenario("interrupt", async ({ page, base, params, log }) => {
  await page.goto(base);
  const sessionId = await createSession(page);
  const bubbles = page.getByTestId("assistant-message");
  const aborted = page.locator('[data-testid=note][data-kind="turn_aborted"][data-reason="interrupted"]');
  const button = page.getByTestId("interrupt");

  await send(page, "Tell me a long story");
  await until("the story to start streaming", async () => ((await bubbles.first().textContent()) ?? "").includes("word2"));
  await button.waitFor({ state: "visible" });
  const inColumn = await page.evaluate(() => {
    const own = document.getElementById("interrupt").getBoundingClientRect();
    const column = document.querySelector(".conversation").getBoundingClientRect();
    return own.left >= column.left && own.right <= column.right;
  });
  assert.ok(inColumn, "the Interrupt button stays inside the conversation column");
  await button.click();
  await aborted.first().waitFor();
  await button.waitFor({ state: "hidden" });
  assert.equal(await bubbles.first().getAttribute("data-state"), "interrupted");
  const interruptedText = await bubbles.first().getByTestId("assistant-text").textContent();
  log("interrupted after", JSON.stringify(interruptedText.slice(-20)));
  assert.ok(!interruptedText.includes("word200"), "the turn was cut short");
  assert.match(await aborted.first().textContent(), /Interrupted/);
  assert.equal(await page.getByTestId("turn-status").textContent(), "");

  // The next slow turn; then a message that interrupts it.
  await send(page, "Another one");
  await until("the second story to stream", async () => (await bubbles.count()) === 2 && (await bubbles.nth(1).textContent()).includes("word2"));
  await send(page, "Stop, just answer", { policy: "interrupt" });
  await until("the second turn to be interrupted", async () => (await aborted.count()) === 2);
  const final = page.locator('[data-testid=assistant-message][data-state="final"]');
  await final.waitFor();
  assert.equal(await final.getByTestId("assistant-text").textContent(), params.final_text);
  assert.equal(await bubbles.nth(1).getAttribute("data-state"), "interrupted");
  const users = await page.getByTestId("user-message").allTextContents();
  assert.equal(users.length, 3);
  assert.ok(users[2].includes("Stop, just answer"));
  assert.equal(await page.getByTestId("queued-message").count(), 0, "no message is left shown as queued");
  await button.waitFor({ state: "hidden" });

  // The page's text is what it was when the button stopped the turn.
  assert.equal(await bubbles.first().getByTestId("assistant-text").textContent(), interruptedText);
  return { session_id: sessionId, interrupted_text: interruptedText };
});
