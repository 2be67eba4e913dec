// The session list: newest first, a page at a time (`?limit=2` in the
// page's URL sets the page size), and a listed session opens on click.

import { assert, scenario, sessionIdOf, until, waitForSession } from "./lib.mjs";

scenario("session_list", async ({ page, base, params }) => {
  const listed = () => page.getByTestId("session-item").evaluateAll((items) => items.map((item) => item.dataset.sessionId));
  await page.goto(`${base}/?limit=2`);
  await until("the first page", async () => (await listed()).length === 2);
  assert.deepEqual(await listed(), params.newest_first.slice(0, 2));

  const more = page.getByTestId("more-sessions");
  await more.click();
  await until("the second page", async () => (await listed()).length === 4);
  assert.deepEqual(await listed(), params.newest_first.slice(0, 4));
  await more.click();
  await until("the last page", async () => (await listed()).length === 5);
  assert.deepEqual(await listed(), params.newest_first);
  await more.waitFor({ state: "hidden" });

  const item = page.locator(`[data-testid=session-item][data-session-id="${params.open}"]`);
  await item.getByTestId("session-link").click();
  await waitForSession(page, params.open);
  assert.equal(sessionIdOf(page), params.open);
  assert.equal(await item.getByTestId("session-link").getAttribute("aria-current"), "page");
  // Its log so far: session_started, listed in the timeline.
  await page.locator('[data-testid=timeline-event][data-kind="session_started"]').waitFor({ state: "attached" });

  // Refresh starts over from the first page.
  await page.getByTestId("refresh-sessions").click();
  await until("the first page again", async () => (await listed()).length === 2);
  assert.equal(await more.isVisible(), true);
  return {};
});
