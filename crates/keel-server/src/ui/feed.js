// A session's events, each delivered exactly once and in sequence order:
// the log so far from its pages, then the rest from an EventSource on
// /v1/sessions/{id}/events/stream.
//
// The feed remembers the last sequence it delivered. Anything at or below it
// is ignored (a reconnect that overlaps), anything past the next one is held
// back while the missing ones are fetched from the paged log (so an event
// kind this page does not listen for still shows up in order). The
// browser's automatic reconnect resumes with Last-Event-ID; when the stream
// is closed for good (a 401, the server gone for a while) the feed opens a
// new one after its last sequence.

import { api, ApiError, sessionPath, streamUrl } from "./api.js";

/** The event kinds the server names in its SSE `event:` field. */
export const EVENT_KINDS = [
  "session_started",
  "session_forked",
  "turn_started",
  "user_message",
  "model_step_started",
  "assistant_content_delta",
  "reasoning_delta",
  "assistant_message",
  "approval_requested",
  "approval_decided",
  "client_tool_requested",
  "tool_call_started",
  "tool_call_completed",
  "tool_call_progress",
  "tools_changed",
  "token_usage",
  "turn_complete",
  "turn_aborted",
  "warning",
  "error",
  "submission_rejected",
  "submission_queued",
  "shutdown_complete",
  "context_compacted",
  "turn_rolled_back",
  "instructions_loaded",
];

const PAGE = 1000;
const MAX_RETRY_MS = 10000;

export class EventFeed {
  /**
   * `onEvent(event)` gets every event once, in order; `onStatus(status)`
   * hears "connecting", "live", "reconnecting", "closed"; `onError(error)`
   * hears what went wrong.
   */
  constructor(sessionId, { after = 0, onEvent, onStatus = () => {}, onError = () => {} }) {
    this.sessionId = sessionId;
    this.last = after;
    this.held = new Map();
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.onError = onError;
    this.source = null;
    this.stopped = false;
    this.filling = false;
    this.retryMs = 500;
    this.retryTimer = null;
    this.caughtUp = false;
    this.handle = (message) => this.message(message);
  }

  /**
   * Reads the log so far page by page (a long session's thousands of events
   * arrive in a few responses instead of one stream message each), then
   * opens the stream after the last delivered sequence.
   */
  async start() {
    if (this.stopped) {
      return;
    }
    this.onStatus("connecting");
    if (!this.caughtUp) {
      this.caughtUp = true;
      try {
        await this.catchUp();
      } catch {
        // The stream and its recovery say what is wrong.
      }
      if (this.stopped) {
        return;
      }
    }
    this.open();
  }

  async catchUp() {
    for (;;) {
      const page = await api(`${sessionPath(this.sessionId)}/events?after=${this.last}&limit=${PAGE}`);
      if (this.stopped) {
        return;
      }
      for (const event of page.events) {
        this.receive(event);
      }
      if (!page.has_more || page.events.length === 0) {
        return;
      }
    }
  }

  /** Opens the stream after the last delivered sequence. */
  open() {
    if (this.stopped) {
      return;
    }
    this.closeSource();
    this.onStatus("connecting");
    const source = new EventSource(streamUrl(this.sessionId, this.last));
    this.source = source;
    for (const kind of EVENT_KINDS) {
      source.addEventListener(kind, this.handle);
    }
    source.addEventListener("message", this.handle);
    source.addEventListener("open", () => {
      if (source === this.source) {
        this.retryMs = 500;
        this.onStatus("live");
      }
    });
  }

  /** Stops for good: no more events, no reconnects. */
  stop() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    this.closeSource();
    this.held.clear();
  }

  closeSource() {
    if (this.source) {
      for (const kind of EVENT_KINDS) {
        this.source.removeEventListener(kind, this.handle);
      }
      this.source.removeEventListener("message", this.handle);
      this.source.close();
      this.source = null;
    }
  }

  message(message) {
    if (this.stopped || message.target !== this.source) {
      return;
    }
    // `error` is both an event kind of the log and the EventSource's own
    // signal that the connection failed; only the former carries data.
    if (typeof message.data !== "string") {
      this.connectionFailed();
      return;
    }
    let event;
    try {
      event = JSON.parse(message.data);
    } catch {
      this.onError(new Error("the server sent an event that is not JSON"));
      return;
    }
    this.receive(event);
  }

  connectionFailed() {
    const source = this.source;
    if (source && source.readyState === EventSource.CONNECTING) {
      // The browser reconnects by itself, resuming with Last-Event-ID.
      this.onStatus("reconnecting");
      return;
    }
    // Closed for good: the server refused the stream (a token, a session
    // that is gone) or answered something else than an event stream.
    this.closeSource();
    this.onStatus("reconnecting");
    this.recover();
  }

  async recover() {
    try {
      // Asks for a token if that is what is wrong, and tells a missing
      // session from a server that is away.
      await api(sessionPath(this.sessionId));
    } catch (error) {
      if (this.stopped) {
        return;
      }
      if (error instanceof ApiError && error.status === 404) {
        this.onStatus("closed");
        this.onError(error);
        return;
      }
    }
    if (this.stopped) {
      return;
    }
    clearTimeout(this.retryTimer);
    this.retryTimer = setTimeout(() => this.open(), this.retryMs);
    this.retryMs = Math.min(this.retryMs * 2, MAX_RETRY_MS);
  }

  /** Takes one event from any source (stream or page). */
  receive(event) {
    const sequence = event?.sequence;
    if (!Number.isSafeInteger(sequence) || sequence <= this.last) {
      return;
    }
    if (sequence === this.last + 1) {
      this.deliver(event);
      this.drain();
    } else {
      this.held.set(sequence, event);
      this.backfill();
    }
  }

  deliver(event) {
    this.last = event.sequence;
    try {
      this.onEvent(event);
    } catch (error) {
      this.onError(error);
    }
  }

  drain() {
    while (!this.stopped && this.held.has(this.last + 1)) {
      const next = this.held.get(this.last + 1);
      this.held.delete(this.last + 1);
      this.deliver(next);
    }
    for (const sequence of this.held.keys()) {
      if (sequence <= this.last) {
        this.held.delete(sequence);
      }
    }
  }

  /** Fetches the events missing before the held ones from the log. */
  async backfill() {
    if (this.filling) {
      return;
    }
    this.filling = true;
    try {
      while (!this.stopped && this.held.size > 0) {
        const before = this.last;
        const page = await api(`${sessionPath(this.sessionId)}/events?after=${before}&limit=${PAGE}`);
        if (this.stopped) {
          return;
        }
        for (const event of page.events) {
          if (event.sequence === this.last + 1) {
            this.deliver(event);
          }
        }
        this.drain();
        if (this.last === before) {
          // The log has nothing new yet: the held events wait for the stream.
          break;
        }
      }
    } catch (error) {
      this.onError(error);
    } finally {
      this.filling = false;
    }
  }
}
