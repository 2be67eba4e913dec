// Compaction and errors, each shown once. Compact before there is anything
// to compact: the refusal's reason shows once. After two exchanges Compact
// leaves a marker where it happened (why, tokens before and after, the
// summary folded). A model failure shows one note, not an error and an
// abort saying the same, and its message gets a Retry button (there is no
// answer to regenerate); retried, the failed turn is hidden like any
// regenerated one. A reload shows the same, once each.

import { assert, createSession, exchange, menuAction, scenario, send, until, waitForAnswer } from "./lib.mjs";

async function checkOnce(page, params, when, { retried }) {
  const rejected = page.locator('[data-testid=note][data-kind="submission_rejected"]');
  await until(`${when}: the refusal`, async () => (await rejected.count()) >= 1);
  assert.equal(await rejected.count(), 1, `${when}: the refusal shows once`);
  assert.equal(await rejected.textContent(), `Not compacted: ${params.rejection}`);
  const marker = page.getByTestId("compaction");
  await marker.waitFor();
  assert.equal(await marker.count(), 1, `${when}: one compaction marker`);
  assert.equal(await marker.getAttribute("data-reason"), "requested");
  assert.match(await marker.getByTestId("compaction-head").textContent(), /Context compacted \(asked for\): \d+ → \d+ tokens/);
  const summary = marker.getByTestId("compaction-summary");
  assert.equal(await summary.isVisible(), false, `${when}: the summary starts folded`);
  await marker.locator("summary").click();
  await summary.waitFor({ state: "visible" });
  assert.equal(await summary.textContent(), params.summary);
  await marker.locator("summary").click();
  await summary.waitFor({ state: "hidden" });
  const failures = page.locator("[data-testid=note]", { hasText: params.model_error });
  await until(`${when}: the model's failure`, async () => (await failures.count()) >= 1);
  assert.equal(await failures.count(), 1, `${when}: the model's failure is in the page once`);
  assert.equal(await failures.isVisible(), !retried, `${when}: the failure shows until it is retried`);
  const retry = page.getByRole("button", { name: "Regenerate the answer to this message" });
  if (retried) {
    await waitForAnswer(page, params.retried_answer);
    assert.equal(await retry.count(), 0, `${when}: no Retry once retried`);
    assert.equal(await page.getByRole("button", { name: "Regenerate this answer" }).count(), 1);
  } else {
    assert.equal(await retry.count(), 1, `${when}: the failed message has Retry`);
    assert.equal(await page.getByRole("button", { name: "Regenerate this answer" }).count(), 0);
  }
  // The page's own notice is not used for what the log says.
  assert.equal(await page.getByTestId("notice").textContent(), "");
}

scenario("compact", async ({ page, base, params, log }) => {
  await page.goto(base);
  const sessionId = await createSession(page);
  const compact = () => menuAction(page, /Compact the context/);
  await (await compact()).click();
  await page.locator('[data-testid=note][data-kind="submission_rejected"]').waitFor();

  await exchange(page, ["hello", "again"], params.answers);
  await (await compact()).click();
  await page.getByTestId("compaction").waitFor();
  await send(page, "and now?");
  await page.locator('[data-testid=note][data-kind="error"]').waitFor();
  await page.getByTestId("interrupt").waitFor({ state: "hidden" });
  await checkOnce(page, params, "live", { retried: false });
  log("compacted live");

  await page.getByRole("button", { name: "Regenerate the answer to this message" }).click();
  await waitForAnswer(page, params.retried_answer);
  await checkOnce(page, params, "retried", { retried: true });

  await page.reload();
  await checkOnce(page, params, "after a reload", { retried: true });
  return { session_id: sessionId };
});
