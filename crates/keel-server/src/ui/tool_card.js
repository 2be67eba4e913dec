// The card of one tool call in the conversation: its name and arguments,
// its state, the Approve / Always / Deny buttons while it waits for a
// decision (shown only to a principal with the `approve` scope; others see
// why they cannot decide), who decided, and the result. chat.js makes the
// cards and moves them through their states as the events arrive; a client
// tool's call gets its result form from client_tool.js.

import { h } from "./dom.js";

/** Arguments as the model wrote them, indented when they are JSON. */
function prettyArguments(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

const DECISION_LABELS = {
  approve: "approved",
  approve_for_session: "approved for the session",
  deny: "denied",
};

/**
 * A new card for call `callId` of tool `name`; `send(decision)` sends a
 * decision and resolves once the server took it.
 */
export function toolCard(callId, name, argumentsText, send) {
  const nameElement = h("span", { class: "tool-name", "data-testid": "tool-name", text: name });
  const status = h("span", { class: "badge", "data-testid": "tool-status" });
  const args = h("pre", { class: "arguments", "data-testid": "tool-arguments", text: prettyArguments(argumentsText) });
  const result = h("pre", { class: "result", "data-testid": "tool-result" });
  const resultBox = h("div", { class: "result-box", hidden: true }, h("div", { class: "caption", text: "Result" }), result);
  const decision = h("p", { class: "decision", "data-testid": "tool-decision", hidden: true });
  const error = h("p", { class: "inline-error", role: "alert", "data-testid": "tool-error", hidden: true });
  const card = { root: null, status, result, resultBox, actions: null, buttons: [], decision, error, turnId: null };
  card.buttons = [
    ["approve", "Approve", "approve"],
    ["approve_for_session", "Always", "approve-always"],
    ["deny", "Deny", "deny"],
  ].map(([decisionName, label, testId]) =>
    h("button", {
      type: "button",
      class: decisionName === "deny" ? "danger" : decisionName === "approve" ? "primary" : "",
      "data-testid": testId,
      "data-decision": decisionName,
      "data-needs": "approve",
      title:
        decisionName === "approve_for_session" ? `Approve this call and every later ${name} call in this session` : undefined,
      text: label,
      onclick: () => decide(card, decisionName, send),
    }),
  );
  card.actions = h(
    "div",
    { class: "actions", role: "group", "aria-label": `Approve or deny the ${name} call`, hidden: true },
    card.buttons,
    h("p", {
      class: "hint",
      "data-lacks": "approve",
      "data-testid": "cannot-approve",
      text: "Waiting for someone who may approve it: your key lacks the approve scope.",
    }),
  );
  card.root = h(
    "li",
    { class: "tool-card", "data-testid": "tool-card", "data-call-id": callId },
    h("div", { class: "tool-head" }, h("span", { class: "caption", text: "Tool call" }), nameElement, status),
    args,
    card.actions,
    decision,
    error,
    resultBox,
  );
  return card;
}

/** Shows the card's state (`awaiting`, `running`, `done`, …) and its label. */
export function setCardState(card, state, label) {
  card.root.dataset.state = state;
  card.status.textContent = label ?? state;
}

/** Takes the decision buttons (and a client tool's result form) away. */
export function closeActions(card) {
  card.clientTool?.close();
  card.actions.hidden = true;
  for (const button of card.buttons) {
    button.disabled = true;
  }
}

/**
 * Shows the decision taken: by `by` (how the decider is named), or by the
 * viewer when `by` is null; `actor` is the recorded `decided_by`.
 */
export function showDecision(card, decision, by, actor) {
  closeActions(card);
  card.decision.textContent = `${by ?? "You"} ${DECISION_LABELS[decision] ?? decision} this call.`;
  card.decision.dataset.by = by ? (actor.name ?? actor.principal_id) : "";
  card.decision.hidden = false;
  setCardState(card, decision === "deny" ? "denied" : "approved", DECISION_LABELS[decision]);
}

async function decide(card, decision, send) {
  for (const button of card.buttons) {
    button.disabled = true;
  }
  card.error.hidden = true;
  try {
    await send(decision);
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
