// Helpers over a session's log for the tests.

import type { Keel, RecordedEvent } from "@keel/client";

/** Every event of the session's log, read page by page from the store (not the stream). */
export async function wholeLog(keel: Keel, sessionId: string): Promise<RecordedEvent[]> {
  const events: RecordedEvent[] = [];
  for (;;) {
    const page = await keel.events(sessionId, { after: events.length, limit: 1000 });
    events.push(...page.events);
    if (!page.has_more) {
      return events;
    }
  }
}

/** Resolves once `check` is true, polling every 20 ms; rejects after `timeoutMs`. */
export async function until(check: () => boolean, what: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await new Promise((done) => setTimeout(done, 20));
  }
}

/** The sequences of `events`, to compare logs by. */
export function sequences(events: RecordedEvent[]): number[] {
  return events.map((event) => event.sequence);
}
