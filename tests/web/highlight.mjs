// Code blocks are highlighted (a ```rust block gets highlight.js's token
// spans), from their text only: markup inside a code block stays text,
// whatever language it claims, and nothing from it runs.

import { assert, createSession, scenario, send } from "./lib.mjs";

scenario("highlight", async ({ page, base, log }) => {
  await page.goto(base);
  await createSession(page);
  await send(page, "Show me code.");
  const final = page.locator('[data-testid=assistant-message][data-state="final"]');
  await final.waitFor();
  const blocks = final.locator("pre code");
  assert.equal(await blocks.count(), 3, "three code blocks");

  const rust = blocks.nth(0);
  assert.match(await rust.getAttribute("class"), /\bhljs\b/, "the rust block is highlighted");
  const keywords = await rust.locator("span.hljs-keyword").allTextContents();
  log("rust keywords:", keywords);
  assert.ok(keywords.includes("fn") && keywords.includes("let"), `fn and let are keyword tokens: ${keywords}`);
  assert.ok((await rust.locator("span.hljs-string").count()) >= 1, "the string is a token");
  assert.match(await rust.textContent(), /<\/code><\/pre><img src=x onerror=/, "the markup in the string is text");

  const html = blocks.nth(1);
  assert.ok((await html.locator("span[class^=hljs-]").count()) > 0, "the html block is highlighted");
  assert.match(await html.textContent(), /<script>window.__pwned = 2<\/script>/, "its tags are text");
  assert.equal(await blocks.nth(2).locator("span").count(), 0, "a block without a language stays plain");

  // Nothing but class-only spans inside the code blocks; nothing ran.
  const foreign = await final.evaluate((answer) =>
    Array.from(answer.querySelectorAll("pre code *"))
      .filter((node) => node.tagName !== "SPAN" || [...node.attributes].some((attribute) => attribute.name !== "class"))
      .map((node) => node.outerHTML),
  );
  assert.deepEqual(foreign, [], "only class-only spans in code blocks");
  assert.equal(await page.locator("[data-testid=messages] img, [data-testid=messages] script, [data-testid=messages] b").count(), 0);
  assert.equal(await page.evaluate(() => window.__pwned), undefined, "nothing from the code blocks ran");
  return {};
});
