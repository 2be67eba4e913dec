// Backoff for retried requests and reconnected streams: exponential with
// full jitter, bounded, and never shorter than a server's `Retry-After`.

/** How often and how patiently a request is retried. */
export interface RetryPolicy {
  /** Attempts in all, the first included (default 6). */
  maxAttempts: number;
  /** The delay before the first retry, in milliseconds (default 200). */
  baseDelayMs: number;
  /** The longest delay between two attempts, in milliseconds (default 5000). */
  maxDelayMs: number;
}

/** The policy of submissions and reads unless the client is given another. */
export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 6, baseDelayMs: 200, maxDelayMs: 5000 };

/** The policy of a stream's reconnects: consecutive failed connects allowed (a connect that delivers events resets the count). */
export const DEFAULT_RECONNECT: RetryPolicy = { maxAttempts: 30, baseDelayMs: 100, maxDelayMs: 3000 };

/**
 * The delay before retry number `retry` (1 for the first retry): a random
 * point below `baseDelayMs · 2^(retry-1)`, capped at `maxDelayMs`, but at
 * least `retryAfterMs` when the server asked for that (a server's wait is
 * honoured even above the cap, up to a minute).
 */
export function backoffDelay(retry: number, policy: RetryPolicy, retryAfterMs?: number, random = Math.random): number {
  const ceiling = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** Math.max(0, retry - 1));
  // Half fixed, half random: retries spread out but never come at once.
  const jittered = ceiling / 2 + random() * (ceiling / 2);
  if (retryAfterMs === undefined) {
    return Math.round(jittered);
  }
  return Math.round(Math.max(jittered, Math.min(retryAfterMs, 60_000)));
}

/**
 * A `Retry-After` header's value in milliseconds: seconds (`"3"`) or an
 * HTTP date; `undefined` when absent or unreadable.
 */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null || value.trim() === "") {
    return undefined;
  }
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) {
    return Number(trimmed) * 1000;
  }
  const date = Date.parse(trimmed);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}

/** Waits `ms` milliseconds, or until `signal` aborts (then rejects with its reason). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
