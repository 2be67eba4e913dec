// What a message sent while a turn runs will get, shown beside the busy
// policy: a `merge` session answers waiting messages together, an `each`
// session one by one; interrupt and steer say what they do.

import { assert, scenario, until, waitForSession } from "./lib.mjs";

scenario("queue_hint", async ({ page, base, params }) => {
  const hint = page.getByTestId("queue-hint");
  const open = async (id, mode) => {
    await page.goto(`${base}/#/sessions/${encodeURIComponent(id)}`);
    await waitForSession(page, id);
    await until(`the ${mode} session's hint`, async () => (await hint.getAttribute("data-queue-mode")) === mode);
  };

  await open(params.merge, "merge");
  assert.match(await hint.textContent(), /answered together/);
  await open(params.each, "each");
  assert.match(await hint.textContent(), /its own answer/);

  await page.getByTestId("busy-policy").selectOption("steer");
  assert.match(await hint.textContent(), /joins the running turn/);
  await page.getByTestId("busy-policy").selectOption("interrupt");
  assert.match(await hint.textContent(), /stops the running answer/);
  return {};
});
