// The chat view of one session, built from its events: user messages,
// streamed assistant text, tool-call cards with approval buttons, notes for
// turns that ended early, and a timeline of the raw events.
//
// `apply(event)` must see each event once, in sequence order (the feed
// makes sure of that). Text is always set with textContent, never parsed
// as HTML, but for the model's answers, rendered as sanitized markdown by
// markdown.js: while they stream, at most once per animation frame.
//
// The view shows the conversation as the model now sees it: a turn undone
// by `turn_rolled_back` (a regenerated answer) is hidden, whether the
// events arrive live or are replayed from the log. User messages carry
// Edit and Fork buttons, the last answer a Regenerate button; the page
// (app.js) does what they ask through the `actions` it passes in. A message
// sent, or an approval decided, by someone other than the viewer names them
// (`submitted_by`, `decided_by`); buttons marked `data-needs` are hidden
// when the viewer lacks that scope (principal.js).

import { h } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { progressLabel, summary, Timeline } from "./timeline.js";
import { attachClientTool } from "./client_tool.js";
import { closeActions, setCardState, showDecision, toolCard } from "./tool_card.js";

export { h };

const COMPACTION_REASONS = {
  threshold: "the context was getting full",
  requested: "asked for",
  context_length_exceeded: "the model's context was exceeded",
};

/** How a refusal is introduced, by the type of the op refused. */
const REJECTED = {
  compact: "Not compacted",
  regenerate: "Not regenerated",
  user_input: "A message was refused",
  steer: "A message was refused",
  other: "A submission was rejected",
};

/** A small button of a message's action bar (each one submits). */
function actionButton(label, ariaLabel, testId, onclick) {
  return h("button", {
    type: "button",
    class: "action",
    "aria-label": ariaLabel,
    "data-testid": testId,
    "data-needs": "submit",
    text: label,
    onclick,
  });
}

export class ChatView {
  /**
   * `messages` and `timeline` are the lists to fill. `onApproval(callId,
   * decision)` sends a decision and resolves when the server took it, as
   * `onClientToolResult(callId, output, isError)` does a client tool's
   * result; `onTurn(turnId | null, state)` hears when a turn starts, waits
   * for an approval or a client tool's result, or ends; `onUsage(total)` hears the session's token totals;
   * `onUserMessage()` hears each user message; `onLifecycle(kind, event,
   * detail)` hears the runtime's own events (started, resumed, shut down,
   * tools changed), which are status, not conversation; `onForked(msg,
   * parts)` hears a fork's first event, with the divider's parts to fill
   * in. `actions` does what the
   * message buttons ask, each resolving once the server took it:
   * `edit(turnId, text)`, `fork(atSequence)`, `regenerate()`.
   * `author(actor)` names who sent a message or decided an approval, or
   * answers null when it was the viewer ("You").
   */
  constructor({
    messages,
    timeline,
    onApproval,
    onClientToolResult = async () => {},
    onTurn = () => {},
    onUsage = () => {},
    onUserMessage = () => {},
    onLifecycle = () => {},
    onForked = () => {},
    actions = {},
    author = () => null,
  }) {
    this.messages = messages;
    this.timeline = new Timeline(timeline);
    this.onApproval = onApproval;
    this.onClientToolResult = onClientToolResult;
    this.onTurn = onTurn;
    this.onUsage = onUsage;
    this.onUserMessage = onUserMessage;
    this.onLifecycle = onLifecycle;
    this.onForked = onForked;
    this.actions = actions;
    this.author = author;
    // Streamed answers waiting for their next markdown render.
    this.pending = new Set();
    this.frame = null;
    // Renders what streamed so far at once (a consistent picture for tests).
    messages.addEventListener("keel-render", () => this.flush());
    this.reset();
  }

  /** Forgets everything shown. */
  reset() {
    this.messages.replaceChildren();
    this.timeline.reset();
    this.turns = new Map();
    this.cards = new Map();
    this.queued = new Map();
    // The op type of each stored submission, to say what a refusal refused.
    this.ops = new Map();
    // Who sent each stored submission (`submitted_by`), by submission id.
    this.senders = new Map();
    this.running = null;
    this.lastTurn = null;
    this.waiting = new Set();
    this.count = 0;
    this.pending.clear();
    this.rollbackNote = null;
    this.compactions = [];
    this.regenerateTarget = null;
  }

