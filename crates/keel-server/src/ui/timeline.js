// The event timeline: the session's log as recorded, one line an event
// (its sequence, kind and a summary), each opening to its JSON. Closed by
// default; it keeps its newest line in view unless the reader scrolled it
// up, measured once a frame rather than once an event (a long log replays
// thousands of events at once).

import { h } from "./dom.js";

/** A line of at most `length` characters, its whitespace collapsed. */
export function shorten(text, length = 80) {
  const line = String(text).replace(/\s+/g, " ").trim();
  return line.length > length ? `${line.slice(0, length - 1)}…` : line;
}

/** How far a running call got, from its `tool_call_progress` event. */
export function progressLabel(msg) {
  const done = msg.total ? `${msg.progress}/${msg.total}` : `${msg.progress}`;
  return msg.message ? `running ${done}: ${shorten(msg.message, 40)}` : `running ${done}`;
}

/** ", by NAME (TENANT)" for a recorded principal, "" for none. */
function byWhom(actor) {
  if (!actor) {
    return "";
  }
  if (actor.kind === "operator") {
    return ", by the operator";
  }
  return `, by ${actor.name ?? actor.principal_id} (${actor.tenant})`;
}

/** A one-line summary of an event for the timeline. */
export function summary(event) {
  const msg = event.msg ?? {};
  switch (msg.type) {
    case "session_started":
      return msg.resumed ? `resumed, ${msg.history_items} history items` : `bot ${msg.bot_id}`;
    case "user_message":
    case "assistant_message":
      return shorten(msg.text);
    case "assistant_content_delta":
    case "reasoning_delta":
      // Quoted as it is: the spaces at either end matter here.
      return JSON.stringify(msg.delta.length > 60 ? `${msg.delta.slice(0, 59)}…` : msg.delta);
    case "model_step_started":
      return `step ${msg.step}`;
    case "approval_requested":
    case "tool_call_started":
      return `${msg.name} ${shorten(msg.arguments, 60)}`;
    case "approval_decided":
      return `${msg.decision} ${msg.call_id}${byWhom(msg.decided_by)}`;
    case "tool_call_completed":
      return `${msg.is_error ? "error: " : ""}${shorten(msg.output, 60)}`;
    case "tool_call_progress":
      return progressLabel(msg);
    case "tools_changed":
      return [...(msg.added ?? []).map((name) => `+${name}`), ...(msg.removed ?? []).map((name) => `-${name}`)].join(" ");
    case "token_usage":
      return `${msg.usage?.input_tokens ?? 0} in, ${msg.usage?.output_tokens ?? 0} out`;
    case "turn_aborted":
      return `${msg.reason}: ${msg.message}`;
    case "warning":
    case "error":
      return shorten(msg.message);
    case "submission_rejected":
      return shorten(msg.reason);
    case "submission_queued":
      return `${msg.op?.type ?? "op"}, on busy: ${msg.on_busy}${byWhom(msg.submitted_by)}`;
    case "session_forked":
      return `from ${msg.parent_session_id} at ${msg.at_sequence}`;
    case "context_compacted":
      return `${msg.reason}, ${msg.tokens_before} → ${msg.tokens_after} tokens`;
    case "turn_rolled_back":
      return `undid ${msg.rolled_back_turn_id}`;
    default:
      return "";
  }
}

/** One event's line, cloned for each event (cheaper than building it). */
function rowTemplate() {
  return h(
    "li",
    { "data-testid": "timeline-event" },
    h(
      "details",
      {},
      h(
        "summary",
        {},
        h("span", { class: "seq", "data-testid": "timeline-sequence" }),
        h("span", { class: "kind" }),
        h("span", { class: "summary" }),
      ),
    ),
  );
}

/**
 * The timeline's list: `add(event)` appends one event's line; an opened
 * line shows the event's JSON, made when first opened.
 */
export class Timeline {
  constructor(list) {
    this.list = list;
    this.following = true;
    this.frame = null;
    this.template = rowTemplate();
    this.events = new Map();
    list.addEventListener(
      "scroll",
      () => {
        this.following = list.scrollHeight - list.scrollTop - list.clientHeight < 48;
      },
      { passive: true },
    );
    // `toggle` does not bubble: heard on the way down.
    list.addEventListener(
      "toggle",
      (event) => {
        const details = event.target;
        if (!(details instanceof HTMLDetailsElement) || !details.open || details.querySelector("pre")) {
          return;
        }
        const sequence = Number(details.parentElement?.dataset.sequence);
        details.append(h("pre", { class: "raw", text: JSON.stringify(this.events.get(sequence), null, 2) }));
      },
      true,
    );
  }

  reset() {
    this.list.replaceChildren();
    this.events.clear();
    this.following = true;
  }

  add(event) {
    const kind = event.msg?.type ?? "unknown";
    this.events.set(event.sequence, event);
    const row = this.template.cloneNode(true);
    row.setAttribute("data-sequence", String(event.sequence));
    row.setAttribute("data-kind", kind);
    const sequence = row.firstChild.firstChild.firstChild;
    sequence.textContent = String(event.sequence);
    sequence.nextSibling.textContent = kind;
    sequence.nextSibling.nextSibling.textContent = summary(event);
    this.list.append(row);
    // Kept at its newest line, but measured only while shown, once a frame.
    if (this.following && this.frame === null && !this.list.closest("[hidden]")) {
      this.frame = requestAnimationFrame(() => {
        this.frame = null;
        if (this.following) {
          this.list.scrollTop = this.list.scrollHeight;
        }
      });
    }
  }

  /** Shows the newest line (when the timeline opens). */
  showEnd() {
    this.following = true;
    this.list.scrollTop = this.list.scrollHeight;
  }
}
