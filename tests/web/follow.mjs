// The conversation follows new content unless the reader scrolled up.
//
// A tall markdown answer streams in and ends with a tool call that needs
// approval: the Approve button must be inside the visible pane (it was
// below the fold when the page decided per event, before the markdown
// render). Then, while a second long answer streams, the reader scrolls up
// with the wheel: the position stays where the reader left it, a "Jump to
// latest" control appears, and clicking it goes to the bottom and follows
// the rest of the answer. Run at the viewport given in the params (a wide
// screen and a phone).

import { assert, createSession, scenario, send, until, waitForAnswer } from "./lib.mjs";

const params = JSON.parse(process.argv[3] ?? "{}");
const CONTEXT = params.phone
  ? { viewport: { width: 390, height: 844 }, hasTouch: true, isMobile: true }
  : { viewport: { width: 1280, height: 800 } };

/** Waits until the last answer is final. */
async function waitForFinal(page) {
  await until("the last answer to be final", async () =>
    (await page.getByTestId("assistant-message").last().getAttribute("data-state")) === "final");
}

/** The conversation's scrolling pane (the list itself, in versions without one). */
function paneOf(page) {
  return page.locator("[data-testid=conversation-scroll], [data-testid=messages]:not([data-testid=conversation-scroll] *)");
}

/** Where `locator` is, against the conversation pane's visible box. */
async function placement(page, locator) {
  return locator.evaluate((element) => {
    const scroller =
      document.querySelector("[data-testid=conversation-scroll]") ?? document.querySelector("[data-testid=messages]");
    const pane = scroller.getBoundingClientRect();
    const box = element.getBoundingClientRect();
    return { top: box.top, bottom: box.bottom, paneTop: pane.top, paneBottom: pane.bottom };
  });
}

/** The pane's scroll position and its distance from the bottom. */
async function scrollState(page) {
  return paneOf(page).evaluate((pane) => ({
    top: pane.scrollTop,
    distance: pane.scrollHeight - pane.scrollTop - pane.clientHeight,
    height: pane.scrollHeight,
    client: pane.clientHeight,
  }));
}

function assertInPane(where, what) {
  assert.ok(
    where.top >= where.paneTop - 1 && where.bottom <= where.paneBottom + 1,
    `${what} is inside the visible pane: ${JSON.stringify(where)}`,
  );
}

scenario(
  "follow",
  async ({ page, base, params, log }) => {
    await page.goto(base);
    const sessionId = await createSession(page);
    const pane = paneOf(page);
    const jump = page.getByTestId("jump-latest");

    // 1. A tall answer, then an approval request: the Approve button shows.
    await send(page, "Write the report");
    const approve = page.getByTestId("approve");
    await approve.waitFor();
    // Two frames: the deferred markdown render, then the layout after it.
    await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done))));
    const state = await scrollState(page);
    log("after the approval request:", JSON.stringify(state));
    assert.ok(state.height > state.client * 1.5, `the answer is taller than the pane: ${JSON.stringify(state)}`);
    assertInPane(await placement(page, approve), "the Approve button");
    assert.ok(state.distance <= 2, `the pane is at its bottom: ${JSON.stringify(state)}`);
    assert.equal(await jump.isVisible(), false, "no jump control while following");
    await approve.click();
    await waitForAnswer(page, params.after_tool);
    await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done))));
    assertInPane(
      await placement(page, page.getByTestId("assistant-message").last()),
      "the answer after the tool call",
    );

    // 2. Scrolled up while an answer streams: the position stays.
    await send(page, "And the long version");
    const streaming = page.locator('[data-testid=assistant-message][data-state="streaming"]');
    await streaming.waitFor();
    await until("the streamed answer to grow past the pane", async () => {
      const { height, client } = await scrollState(page);
      return height > client * 2.5;
    });
    const box = await pane.boundingBox();
    await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
    await page.mouse.wheel(0, -600);
    await until("the wheel to scroll the pane up", async () => (await scrollState(page)).distance > 300);
    await jump.waitFor({ state: "visible" });
    const left = await scrollState(page);
    await page.waitForTimeout(1200);
    const later = await scrollState(page);
    log("scrolled up:", JSON.stringify(left), "then", JSON.stringify(later));
    assert.ok(later.height > left.height, "the answer kept growing meanwhile");
    assert.ok(Math.abs(later.top - left.top) <= 2, `the position stayed: ${left.top} → ${later.top}`);
    assert.equal(await streaming.count(), 1, "the answer is still streaming");
    assert.ok(await jump.isVisible(), "the jump control shows");

    // 3. Jump to latest: at the bottom, and following again.
    await jump.click();
    await jump.waitFor({ state: "hidden" });
    assert.ok((await scrollState(page)).distance <= 2, "the jump goes to the bottom");
    await waitForFinal(page);
    await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done))));
    const end = await scrollState(page);
    assert.ok(end.distance <= 2, `the pane followed the rest of the answer: ${JSON.stringify(end)}`);
    assert.ok(end.height > later.height, "the answer grew after the jump");
    log("followed to the end:", JSON.stringify(end));
    return { session_id: sessionId };
  },
  { context: CONTEXT },
);
