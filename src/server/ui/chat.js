// The chat view of one session, built from its events: user messages,
// streamed assistant text, tool-call cards with approval buttons, notes for
// turns that ended early, and a timeline of the raw events.
//
// `apply(event)` must see each event once, in sequence order (the feed
// makes sure of that). Text is always set with textContent, never parsed
// as HTML, but for the model's finished answers, rendered as sanitized
// markdown by markdown.js (the streaming text stays plain until then).

import { renderMarkdown } from "./markdown.js";

/** An element with attributes and children (strings become text). */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) {
      continue;
    }
    if (name === "class") {
      element.className = value;
    } else if (name === "text") {
      element.textContent = value;
    } else if (name.startsWith("on")) {
      element.addEventListener(name.slice(2), value);
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) {
      element.append(child);
    }
  }
  return element;
}

/** Arguments as the model wrote them, indented when they are JSON. */
function prettyArguments(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

function shorten(text, length = 80) {
  const line = String(text).replace(/\s+/g, " ").trim();
  return line.length > length ? `${line.slice(0, length - 1)}…` : line;
}

/** How far a running call got, from its `tool_call_progress` event. */
function progressLabel(msg) {
  const done = msg.total ? `${msg.progress}/${msg.total}` : `${msg.progress}`;
  return msg.message ? `running ${done}: ${shorten(msg.message, 40)}` : `running ${done}`;
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
      return `${msg.decision} ${msg.call_id}`;
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
      return `${msg.op?.type ?? "op"}, on busy: ${msg.on_busy}`;
    default:
      return "";
  }
}

const DECISION_LABELS = {
  approve: "approved",
  approve_for_session: "approved for the session",
  deny: "denied",
};

export class ChatView {
  /**
   * `messages` and `timeline` are the lists to fill. `onApproval(callId,
   * decision)` sends a decision and resolves when the server took it;
   * `onTurn(turnId | null, state)` hears when a turn starts, waits for an
   * approval or ends; `onUsage(total)` hears the session's token totals.
   */
  constructor({ messages, timeline, onApproval, onTurn = () => {}, onUsage = () => {} }) {
    this.messages = messages;
    this.timeline = timeline;
    this.onApproval = onApproval;
    this.onTurn = onTurn;
    this.onUsage = onUsage;
    this.reset();
  }

  /** Forgets everything shown. */
  reset() {
    this.messages.replaceChildren();
    this.timeline.replaceChildren();
    this.turns = new Map();
    this.cards = new Map();
    this.queued = new Map();
    this.running = null;
    this.waiting = new Set();
    this.count = 0;
  }

  turn(turnId) {
    let turn = this.turns.get(turnId);
    if (!turn) {
      turn = { bubble: null, reasoning: null };
      this.turns.set(turnId, turn);
    }
    return turn;
  }

