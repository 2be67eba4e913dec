// A session created from the form; a two-line message sent with Enter
// (Shift+Enter for the line break); the answer streams in (its text grows
// over several renders) and is then replaced by the final message.

import { assert, createSession, send, scenario, until } from "./lib.mjs";

scenario("create_and_stream", async ({ page, base, params, log }) => {
  await page.goto(base);
  await page.getByTestId("session-list-status").filter({ hasText: "No sessions yet." }).waitFor();

  const sessionId = await createSession(page, { bot: params.bot, instructions: "Answer briefly." });
  log("created", sessionId);
  const listed = page.getByTestId("session-item").first();
  assert.equal(await listed.getAttribute("data-session-id"), sessionId, "the new session heads the list");
  assert.equal(await listed.getByTestId("session-link").getAttribute("aria-current"), "page");
  assert.match(await page.getByTestId("chat-meta").textContent(), new RegExp(`bot ${params.bot}`));

  // Record every text the streamed answer shows, as the page renders it.
  await page.evaluate(() => {
    window.seenTexts = [];
    const messages = document.querySelector("[data-testid=messages]");
    new MutationObserver(() => {
      const bubble = messages.querySelector("[data-testid=assistant-message]");
      if (bubble) {
        const text = bubble.querySelector("[data-testid=assistant-text]").textContent;
        const last = window.seenTexts.at(-1);
        if (!last || last.text !== text || last.state !== bubble.dataset.state) {
          window.seenTexts.push({ text, state: bubble.dataset.state, at: performance.now() });
        }
      }
    }).observe(messages, { childList: true, subtree: true, characterData: true, attributes: true });
  });

  const box = page.getByTestId("message-input");
  await box.fill("line one");
  await box.press("Shift+Enter");
  await box.pressSequentially("line two");
  assert.equal(await box.inputValue(), "line one\nline two", "Shift+Enter starts a new line");
  await box.press("Enter");
  await until("the message box to be cleared", async () => (await box.inputValue()) === "");

  const user = page.getByTestId("user-message");
  await user.waitFor();
  assert.equal(await user.getByTestId("message-text").textContent(), "line one\nline two");

  await page.getByTestId("interrupt").waitFor({ state: "visible" });
  const final = page.locator('[data-testid=assistant-message][data-state="final"]');
  await final.waitFor();
  assert.equal(await final.getByTestId("assistant-text").textContent(), params.full_text);
  await page.getByTestId("interrupt").waitFor({ state: "hidden" });
  assert.equal(await page.getByTestId("assistant-message").count(), 1);

  const seen = await page.evaluate(() => window.seenTexts);
  const streaming = seen.filter((entry) => entry.state === "streaming" && entry.text.length > 0);
  log(`rendered ${streaming.length} growing texts, then ${seen.at(-1)?.state}`);
  assert.ok(streaming.length >= 3, `the text grew over several renders: ${JSON.stringify(seen)}`);
  for (let index = 1; index < streaming.length; index += 1) {
    const [before, after] = [streaming[index - 1], streaming[index]];
    assert.ok(after.text.length > before.text.length && after.text.startsWith(before.text), "each render extends the text");
  }
  assert.ok(streaming.at(-1).at - streaming[0].at > 200, "the text grew over time, not all at once");
  assert.ok(streaming[0].text.length < params.full_text.length, "the first render showed part of the answer");
  assert.equal(seen.at(-1).state, "final");
  assert.equal(seen.at(-1).text, params.full_text);

  // The list entry catches up with the finished turn.
  await page
    .locator(`[data-testid=session-item][data-session-id="${sessionId}"]`)
    .filter({ hasText: "1 turn" })
    .waitFor();
  await page.locator(`[data-testid=session-state][data-state="idle"]`).first().waitFor();

  return { session_id: sessionId, renders: streaming.length };
});
