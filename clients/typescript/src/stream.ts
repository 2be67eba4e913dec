// A session's event stream as an async iterator that resumes by itself:
// across a dropped connection, a server that shut down or was killed and
// came back, it reconnects with `Last-Event-ID` set to the last sequence it
// delivered, so the caller sees every event once, in order.

import { KeelConnectionError, KeelError } from "./errors.js";
import { DEFAULT_RECONNECT, type RetryPolicy, backoffDelay, sleep } from "./retry.js";
import { SseParser } from "./sse.js";
import { type Transport, segment } from "./transport.js";
import type { RecordedEvent } from "./types.js";

/** How a stream starts, ends and reconnects. */
export interface StreamOptions {
  /** Deliver the events after this sequence (default 0: the whole log). */
  after?: number | undefined;
  /** Ends the iteration (without an error) when it aborts. */
  signal?: AbortSignal | undefined;
  /** Reconnects: consecutive failed connects allowed and their backoff; see `RetryPolicy`. */
  reconnect?: Partial<RetryPolicy> | undefined;
  /**
   * Reconnect when nothing, not even the server's keep-alive (every 15 s),
   * arrived for this long, in milliseconds (default 45000): a server that
   * hangs is left like one that died.
   */
  idleTimeoutMs?: number | undefined;
}

/**
 * The events of one session, from `after` on, live; iterate it with
 * `for await`. It never ends by itself while the server can be reached
 * (the log has no end); `break`, or abort the signal, to stop. It throws
 * the API's error when the server refuses the stream (an unknown session,
 * a resume point past the log), and `KeelConnectionError` once the server
 * stayed unreachable through `reconnect.maxAttempts` connects.
 */
export class EventStream implements AsyncIterable<RecordedEvent> {
  private last: number;
  private readonly reconnect: RetryPolicy;
  private readonly idleTimeoutMs: number;

  constructor(
    private readonly transport: Transport,
    private readonly sessionId: string,
    private readonly options: StreamOptions = {},
  ) {
    this.last = options.after ?? 0;
    this.reconnect = { ...DEFAULT_RECONNECT, ...options.reconnect };
    this.idleTimeoutMs = options.idleTimeoutMs ?? 45_000;
  }

  /** The sequence of the last event delivered (or `after`, before the first). */
  get lastSequence(): number {
    return this.last;
  }

  [Symbol.asyncIterator](): AsyncIterator<RecordedEvent> {
    return this.events();
  }

  private async *events(): AsyncGenerator<RecordedEvent, void, undefined> {
    const outer = this.options.signal;
    let failures = 0;
    while (!isAborted(outer)) {
      const connection = new AbortController();
      const stop = () => connection.abort(outer?.reason);
      outer?.addEventListener("abort", stop, { once: true });
      let retryAfterMs: number | undefined;
      try {
        const delivered = yield* this.connection(connection);
        failures = delivered ? 1 : failures + 1;
      } catch (error) {
        if (isAborted(outer)) {
          return;
        }
        const retryable =
          error instanceof KeelConnectionError || (error instanceof KeelError && error.status === 503);
        if (!retryable) {
          throw error;
        }
        failures += 1;
        if (failures >= this.reconnect.maxAttempts) {
          throw error;
        }
        retryAfterMs = error instanceof KeelError ? error.retryAfterMs : undefined;
      } finally {
        outer?.removeEventListener("abort", stop);
        connection.abort();
      }
      try {
        await sleep(backoffDelay(failures, this.reconnect, retryAfterMs), outer);
      } catch {
        return;
      }
    }
  }

  /**
   * One connection: yields its new events and returns whether it delivered
   * any, when it ends, goes idle or skips a sequence (then it reconnects
   * from the last one delivered, and the server sends the rest). Throws
   * what connecting threw, and `KeelConnectionError` when the body failed.
   */
  private async *connection(connection: AbortController): AsyncGenerator<RecordedEvent, boolean, undefined> {
    const response = await this.transport.once({
      method: "GET",
      path: `/v1/sessions/${segment(this.sessionId)}/events/stream`,
      headers: { Accept: "text/event-stream", "Last-Event-ID": String(this.last) },
      signal: connection.signal,
    });
    const body = response.body;
    if (body === null) {
      return false;
    }
    const reader = body.getReader();
    const decoder = new TextDecoder();
    const parser = new SseParser();
    let idle = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const watch = () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        idle = true;
        connection.abort();
      }, this.idleTimeoutMs);
    };
    let delivered = false;
    watch();
    try {
      for (;;) {
        let chunk: ReadableStreamReadResult<Uint8Array>;
        try {
          chunk = await reader.read();
        } catch (error) {
          if (idle || connection.signal.aborted) {
            return delivered;
          }
          throw new KeelConnectionError(`the event stream was cut: ${String(error)}`, { cause: error });
        }
        if (chunk.done) {
          return delivered;
        }
        watch();
        for (const message of parser.push(decoder.decode(chunk.value, { stream: true }))) {
          const event = JSON.parse(message.data) as RecordedEvent;
          if (event.sequence <= this.last) {
            continue;
          }
          if (event.sequence !== this.last + 1) {
            return delivered;
          }
          this.last = event.sequence;
          delivered = true;
          yield event;
        }
      }
    } finally {
      clearTimeout(timer);
      parser.finish();
      connection.abort();
      reader.releaseLock();
    }
  }
}

/** Whether `signal` has aborted (a call, so that the compiler does not narrow it across awaits). */
function isAborted(signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true;
}