  /** Renders one event. */
  apply(event) {
    const stick = this.nearBottom();
    this.addToTimeline(event);
    const msg = event.msg ?? {};
    switch (msg.type) {
      case "session_started":
        if (msg.resumed) {
          this.note("session_started", "The session was reopened.");
        }
        break;
      case "submission_queued":
        if (msg.op?.type === "user_input" && this.running) {
          this.showQueued(event.submission_id, msg.op.text, msg.on_busy);
        }
        break;
      case "turn_started":
        this.running = msg.turn_id;
        this.waiting.clear();
        this.turn(msg.turn_id);
        this.onTurn(msg.turn_id, "running");
        break;
      case "user_message":
        this.dropQueued(event.submission_id);
        this.messages.append(
          h(
            "li",
            { class: "message user", "data-testid": "user-message", "data-sequence": event.sequence },
            h("div", { class: "who", text: "You" }),
            h("div", { class: "text", "data-testid": "message-text", text: msg.text }),
          ),
        );
        break;
      case "model_step_started": {
        const turn = this.turn(msg.turn_id);
        turn.bubble = null;
        turn.reasoning = null;
        break;
      }
      case "reasoning_delta": {
        const turn = this.turn(msg.turn_id);
        if (!turn.reasoning) {
          const text = h("div", { class: "text" });
          turn.reasoning = text;
          this.messages.append(
            h(
              "li",
              { class: "message reasoning", "data-testid": "reasoning" },
              h("details", {}, h("summary", { text: "Reasoning" }), text),
            ),
          );
        }
        turn.reasoning.append(msg.delta);
        break;
      }
      case "assistant_content_delta": {
        const bubble = this.bubble(msg.turn_id);
        bubble.text.append(msg.delta);
        break;
      }
      case "assistant_message": {
        const turn = this.turn(msg.turn_id);
        if (turn.bubble || msg.text) {
          const bubble = this.bubble(msg.turn_id);
          // The whole message replaces what was streamed, as markdown.
          renderMarkdown(bubble.text, msg.text);
          this.settle(bubble, "final");
        }
        turn.bubble = null;
        break;
      }
      case "approval_requested": {
        const card = this.card(msg.call_id, msg.name, msg.arguments);
        this.setCardState(card, "awaiting", "waiting for approval");
        card.actions.hidden = false;
        this.waiting.add(msg.call_id);
        this.onTurn(msg.turn_id, "awaiting_approval");
        break;
      }
      case "approval_decided": {
        const card = this.cards.get(msg.call_id);
        if (card) {
          this.closeActions(card);
          card.decision.textContent = `You ${DECISION_LABELS[msg.decision] ?? msg.decision} this call.`;
          card.decision.hidden = false;
          this.setCardState(card, msg.decision === "deny" ? "denied" : "approved", DECISION_LABELS[msg.decision]);
        }
        this.waiting.delete(msg.call_id);
        if (this.waiting.size === 0 && this.running) {
          this.onTurn(this.running, "running");
        }
        break;
      }
      case "tool_call_started": {
        const card = this.card(msg.call_id, msg.name, msg.arguments);
        if (card.root.dataset.state !== "denied") {
          this.setCardState(card, "running", "running");
        }
        break;
      }
      case "tool_call_completed": {
        const card = this.card(msg.call_id, "tool", "");
        this.closeActions(card);
        card.result.textContent = msg.output;
        card.result.classList.toggle("error", Boolean(msg.is_error));
        card.resultBox.hidden = false;
        card.root.classList.toggle("failed", Boolean(msg.is_error));
        const denied = card.root.dataset.state === "denied";
        this.setCardState(card, msg.is_error ? "error" : "done", denied ? "denied" : msg.is_error ? "failed" : "done");
        break;
      }
      case "tool_call_progress": {
        const card = this.cards.get(msg.call_id);
        if (card && card.root.dataset.state === "running") {
          this.setCardState(card, "running", progressLabel(msg));
        }
        break;
      }
      case "tools_changed":
        this.note("tools_changed", `The tools changed: ${summary(event)}.`);
        break;
      case "token_usage":
        this.onUsage(msg.session_total);
        break;
      case "turn_complete":
        this.endTurn(msg.turn_id);
        break;
      case "turn_aborted": {
        const turn = this.turn(msg.turn_id);
        if (turn.bubble) {
          this.settle(turn.bubble, "interrupted");
          turn.bubble = null;
        }
        let text = `The turn ended early (${msg.reason}): ${msg.message}`;
        if (msg.reason === "interrupted") {
          text = /^interrupted\b/i.test(msg.message ?? "")
            ? `I${msg.message.slice(1)}.`
            : `Interrupted: ${msg.message}`;
        }
        this.note("turn_aborted", text, { "data-reason": msg.reason });
        this.endTurn(msg.turn_id);
        break;
      }
      case "warning":
        this.note("warning", `Warning: ${msg.message}`);
        break;
      case "error":
        this.note("error", `Error: ${msg.message}`);
        break;
      case "submission_rejected":
        this.dropQueued(event.submission_id);
        this.note("submission_rejected", `A submission was rejected: ${msg.reason}`);
        break;
      case "shutdown_complete":
        this.note("shutdown_complete", "The session was shut down.");
        break;
      default:
        break;
    }
    if (stick) {
      this.scrollToEnd();
    }
  }

  endTurn(turnId) {
    for (const card of this.cards.values()) {
      if (card.turnId === turnId) {
        this.closeActions(card);
      }
    }
    this.waiting.clear();
    if (this.running === turnId) {
      this.running = null;
    }
    this.onTurn(null, "idle");
  }

  /** The assistant bubble being streamed in a turn, made on first use. */
  bubble(turnId) {
    const turn = this.turn(turnId);
    if (!turn.bubble) {
      const text = h("div", { class: "text", "data-testid": "assistant-text" });
      const label = h("span", { class: "label", "data-testid": "assistant-label" });
      const root = h(
        "li",
        {
          class: "message assistant",
          "data-testid": "assistant-message",
          "data-turn-id": turnId,
          "data-state": "streaming",
          "aria-busy": "true",
        },
        h("div", { class: "who" }, "Assistant ", label),
        text,
      );
      label.textContent = "(writing…)";
      this.messages.append(root);
      turn.bubble = { root, text, label };
    }
    return turn.bubble;
  }

  settle(bubble, state) {
    bubble.root.dataset.state = state;
    bubble.root.removeAttribute("aria-busy");
    bubble.label.textContent = state === "interrupted" ? "(interrupted)" : "";
  }

