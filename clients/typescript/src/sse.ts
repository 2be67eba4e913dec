// A parser of the `text/event-stream` format, as the HTML standard defines
// it (the "event stream interpretation"), fed decoded text in chunks of any
// size: a line or a CRLF may be split across chunks.

/** One dispatched server-sent event. */
export interface SseMessage {
  /** The `event:` field, or `"message"` when the event had none. */
  event: string;
  /** The `data:` lines, joined with `\n`. */
  data: string;
  /** The last event id seen in the stream so far (`id:`), or `""`. */
  id: string;
  /** The `retry:` the stream asked for last, in milliseconds, if any. */
  retry: number | undefined;
}

/** Turns text of an event stream into its events, chunk by chunk. */
export class SseParser {
  private buffer = "";
  private started = false;
  /** A chunk ended with `\r`: a `\n` that begins the next one belongs to it. */
  private afterCarriageReturn = false;
  private eventType = "";
  private dataLines: string[] = [];
  private hasData = false;
  private lastEventId = "";
  private retry: number | undefined;

  /** Feeds decoded text; returns the events it completes, in order. */
  push(text: string): SseMessage[] {
    let chunk = text;
    if (!this.started && chunk.length > 0) {
      this.started = true;
      if (chunk.startsWith("\uFEFF")) {
        chunk = chunk.slice(1);
      }
    }
    if (this.afterCarriageReturn && chunk.length > 0) {
      this.afterCarriageReturn = false;
      if (chunk.startsWith("\n")) {
        chunk = chunk.slice(1);
      }
    }
    this.buffer += chunk;
    const messages: SseMessage[] = [];
    const ends = /\r\n|\r|\n/g;
    let start = 0;
    for (let match = ends.exec(this.buffer); match !== null; match = ends.exec(this.buffer)) {
      const end = match.index + match[0].length;
      // A `\r` last in the buffer may be half of a CRLF split across chunks.
      if (match[0] === "\r" && end === this.buffer.length) {
        this.afterCarriageReturn = true;
      }
      const message = this.line(this.buffer.slice(start, match.index));
      if (message !== undefined) {
        messages.push(message);
      }
      start = end;
    }
    this.buffer = this.buffer.slice(start);
    return messages;
  }

  /** Ends the stream: an event not closed by a blank line is dropped, as the standard says. */
  finish(): void {
    this.buffer = "";
    this.afterCarriageReturn = false;
    this.resetEvent();
  }

  /** Interprets one line; a blank line dispatches the event gathered so far. */
  private line(line: string): SseMessage | undefined {
    if (line === "") {
      return this.dispatch();
    }
    if (line.startsWith(":")) {
      return undefined;
    }
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) {
      value = value.slice(1);
    }
    switch (field) {
      case "event":
        this.eventType = value;
        break;
      case "data":
        this.dataLines.push(value);
        this.hasData = true;
        break;
      case "id":
        if (!value.includes("\u0000")) {
          this.lastEventId = value;
        }
        break;
      case "retry":
        if (/^\d+$/.test(value)) {
          this.retry = Number(value);
        }
        break;
      default:
        // Unknown fields are ignored.
        break;
    }
    return undefined;
  }

  private dispatch(): SseMessage | undefined {
    if (!this.hasData) {
      this.resetEvent();
      return undefined;
    }
    const message: SseMessage = {
      event: this.eventType === "" ? "message" : this.eventType,
      data: this.dataLines.join("\n"),
      id: this.lastEventId,
      retry: this.retry,
    };
    this.resetEvent();
    return message;
  }

  private resetEvent(): void {
    this.eventType = "";
    this.dataLines = [];
    this.hasData = false;
  }
}
