// A client tool's call (a tool the session declared for its clients): the
// card shows the tool's name and arguments and a box for the result; "Send
// result" sends it and the card shows it once the call completes; "Send as
// error" sends an error. After a reload the answered cards show their
// results (projected from the log) and a call still waiting shows its box
// again, in a page opened after the call was asked, which answers it.
// With `read_only`, the page (signed in with `credential`, a key without
// the `submit` scope) shows the waiting call but no box to answer it.
//
// Params: `session_id` (a session declaring the client tool `pick_colour`);
// optionally `credential` and `read_only`.

import { assert, scenario, send, sessionPath, until, waitForSession } from "./lib.mjs";

scenario("client_tools", async ({ page, base, params, log, context, newPage }) => {
  const open = async (target) => {
    await target.goto(`${base}/#/sessions/${encodeURIComponent(params.session_id)}`);
    if (params.credential) {
      const dialog = target.getByTestId("token-dialog");
      await dialog.waitFor({ state: "visible" });
      await target.getByTestId("token-input").fill(params.credential);
      await target.getByTestId("token-submit").click();
      await dialog.waitFor({ state: "hidden" });
    }
    await waitForSession(target, params.session_id);
    await target.locator('[data-testid=stream-status][data-state="live"]').waitFor();
    await target.locator("body:not(.scopes-pending)").waitFor({ state: "attached" });
  };
  const cards = (target) => target.getByTestId("tool-card");
  const waitingCard = (target) => target.locator('[data-testid=tool-card][data-state="awaiting"]');
  const visible = async (locator) => (await locator.count()) > 0 && (await locator.first().isVisible());

  if (params.read_only) {
    await open(page);
    const card = waitingCard(page);
    await card.waitFor();
    assert.equal(await card.getByTestId("tool-name").textContent(), "pick_colour");
    assert.equal(await card.getByTestId("tool-status").textContent(), "waiting for the client");
    const shown = {
      form: await visible(card.getByTestId("client-tool-form")),
      send: await visible(card.getByTestId("client-tool-send")),
      cannot_answer: await visible(card.getByTestId("cannot-answer")),
    };
    log("shown", JSON.stringify(shown));
    return { session_id: params.session_id, shown };
  }

  await open(page);
  const turnStatus = page.getByTestId("turn-status");

  // Send result.
  await send(page, "Pick a colour");
  const first = waitingCard(page);
  await first.getByTestId("client-tool-input").waitFor();
  assert.equal(await first.getByTestId("tool-name").textContent(), "pick_colour");
  assert.deepEqual(JSON.parse(await first.getByTestId("tool-arguments").textContent()), { options: ["red", "blue"] });
  assert.equal(await first.getByTestId("tool-status").textContent(), "waiting for the client");
  assert.equal(await first.getByTestId("tool-result").isVisible(), false, "no result before the client sent one");
  assert.equal(await turnStatus.textContent(), "Waiting for a client tool's result");
  assert.equal(await first.getByTestId("approve").isVisible(), false, "no approval buttons on a client tool");
  await first.getByTestId("client-tool-input").fill("blue");
  // The POST's 202 is held until the call's completion has streamed in
  // (the order a loaded server gives): the card must stay done.
  const done = page.locator('[data-testid=tool-card][data-state="done"]');
  await page.route("**/submissions", async (route) => {
    const request = route.request();
    if (request.method() !== "POST" || !request.postData()?.includes("client_tool_result")) {
      return route.continue();
    }
    const response = await route.fetch();
    await done.first().waitFor();
    await route.fulfill({ response });
  });
  await first.getByTestId("client-tool-send").click();
  await page.locator("[data-testid=tool-card][data-result-sent]").waitFor({ state: "attached" });
  await page.unroute("**/submissions");
  assert.equal(await cards(page).first().getAttribute("data-state"), "done", "a 202 after the completion leaves the card done");
  assert.equal(await done.first().getByTestId("tool-result").textContent(), "blue");
  assert.equal(await done.first().getByTestId("client-tool-form").isVisible(), false, "the box goes once answered");
  await page.locator('[data-testid=assistant-message][data-state="final"]').filter({ hasText: "You picked blue." }).waitFor();
  log("result sent");

  // Send as error.
  await send(page, "Pick another");
  const second = waitingCard(page);
  await second.getByTestId("client-tool-input").fill("no colour today");
  await second.getByTestId("client-tool-send-error").click();
  const failed = page.locator('[data-testid=tool-card][data-state="error"]');
  await failed.waitFor();
  assert.equal(await failed.getByTestId("tool-result").textContent(), "no colour today");
  assert.match(await failed.getByTestId("tool-result").getAttribute("class"), /\berror\b/);
  assert.equal(await failed.getByTestId("tool-status").textContent(), "failed");
  await page.locator('[data-testid=assistant-message][data-state="final"]').filter({ hasText: "No colour, then." }).waitFor();
  await until("the turn to end", async () => (await turnStatus.textContent()) === "");
  log("error sent");

  // A call asked while no page is open, answered from a page opened later.
  await page.close();
  const asked = await fetch(`${base}${sessionPath(params.session_id)}/submissions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ op: { type: "user_input", text: "And a third" } }),
  });
  assert.equal(asked.status, 202, await asked.text());
  const later = await newPage(context);
  await open(later);
  const third = waitingCard(later);
  await third.getByTestId("client-tool-input").waitFor();
  assert.equal(await cards(later).count(), 3);
  const answered = later.locator('[data-testid=tool-card][data-state="done"]');
  assert.equal(await answered.getByTestId("tool-result").textContent(), "blue", "the earlier result, from the log");
  assert.equal(await later.locator('[data-testid=tool-card][data-state="error"]').getByTestId("tool-result").textContent(), "no colour today");
  assert.equal(await visible(answered.getByTestId("client-tool-form")), false, "no box on an answered call");
  await third.getByTestId("client-tool-input").fill("green");
  await third.getByTestId("client-tool-send").click();
  await later.locator('[data-testid=assistant-message][data-state="final"]').filter({ hasText: "Green it is." }).waitFor();

  // A reload projects the same from the log.
  await later.reload();
  await waitForSession(later, params.session_id);
  await later.locator('[data-testid=assistant-message][data-state="final"]').filter({ hasText: "Green it is." }).waitFor();
  const results = await cards(later).evaluateAll((items) =>
    items.map((item) => ({
      state: item.dataset.state,
      result: item.querySelector("[data-testid=tool-result]").textContent,
      form: Boolean(item.querySelector("[data-testid=client-tool-form]")?.checkVisibility()),
    })),
  );
  assert.deepEqual(results, [
    { state: "done", result: "blue", form: false },
    { state: "error", result: "no colour today", form: false },
    { state: "done", result: "green", form: false },
  ]);
  log("reloaded");
  return { session_id: params.session_id };
});
