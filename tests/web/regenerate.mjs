// Regenerate: the last answer's button undoes the turn and answers the same
// message again. The page shows the conversation as the model now sees it:
// the old answer (and the message it answered) hidden, the message once,
// the new answer after it; and a reload rebuilds the same picture from the
// log.

import { assert, conversation, createSession, send, scenario, until, waitForAnswer } from "./lib.mjs";

/** The picture after the regeneration, live or replayed. */
async function checkRegenerated(page, params, when) {
  await waitForAnswer(page, params.second);
  const shown = await conversation(page);
  assert.deepEqual(shown.users, [params.question], `${when}: the message shows once`);
  assert.deepEqual(
    shown.answers.map((answer) => answer.text),
    [params.second],
    `${when}: only the new answer shows`,
  );
  assert.deepEqual(shown.replacedAnswers, [params.first], `${when}: the old answer is hidden, marked as replaced`);
  const note = page.locator('[data-testid=note][data-kind="turn_rolled_back"]');
  assert.equal(await note.count(), 1, `${when}: one note says the answer was regenerated`);
  assert.equal(await note.isVisible(), true);
  // The old answer's own button is gone; the new one has it.
  const buttons = page.getByRole("button", { name: "Regenerate this answer" });
  await until(`${when}: one Regenerate button`, async () => (await buttons.count()) === 1 || null);
  const visible = page.locator('[data-testid=assistant-message]:not([data-replaced]) [data-testid=regenerate]');
  await visible.waitFor({ state: "visible" });
}

scenario("regenerate", async ({ page, base, params, log }) => {
  await page.goto(base);
  const sessionId = await createSession(page);
  await send(page, params.question);
  await waitForAnswer(page, params.first);
  const regenerate = page.getByRole("button", { name: "Regenerate this answer" });
  await regenerate.waitFor({ state: "visible" });
  // No Regenerate button while a turn runs; it is on the last answer only.
  assert.equal(await page.locator("[data-testid=regenerate]:visible").count(), 1);

  await regenerate.click();
  await checkRegenerated(page, params, "live");
  log("regenerated live");

  await page.reload();
  await checkRegenerated(page, params, "after a reload");
  assert.equal(await page.locator("[data-testid=assistant-message]").count(), 2, "both answers are in the log");
  return { session_id: sessionId };
});