  /** The card of a tool call, made on first use. */
  card(callId, name, argumentsText) {
    let card = this.cards.get(callId);
    if (card) {
      return card;
    }
    const nameElement = h("span", { class: "tool-name", "data-testid": "tool-name", text: name });
    const status = h("span", { class: "badge", "data-testid": "tool-status" });
    const args = h("pre", { class: "arguments", "data-testid": "tool-arguments", text: prettyArguments(argumentsText) });
    const result = h("pre", { class: "result", "data-testid": "tool-result" });
    const resultBox = h("div", { class: "result-box", hidden: true }, h("div", { class: "caption", text: "Result" }), result);
    const decision = h("p", { class: "decision", "data-testid": "tool-decision", hidden: true });
    const error = h("p", { class: "inline-error", role: "alert", "data-testid": "tool-error", hidden: true });
    const buttons = [
      ["approve", "Approve", "approve"],
      ["approve_for_session", "Always", "approve-always"],
      ["deny", "Deny", "deny"],
    ].map(([decisionName, label, testId]) =>
      h("button", {
        type: "button",
        class: decisionName === "deny" ? "danger" : decisionName === "approve" ? "primary" : "",
        "data-testid": testId,
        "data-decision": decisionName,
        title:
          decisionName === "approve_for_session"
            ? `Approve this call and every later ${name} call in this session`
            : undefined,
        text: label,
        onclick: () => this.decide(card, decisionName),
      }),
    );
    const actions = h(
      "div",
      { class: "actions", role: "group", "aria-label": `Approve or deny the ${name} call`, hidden: true },
      buttons,
    );
    const root = h(
      "li",
      { class: "tool-card", "data-testid": "tool-card", "data-call-id": callId },
      h("div", { class: "tool-head" }, h("span", { class: "caption", text: "Tool call" }), nameElement, status),
      args,
      actions,
      decision,
      error,
      resultBox,
    );
    card = { root, status, result, resultBox, actions, buttons, decision, error, turnId: this.running };
    this.cards.set(callId, card);
    this.messages.append(root);
    return card;
  }

  setCardState(card, state, label) {
    card.root.dataset.state = state;
    card.status.textContent = label ?? state;
  }

  closeActions(card) {
    card.actions.hidden = true;
    for (const button of card.buttons) {
      button.disabled = true;
    }
  }

  async decide(card, decision) {
    const callId = card.root.dataset.callId;
    for (const button of card.buttons) {
      button.disabled = true;
    }
    card.error.hidden = true;
    try {
      await this.onApproval(callId, decision);
    } catch (error) {
      card.error.textContent = `Could not send the decision: ${error.message}`;
      card.error.hidden = false;
      if (card.root.dataset.state === "awaiting") {
        for (const button of card.buttons) {
          button.disabled = false;
        }
      }
    }
  }

  showQueued(submissionId, text, onBusy) {
    if (!submissionId || this.queued.has(submissionId)) {
      return;
    }
    const element = h(
      "li",
      { class: "message user queued", "data-testid": "queued-message" },
      h("div", { class: "who", text: `You (${onBusy === "steer" ? "steering" : "queued"})` }),
      h("div", { class: "text", text }),
    );
    this.queued.set(submissionId, element);
    this.messages.append(element);
  }

  dropQueued(submissionId) {
    const element = this.queued.get(submissionId);
    if (element) {
      element.remove();
      this.queued.delete(submissionId);
    }
  }

  note(kind, text, attributes = {}) {
    this.messages.append(h("li", { class: `note ${kind}`, "data-testid": "note", "data-kind": kind, ...attributes, text }));
  }

  addToTimeline(event) {
    const list = this.timeline;
    const follow = list.scrollHeight - list.scrollTop - list.clientHeight < 48;
    this.count += 1;
    const kind = event.msg?.type ?? "unknown";
    const pre = h("pre", { class: "raw" });
    const details = h(
      "details",
      {
        ontoggle: () => {
          if (details.open && !pre.textContent) {
            pre.textContent = JSON.stringify(event, null, 2);
          }
        },
      },
      h(
        "summary",
        {},
        h("span", { class: "seq", "data-testid": "timeline-sequence", text: String(event.sequence) }),
        h("span", { class: "kind", text: kind }),
        h("span", { class: "summary", text: summary(event) }),
      ),
      pre,
    );
    this.timeline.append(
      h("li", { "data-testid": "timeline-event", "data-sequence": event.sequence, "data-kind": kind }, details),
    );
    if (follow) {
      list.scrollTop = list.scrollHeight;
    }
  }

  nearBottom() {
    const scroller = this.messages;
    return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 48;
  }

  scrollToEnd() {
    this.messages.scrollTop = this.messages.scrollHeight;
  }
}
