// Tool calls that need approval: one approved (the file is written and the
// card shows the result), one denied (the card shows the refusal as an
// error), one approved with "Always" (and the next call of the same tool
// runs without asking).

import { assert, createSession, send, scenario, until } from "./lib.mjs";

scenario("approvals", async ({ page, base, log }) => {
  await page.goto(base);
  const sessionId = await createSession(page);
  const card = (file) => page.getByTestId("tool-card").filter({ hasText: file });
  const turnStatus = page.getByTestId("turn-status");

  // Approve.
  await send(page, "Write approved.txt");
  const approved = card("approved.txt");
  await approved.getByTestId("approve").waitFor();
  assert.equal(await approved.getByTestId("tool-name").textContent(), "write_file");
  assert.equal(await approved.getAttribute("data-state"), "awaiting");
  assert.equal(await approved.getByTestId("tool-status").textContent(), "waiting for approval");
  assert.equal(await approved.getByTestId("tool-result").isVisible(), false, "nothing ran before the approval");
  const args = JSON.parse(await approved.getByTestId("tool-arguments").textContent());
  assert.deepEqual(args, { path: "approved.txt", content: "approved from the browser" });
  assert.equal(await turnStatus.textContent(), "Waiting for your approval");
  assert.ok(await page.getByTestId("interrupt").isVisible(), "a turn waiting for approval can be interrupted");
  await approved.getByTestId("approve").click();
  await page.locator('[data-testid=tool-card][data-state="done"]').filter({ hasText: "approved.txt" }).waitFor();
  assert.match(await approved.getByTestId("tool-result").textContent(), /approved\.txt/);
  assert.equal(await approved.getByTestId("tool-result").getAttribute("class"), "result");
  assert.match(await approved.getByTestId("tool-decision").textContent(), /approved this call/);
  assert.equal(await approved.getByTestId("tool-status").textContent(), "done");
  assert.equal(await approved.getByTestId("approve").isVisible(), false, "the buttons go once decided");
  await page.locator('[data-testid=assistant-message][data-state="final"]').filter({ hasText: "Wrote approved.txt." }).waitFor();
  log("approved");

  // Deny.
  await send(page, "Write denied.txt");
  const denied = card("denied.txt");
  await denied.getByTestId("deny").click();
  await page.locator('[data-testid=tool-card][data-state="error"]').filter({ hasText: "denied.txt" }).waitFor();
  const refusal = denied.getByTestId("tool-result");
  assert.match(await refusal.textContent(), /denied by user/);
  assert.match(await refusal.getAttribute("class"), /\berror\b/, "a failed call is styled as an error");
  assert.match(await denied.getAttribute("class"), /\bfailed\b/);
  assert.match(await denied.getByTestId("tool-decision").textContent(), /denied this call/);
  assert.equal(await denied.getByTestId("tool-status").textContent(), "denied");
  await page.locator('[data-testid=assistant-message][data-state="final"]').filter({ hasText: "I did not write it." }).waitFor();
  log("denied");

  // Always: this call and the next write_file of the session.
  await send(page, "Write two files");
  const first = card("always-1.txt");
  await first.getByTestId("approve-always").click();
  await page.locator('[data-testid=assistant-message][data-state="final"]').filter({ hasText: "Both written." }).waitFor();
  assert.equal(await first.getAttribute("data-state"), "done");
  assert.match(await first.getByTestId("tool-decision").textContent(), /approved for the session/);
  const second = card("always-2.txt");
  assert.equal(await second.getAttribute("data-state"), "done");
  assert.equal(await second.getByTestId("tool-decision").isVisible(), false, "the second call was never asked about");
  assert.match(await second.getByTestId("tool-result").textContent(), /always-2\.txt/);
  await until("the turn to end", async () => (await turnStatus.textContent()) === "");
  assert.equal(await page.getByTestId("tool-card").count(), 4);
  return { session_id: sessionId };
});
