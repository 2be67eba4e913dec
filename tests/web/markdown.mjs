// The model's answer is markdown, rendered safely: formatting and code
// blocks (with a copy button) appear, raw HTML from the model shows as
// text and never runs, links open in a new tab without an opener. Then the
// same page at phone width: nothing overflows sideways, the message box is
// on screen, and the events pane folds away.

import { assert, createSession, send, scenario } from "./lib.mjs";

scenario("markdown", async ({ page, base, log }) => {
  await page.goto(base);
  await createSession(page);
  await send(page, "Show me markdown.");
  const final = page.locator('[data-testid=assistant-message][data-state="final"]');
  await final.waitFor();
  const text = final.getByTestId("assistant-text");

  assert.equal(await text.locator("strong").textContent(), "bold", "**bold** is bold");
  assert.equal(await text.locator("p code").first().textContent(), "inline");
  assert.equal(await text.locator("pre code").textContent(), "fn main() {}\n", "the code block keeps its code");
  assert.equal(await text.getByTestId("copy-code").count(), 1, "the code block has a copy button");
  // The model's HTML is text: no element was made from it, nothing ran.
  assert.equal(await page.locator("[data-testid=messages] img").count(), 0, "no image from the model's HTML");
  assert.equal(await page.locator("[data-testid=messages] script").count(), 0, "no script from the model's HTML");
  assert.equal(await page.evaluate(() => window.__pwned), undefined, "the model's HTML did not run");
  assert.match(await text.textContent(), /<img src=x onerror=/, "the raw HTML shows as text");
  const link = text.locator("a");
  assert.equal(await link.getAttribute("href"), "https://example.com/docs");
  assert.equal(await link.getAttribute("target"), "_blank");
  assert.equal(await link.getAttribute("rel"), "noopener noreferrer");

  // Phone width.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForTimeout(100);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  log("horizontal overflow at 390 px:", overflow);
  assert.ok(overflow <= 0, `nothing overflows sideways at 390 px (by ${overflow} px)`);
  const box = await page.getByTestId("message-input").boundingBox();
  assert.ok(box && box.x >= 0 && box.x + box.width <= 390, `the message box fits the screen: ${JSON.stringify(box)}`);
  const toggle = page.getByTestId("events-toggle");
  await toggle.waitFor({ state: "visible" });
  const timeline = page.getByTestId("timeline");
  assert.equal(await timeline.isVisible(), false, "the events pane starts folded at phone width");
  await toggle.click();
  await timeline.waitFor({ state: "visible" });
  await toggle.click();
  await timeline.waitFor({ state: "hidden" });
  return {};
});