  turn(turnId) {
    let turn = this.turns.get(turnId);
    if (!turn) {
      turn = {
        id: turnId,
        bubble: null,
        reasoning: null,
        elements: [],
        users: [],
        answers: [],
        cards: [],
        ended: null,
        replaced: false,
        errorNote: null,
      };
      this.turns.set(turnId, turn);
    }
    return turn;
  }

  /** Shows `element` as part of turn `turnId` (hidden if it is undone). */
  add(turnId, element) {
    if (turnId) {
      this.turn(turnId).elements.push(element);
    }
    this.messages.append(element);
    return element;
  }

  /** Renders one event. */
  apply(event) {
    this.count += 1;
    this.timeline.add(event);
    const msg = event.msg ?? {};
    switch (msg.type) {
      case "session_started":
        // Lifecycle, not conversation: the page shows it as the session's status.
        this.onLifecycle(msg.resumed ? "resumed" : "started", event);
        break;
      case "session_forked":
        this.forkMarker(msg);
        break;
      case "submission_queued":
        if (event.submission_id && msg.op?.type) {
          this.ops.set(event.submission_id, msg.op.type);
        }
        if (event.submission_id && msg.submitted_by) {
          this.senders.set(event.submission_id, msg.submitted_by);
        }
        if (msg.op?.type === "user_input" && this.running) {
          this.showQueued(event.submission_id, msg.op.text, msg.on_busy);
        }
        break;
      case "turn_started": {
        this.running = msg.turn_id;
        this.lastTurn = msg.turn_id;
        this.waiting.clear();
        const turn = this.turn(msg.turn_id);
        if (this.rollbackNote) {
          // The note about the answer this turn replaces goes with it.
          turn.elements.push(this.rollbackNote);
          this.rollbackNote = null;
        }
        this.updateRegenerate();
        this.onTurn(msg.turn_id, "running");
        break;
      }
      case "user_message":
        this.dropQueued(event.submission_id);
        this.userMessage(msg, this.senders.get(event.submission_id));
        this.onUserMessage();
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
          this.add(
            msg.turn_id,
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
        bubble.source += msg.delta;
        this.renderSoon(bubble);
        break;
      }
      case "assistant_message": {
        const turn = this.turn(msg.turn_id);
        if (turn.bubble || msg.text) {
          const bubble = this.bubble(msg.turn_id);
          // The whole message replaces what was streamed.
          bubble.source = msg.text;
          this.pending.delete(bubble);
          renderMarkdown(bubble.text, msg.text);
          this.settle(bubble, "final");
        }
        turn.bubble = null;
        break;
      }
      case "approval_requested": {
        const card = this.card(msg.call_id, msg.name, msg.arguments, msg.turn_id);
        setCardState(card, "awaiting", "waiting for approval");
        card.actions.hidden = false;
        this.waiting.add(msg.call_id);
        this.onTurn(msg.turn_id, "awaiting_approval");
        break;
      }
      case "approval_decided": {
        const card = this.cards.get(msg.call_id);
        if (card) {
          showDecision(card, msg.decision, this.author(msg.decided_by), msg.decided_by);
        }
        this.waiting.delete(msg.call_id);
        if (this.waiting.size === 0 && this.running) {
          this.onTurn(this.running, "running");
        }
        break;
      }
      case "client_tool_requested": {
        const card = this.card(msg.call_id, msg.name, msg.arguments, msg.turn_id);
        attachClientTool(card, msg, (output, isError) => this.onClientToolResult(msg.call_id, output, isError));
        this.waiting.add(msg.call_id);
        this.onTurn(msg.turn_id, "awaiting_client_tool");
        break;
      }
      case "tool_call_started": {
        const card = this.card(msg.call_id, msg.name, msg.arguments, msg.turn_id);
        if (card.root.dataset.state !== "denied" && !card.clientTool) {
          setCardState(card, "running", "running");
        }
        break;
      }
      case "tool_call_completed": {
        const card = this.card(msg.call_id, "tool", "", msg.turn_id);
        closeActions(card);
        card.result.textContent = msg.output;
        card.result.classList.toggle("error", Boolean(msg.is_error));
        card.resultBox.hidden = false;
        card.root.classList.toggle("failed", Boolean(msg.is_error));
        const denied = card.root.dataset.state === "denied";
        setCardState(card, msg.is_error ? "error" : "done", denied ? "denied" : msg.is_error ? "failed" : "done");
        if (this.waiting.delete(msg.call_id) && this.waiting.size === 0 && this.running) {
          this.onTurn(this.running, "running");
        }
        break;
      }
      case "tool_call_progress": {
        const card = this.cards.get(msg.call_id);
        if (card && card.root.dataset.state === "running") {
          setCardState(card, "running", progressLabel(msg));
        }
        break;
      }
      case "tools_changed":
        this.onLifecycle("tools_changed", event, summary(event));
        break;
      case "token_usage":
        this.onUsage(msg.session_total);
        break;
      case "turn_complete":
        this.endTurn(msg.turn_id, event.sequence);
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
        if (turn.errorNote && turn.errorNote.dataset.message === msg.message) {
          // The `error` just before said the same: one note tells both.
          turn.errorNote.textContent = text;
          turn.errorNote.dataset.reason = msg.reason;
        } else {
          this.note("turn_aborted", text, { "data-reason": msg.reason }, msg.turn_id);
        }
        this.endTurn(msg.turn_id, event.sequence);
        break;
      }
      case "warning":
        this.note("warning", `Warning: ${msg.message}`, {}, msg.turn_id);
        break;
      case "error": {
        const note = this.note("error", `Error: ${msg.message}`, { "data-message": msg.message }, msg.turn_id);
        if (msg.turn_id) {
          this.turn(msg.turn_id).errorNote = note;
        }
        break;
      }
      case "submission_rejected":
        this.dropQueued(event.submission_id);
        this.note("submission_rejected", `${REJECTED[this.ops.get(event.submission_id)] ?? REJECTED.other}: ${msg.reason}`, {
          "data-op": this.ops.get(event.submission_id) ?? "",
        });
        break;
      case "context_compacted":
        this.compactionMarker(msg, event.sequence);
        break;
      case "turn_rolled_back":
        this.rollBack(msg);
        break;
      case "shutdown_complete":
        this.onLifecycle("shut_down", event);
        break;
      default:
        break;
    }
  }

  endTurn(turnId, sequence) {
    const turn = this.turn(turnId);
    for (const card of turn.cards) {
      closeActions(card);
    }
    this.waiting.clear();
    turn.ended = sequence;
    // A fork at the end of this turn keeps its exchange.
    for (const user of turn.users) {
      user.fork.disabled = false;
    }
    if (this.running === turnId) {
      this.running = null;
    }
    this.updateRegenerate();
    this.onTurn(null, "idle");
  }

  /** A user message, with its Edit and Fork buttons; `sender` is its `submitted_by`. */
  userMessage(msg, sender) {
    const turn = msg.turn_id ? this.turn(msg.turn_id) : null;
    const text = h("div", { class: "text", "data-testid": "message-text", text: msg.text });
    const actions = h("div", { class: "message-actions", role: "group", "aria-label": "Message actions" });
    const error = h("p", { class: "inline-error", role: "alert", "data-testid": "message-error", hidden: true });
    const root = h(
      "li",
      { class: "message user", "data-testid": "user-message", "data-turn-id": msg.turn_id ?? "" },
      h("div", { class: "who", "data-testid": "message-author", text: this.author(sender) ?? "You" }),
      text,
      actions,
      error,
    );
    const fork = actionButton("Fork", "Fork the conversation after this exchange", "fork-message", async () => {
      const ended = this.turns.get(msg.turn_id)?.ended;
      if (ended == null) {
        return;
      }
      fork.disabled = true;
      error.hidden = true;
      try {
        await this.actions.fork?.(ended);
      } catch (failure) {
        error.textContent = `Cannot fork: ${failure.message}`;
        error.hidden = false;
      } finally {
        fork.disabled = false;
      }
    });
    fork.disabled = turn?.ended == null;
    fork.title = "A new session with the conversation up to the end of this exchange";
    // Only a turn's first message can be edited: a fork just before the
    // turn with the new text.
    if (turn && turn.users.length === 0) {
      const edit = actionButton("Edit", "Edit this message", "edit-message", () =>
        this.openEditor(root, msg.turn_id, msg.text, error),
      );
      edit.title = "Send an edited message in a new session forked just before it";
      actions.append(edit);
    }
    actions.append(fork);
    if (!turn) {
      fork.hidden = true;
    }
    // Shown only on the message of a last turn that left no answer.
    const holder = { root, fork, error, regenerate: null };
    holder.regenerate = actionButton("Retry", "Regenerate the answer to this message", "regenerate", () =>
      this.regenerate(holder),
    );
    holder.regenerate.hidden = true;
    holder.regenerate.title = "Undo this turn and answer the message again";
    actions.append(holder.regenerate);
    turn?.users.push(holder);
    this.add(msg.turn_id, root);
  }

  /** The editor of a past message, in place of its text. */
  openEditor(root, turnId, original, error) {
    if (root.querySelector("form")) {
      root.querySelector("textarea").focus();
      return;
    }
    const input = h("textarea", {
      rows: 3,
      "aria-label": "The edited message",
      "data-testid": "edit-input",
    });
    input.value = original;
    const submit = h("button", { type: "submit", class: "primary", "data-testid": "edit-submit", text: "Send in a new session" });
    const cancel = h("button", { type: "button", "data-testid": "edit-cancel", text: "Cancel" });
    const form = h(
      "form",
      { class: "message-editor", "data-testid": "message-editor" },
      input,
      h("div", { class: "editor-actions" }, cancel, submit),
    );
    const close = () => {
      form.remove();
      root.classList.remove("editing");
    };
    cancel.addEventListener("click", close);
    input.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        close();
      }
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const text = input.value;
      if (!text.trim()) {
        return;
      }
      submit.disabled = true;
      error.hidden = true;
      try {
        await this.actions.edit?.(turnId, text);
        close();
      } catch (failure) {
        error.textContent = `Cannot send the edited message: ${failure.message}`;
        error.hidden = false;
      } finally {
        submit.disabled = false;
      }
    });
    root.classList.add("editing");
    root.querySelector(".message-actions").before(form);
    input.focus();
  }

  /**
   * Shows the Regenerate button on the last answer, when no turn runs; a
   * last turn with no answer (it failed) gets a Retry button on its message.
   * Only the previous and the new button change: a long session replays
   * thousands of turns.
   */
  updateRegenerate() {
    const last = this.lastTurn && this.turns.get(this.lastTurn);
    const live = !this.running && last && !last.replaced ? last : null;
    const target = live ? (live.answers.at(-1) ?? live.users.at(-1)) : null;
    const previous = this.regenerateTarget;
    if (previous && previous !== target) {
      previous.regenerate.hidden = true;
    }
    if (target) {
      target.regenerate.hidden = false;
      target.regenerate.disabled = false;
    }
    this.regenerateTarget = target ?? null;
  }

  async regenerate(bubble) {
    bubble.regenerate.disabled = true;
    bubble.error.hidden = true;
    try {
      await this.actions.regenerate?.();
    } catch (failure) {
      bubble.error.textContent = `Cannot regenerate: ${failure.message}`;
      bubble.error.hidden = false;
      bubble.regenerate.disabled = false;
    }
  }

  /** Hides an undone turn: the model no longer sees it. */
  rollBack(msg) {
    const turn = this.turns.get(msg.rolled_back_turn_id);
    if (turn) {
      turn.replaced = true;
      for (const element of turn.elements) {
        element.hidden = true;
        element.dataset.replaced = "true";
      }
    }
    if (msg.compaction_undone) {
      const marker = this.compactions.at(-1);
      if (marker) {
        marker.dataset.undone = "true";
        marker.querySelector(".compaction-head").append(" (undone with the regenerated turn)");
      }
    }
    this.rollbackNote = this.note(
      "turn_rolled_back",
      "Regenerated: the answer below replaces the earlier one.",
    );
    this.updateRegenerate();
  }

  /**
   * Where a fork's own log begins: a divider under the conversation it
   * inherited, which the page fills in above it (`onForked`).
   */
  forkMarker(msg) {
    const parent = msg.parent_session_id;
    const link = h("a", {
      href: `#/sessions/${encodeURIComponent(parent)}`,
      class: "session-ref",
      "data-testid": "open-parent",
      "aria-label": `Open the parent session ${parent}`,
      text: parent,
    });
    const detail = h("span", { class: "fork-detail", "data-testid": "fork-detail" });
    const marker = h(
      "li",
      {
        class: "note fork",
        role: "separator",
        "data-testid": "fork-marker",
        "data-parent": parent,
        "data-at": msg.at_sequence,
        "data-history-items": msg.history_items,
      },
      h("span", { class: "fork-label" }, "Forked from ", link),
      detail,
    );
    this.messages.append(marker);
    this.onForked(msg, { marker, link, detail });
  }

  /** Where the model started seeing a summary instead of older history. */
  compactionMarker(msg, sequence) {
    const reason = COMPACTION_REASONS[msg.reason] ?? msg.reason;
    const marker = h(
      "li",
      { class: "note compaction", "data-testid": "compaction", "data-reason": msg.reason, "data-sequence": sequence },
      h(
        "div",
        { class: "compaction-head", "data-testid": "compaction-head" },
        `Context compacted (${reason}): ${msg.tokens_before} → ${msg.tokens_after} tokens`,
      ),
      h(
        "details",
        {},
        h("summary", { text: "The summary the model sees" }),
        h("div", { class: "compaction-summary", "data-testid": "compaction-summary", text: msg.summary }),
      ),
    );
    this.compactions.push(marker);
    this.messages.append(marker);
  }

  /** The assistant bubble being streamed in a turn, made on first use. */
  bubble(turnId) {
    const turn = this.turn(turnId);
    if (!turn.bubble) {
      const text = h("div", { class: "text markdown", "data-testid": "assistant-text" });
      const label = h("span", { class: "label", "data-testid": "assistant-label" });
      const actions = h("div", { class: "message-actions", role: "group", "aria-label": "Answer actions" });
      const error = h("p", { class: "inline-error", role: "alert", "data-testid": "message-error", hidden: true });
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
        actions,
        error,
      );
      label.textContent = "(writing…)";
      const bubble = { root, text, label, error, source: "", regenerate: null };
      bubble.regenerate = actionButton("Regenerate", "Regenerate this answer", "regenerate", () =>
        this.regenerate(bubble),
      );
      bubble.regenerate.hidden = true;
      bubble.regenerate.title = "Undo this answer and answer the message again";
      actions.append(bubble.regenerate);
      this.add(turnId, root);
      turn.bubble = bubble;
      turn.answers.push(bubble);
    }
    return turn.bubble;
  }

  /** Renders a streaming answer as markdown at the next animation frame. */
  renderSoon(bubble) {
    this.pending.add(bubble);
    if (this.frame === null) {
      this.frame = requestAnimationFrame(() => {
        this.frame = null;
        this.flush();
      });
    }
  }

  /** Renders every streaming answer that changed, now. */
  flush() {
    for (const bubble of this.pending) {
      renderMarkdown(bubble.text, bubble.source);
    }
    this.pending.clear();
  }

  settle(bubble, state) {
    if (this.pending.delete(bubble)) {
      renderMarkdown(bubble.text, bubble.source);
    }
    bubble.root.dataset.state = state;
    bubble.root.removeAttribute("aria-busy");
    bubble.label.textContent = state === "interrupted" ? "(interrupted)" : "";
  }

  /** The card of a tool call, made on first use. */
  card(callId, name, argumentsText, turnId) {
    let card = this.cards.get(callId);
    if (card) {
      return card;
    }
    card = toolCard(callId, name, argumentsText, (decision) => this.onApproval(callId, decision));
    const turn = turnId ?? this.running;
    card.turnId = turn;
    this.cards.set(callId, card);
    if (turn) {
      this.turn(turn).cards.push(card);
    }
    this.add(turn, card.root);
    return card;
  }

  showQueued(submissionId, text, onBusy) {
    if (!submissionId || this.queued.has(submissionId)) {
      return;
    }
    const who = this.author(this.senders.get(submissionId)) ?? "You";
    const element = h(
      "li",
      { class: "message user queued", "data-testid": "queued-message" },
      h("div", { class: "who", text: `${who} (${onBusy === "steer" ? "steering" : "queued"})` }),
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

  note(kind, text, attributes = {}, turnId = null) {
    return this.add(turnId, h("li", { class: `note ${kind}`, "data-testid": "note", "data-kind": kind, ...attributes, text }));
  }
}
