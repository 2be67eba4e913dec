// The answer is rendered as markdown while it streams, not only once it is
// complete: bold text and a code block (with its copy button) appear while
// the answer is still marked as streaming, and the model's raw HTML stays
// text at every render.

import { assert, createSession, send, scenario, until } from "./lib.mjs";

scenario("streaming_markdown", async ({ page, base, params, log }) => {
  await page.goto(base);
  const sessionId = await createSession(page);
  await page.evaluate(() => {
    window.streamed = { bold: false, code: false, copy: false, html: false, renders: 0 };
    const messages = document.querySelector("[data-testid=messages]");
    new MutationObserver(() => {
      const bubble = messages.querySelector("[data-testid=assistant-message]");
      if (!bubble) {
        return;
      }
      const text = bubble.querySelector("[data-testid=assistant-text]");
      if (text.querySelector("b, img, script")) {
        window.streamed.html = true;
      }
      if (bubble.dataset.state === "streaming") {
        window.streamed.renders += 1;
        window.streamed.bold ||= text.querySelector("strong")?.textContent === "bold";
        window.streamed.code ||= Boolean(text.querySelector("pre code"));
        window.streamed.copy ||= Boolean(text.querySelector("[data-testid=copy-code]"));
      }
    }).observe(messages, { childList: true, subtree: true, characterData: true, attributes: true });
  });
  await send(page, "Stream some markdown");

  const bubble = page.getByTestId("assistant-message");
  await until("bold text while the answer streams", async () =>
    (await bubble.getAttribute("data-state")) === "streaming" && (await bubble.locator("strong").count()) === 1,
  );
  const final = page.locator('[data-testid=assistant-message][data-state="final"]');
  await final.waitFor({ timeout: 30000 });
  const seen = await page.evaluate(() => window.streamed);
  log("while streaming:", JSON.stringify(seen));
  assert.ok(seen.bold, "**bold** was bold before the answer was complete");
  assert.ok(seen.code, "the code block was a code block before the answer was complete");
  assert.ok(seen.copy, "the code block had its copy button while streaming");
  assert.equal(seen.html, false, "no render made an element from the model's HTML");
  const text = final.getByTestId("assistant-text");
  assert.equal(await text.locator("pre code").textContent(), params.code);
  assert.match(await text.textContent(), /<b>raw<\/b>/, "the raw HTML shows as text");
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  return { session_id: sessionId };
});
