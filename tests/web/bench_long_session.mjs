// A measurement, not a check: how long the page takes to open a session of
// 2,000 messages (1,000 exchanges) and to stream an answer into it, in
// headless Chromium. Run by the ignored test `web_ui_bench_long_session`
// (tests/suite/web_chat.rs), which makes the session; it prints the figures
// of each run and their medians.
//
// With KEEL_WEB_UI_DIR set (see lib.mjs), the page's files come from that
// directory: the same server and session measure another version of the
// UI. Only the test ids both versions share are used.

import { assert, scenario, until } from "./lib.mjs";

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

scenario(
  "bench_long_session",
  async ({ browser, base, params, log, newPage }) => {
    const runs = [];
    for (let run = 0; run < params.runs; run += 1) {
      const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
      const page = await newPage(context);
      const answers = page.locator('[data-testid=assistant-message][data-state="final"]');
      const expected = params.answers + run;

      // Open: from navigation until every answer is shown and the newest is in view.
      const started = Date.now();
      await page.goto(`${base}/#/sessions/${encodeURIComponent(params.session_id)}`);
      await until("every answer to be shown", async () => (await answers.count()) >= expected, {
        timeout: 1500000,
        every: 50,
      });
      const openMs = Date.now() - started;
      const lastInView = await page.evaluate(() => {
        const items = document.querySelectorAll("[data-testid=assistant-message]");
        const last = items[items.length - 1].getBoundingClientRect();
        return last.top < window.innerHeight && last.bottom > 0;
      });

      // Stream: from Enter until the answer is final, with the long tasks meanwhile.
      await page.evaluate(() => {
        window.__longTasks = [];
        new PerformanceObserver((list) => {
          for (const entry of list.getEntries()) {
            window.__longTasks.push(entry.duration);
          }
        }).observe({ type: "longtask", buffered: false });
      });
      const box = page.getByTestId("message-input");
      await box.fill(`Stream ${run + 1}`);
      const sent = Date.now();
      await box.press("Enter");
      await until("the streamed answer", async () => (await answers.count()) >= expected + 1, { timeout: 60000, every: 20 });
      const streamMs = Date.now() - sent;
      const longTasks = await page.evaluate(() => window.__longTasks);
      const text = await answers.last().getByTestId("assistant-text").textContent();
      assert.equal(text.trim(), params.streamed.trim(), "the streamed answer is shown whole");
      const figures = {
        open_ms: openMs,
        newest_in_view: lastInView,
        stream_ms: streamMs,
        stream_overhead_ms: streamMs - params.nominal_stream_ms,
        long_tasks_while_streaming: longTasks.length,
        longest_task_ms: Math.round(Math.max(0, ...longTasks)),
        dom_items: await page.getByTestId("messages").evaluate((list) => list.children.length),
      };
      log(`run ${run + 1}:`, JSON.stringify(figures));
      runs.push(figures);
      await context.close();
    }
    const medians = {};
    for (const key of ["open_ms", "stream_ms", "stream_overhead_ms", "long_tasks_while_streaming", "longest_task_ms"]) {
      medians[key] = median(runs.map((figures) => figures[key]));
    }
    log("medians:", JSON.stringify(medians));
    return { runs, medians, ui: process.env.KEEL_WEB_UI_DIR ?? "built-in" };
  },
  { timeoutMs: 1790000 },
);
