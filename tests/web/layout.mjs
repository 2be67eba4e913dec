// The chat view's layout, on a wide screen and on a phone (params.phone):
// the page never scrolls as a whole, the message box stays pinned at the
// bottom of the screen however long the conversation, the header is one
// compact row (a small fraction of a phone's screen, no wrapped rows of
// buttons: the secondary actions are in a menu), and the event timeline is
// closed by default and, once opened, on screen (beside the conversation,
// or a sheet over it on a phone).

import { assert, createSession, scenario, send, until } from "./lib.mjs";

const params = JSON.parse(process.argv[3] ?? "{}");
const CONTEXT = params.phone
  ? { viewport: { width: 390, height: 844 }, hasTouch: true, isMobile: true }
  : { viewport: { width: 1280, height: 800 } };

/** A box of `locator`, checked to be wholly inside the viewport. */
async function assertInViewport(page, locator, what) {
  const { width, height } = page.viewportSize();
  const box = await locator.boundingBox();
  assert.ok(
    box && box.x >= -0.5 && box.y >= -0.5 && box.x + box.width <= width + 0.5 && box.y + box.height <= height + 0.5,
    `${what} is wholly on screen: ${JSON.stringify(box)} in ${width}×${height}`,
  );
  return box;
}

/** Whether the element at the middle of `locator` is inside it (nothing covers it). */
async function onTop(locator) {
  return locator.evaluate((element) => {
    const box = element.getBoundingClientRect();
    const hit = document.elementFromPoint(box.left + box.width / 2, box.top + Math.min(box.height / 2, 40));
    return element.contains(hit);
  });
}

async function assertPinned(page, what) {
  const { height } = page.viewportSize();
  const scroll = await page.evaluate(() => ({
    page: document.scrollingElement.scrollHeight,
    top: document.scrollingElement.scrollTop,
  }));
  assert.ok(scroll.page <= height + 1, `${what}: the page itself does not scroll (${scroll.page} > ${height})`);
  await assertInViewport(page, page.getByTestId("message-input"), `${what}: the message box`);
  await assertInViewport(page, page.getByTestId("send"), `${what}: the Send button`);
  assert.ok(await onTop(page.getByTestId("message-input")), `${what}: nothing covers the message box`);
}

scenario(
  "layout",
  async ({ page, base, log }) => {
    await page.goto(base);
    const sessionId = await createSession(page);
    const timeline = page.getByTestId("timeline");
    assert.equal(await timeline.isVisible(), false, "the timeline starts closed");
    await assertPinned(page, "a new session");

    for (const [index, question] of params.questions.entries()) {
      await send(page, question);
      await until(`answer ${index + 1}`, async () => {
        const answers = page.locator('[data-testid=assistant-message][data-state="final"]');
        return (await answers.count()) === index + 1;
      });
    }
    const pane = await page.getByTestId("conversation-scroll").evaluate((element) => ({
      height: element.scrollHeight,
      client: element.clientHeight,
    }));
    assert.ok(pane.height > pane.client, `the conversation is longer than the screen: ${JSON.stringify(pane)}`);
    await assertPinned(page, "a long conversation");
    assert.equal(await timeline.isVisible(), false, "the timeline is still closed");

    // The header: one row, its actions side by side, small on a phone.
    const { height } = page.viewportSize();
    const head = await page.getByTestId("chat-head").boundingBox();
    log("the header ends at", head.y + head.height, "of", height);
    if (params.phone) {
      assert.ok(
        head.y + head.height <= height * 0.15,
        `the headers take under 15% of the phone's screen: they end at ${head.y + head.height} of ${height}`,
      );
    }
    const rows = await page.getByTestId("chat-head").evaluate((element) =>
      Array.from(element.querySelectorAll(".chat-state > *"))
        .filter((child) => child.getClientRects().length > 0)
        .map((child) => Math.round(child.getBoundingClientRect().top + child.getBoundingClientRect().height / 2)),
    );
    assert.ok(
      Math.max(...rows) - Math.min(...rows) <= 4,
      `the header's controls are on one row: their middles at ${JSON.stringify(rows)}`,
    );
    for (const name of ["Rename this session", "Delete this session"]) {
      assert.equal(await page.getByRole("button", { name }).isVisible(), false, `${name} waits in the menu`);
    }
    await page.getByTestId("session-menu-button").click();
    await assertInViewport(page, page.getByRole("button", { name: "Delete this session" }), "the menu's Delete");
    await page.keyboard.press("Escape");
    await page.getByRole("button", { name: "Delete this session" }).waitFor({ state: "hidden" });

    // The timeline opens on screen, on top of nothing or over the conversation.
    await page.getByTestId("events-toggle").click();
    await timeline.waitFor({ state: "visible" });
    await assertInViewport(page, timeline, "the opened timeline");
    assert.ok(await onTop(timeline), "the opened timeline is not covered");
    await page.locator("[data-testid=timeline-event]").last().waitFor();
    if (!params.phone) {
      await assertPinned(page, "with the timeline open");
      const list = await page.getByTestId("messages").boundingBox();
      assert.ok(list.width >= 400, `the conversation keeps its room beside the timeline: ${JSON.stringify(list)}`);
    }
    await page.getByTestId("timeline-close").click();
    await timeline.waitFor({ state: "hidden" });
    await assertPinned(page, "after closing the timeline");
    return { session_id: sessionId };
  },
  { context: CONTEXT },
);
