// A call of a client tool (one the session declared for its clients to
// run) waits on its tool card for a result: a text box and "Send result" /
// "Send as error" buttons, which post a `client_tool_result` op. They are
// shown only to a principal with the `submit` scope (others see why they
// cannot answer); the card closes them when the call completes
// (`tool_call_completed`, which also shows the result) or its turn ends.
// chat.js attaches the form when `client_tool_requested` arrives, whether
// live or replayed from the log.

import { h } from "./dom.js";
import { setCardState } from "./tool_card.js";

/** The result's limit, in bytes (the server's MAX_CLIENT_TOOL_OUTPUT_BYTES). */
const MAX_OUTPUT_BYTES = 256 * 1024;

/** "in 4 min" for a deadline in milliseconds since the epoch. */
function deadlineText(expiresAtMs) {
  const minutes = Math.round((expiresAtMs - Date.now()) / 60000);
  const when = new Date(expiresAtMs).toLocaleTimeString(undefined, { timeStyle: "short" });
  return minutes > 0 ? `Answer by ${when} (in ${minutes} min), or the call fails.` : `Answer by ${when}, or the call fails.`;
}

/**
 * Puts the result form of client tool call `msg` (a `client_tool_requested`
 * event's payload) on `card`; `send(output, isError)` posts the result and
 * resolves once the server took it.
 */
export function attachClientTool(card, msg, send) {
  if (card.clientTool) {
    return card.clientTool;
  }
  const input = h("textarea", {
    rows: 3,
    class: "client-tool-input",
    "aria-label": `The result of the ${msg.name} call`,
    "data-testid": "client-tool-input",
    placeholder: "The result to send back to the model",
  });
  const sendResult = h("button", {
    type: "button",
    class: "primary",
    "data-testid": "client-tool-send",
    text: "Send result",
  });
  const sendError = h("button", {
    type: "button",
    class: "danger",
    "data-testid": "client-tool-send-error",
    title: "Send the text as the call's error message",
    text: "Send as error",
  });
  const error = h("p", { class: "inline-error", role: "alert", "data-testid": "client-tool-error", hidden: true });
  const deadline = msg.expires_at_ms
    ? h("p", { class: "hint", "data-testid": "client-tool-deadline", text: deadlineText(msg.expires_at_ms) })
    : null;
  const form = h(
    "div",
    { class: "client-tool", "data-needs": "submit", "data-testid": "client-tool-form" },
    h("div", { class: "caption", text: "Run by the client: send its result" }),
    input,
    h("div", { class: "actions", role: "group", "aria-label": `Answer the ${msg.name} call` }, sendResult, sendError),
    deadline,
    error,
  );
  const lacks = h("p", {
    class: "hint",
    "data-lacks": "submit",
    "data-testid": "cannot-answer",
    text: "Waiting for a client to send the result: your key lacks the submit scope.",
  });
  const holder = h("div", { class: "client-tool-box" }, form, lacks);
  const buttons = [sendResult, sendError];
  const state = {
    root: holder,
    input,
    closed: false,
    close() {
      state.closed = true;
      holder.hidden = true;
      input.disabled = true;
      for (const button of buttons) {
        button.disabled = true;
      }
    },
  };
  const answer = async (isError) => {
    const output = input.value;
    error.hidden = true;
    if (new TextEncoder().encode(output).length > MAX_OUTPUT_BYTES) {
      error.textContent = `The result is over the ${MAX_OUTPUT_BYTES / 1024} KiB limit.`;
      error.hidden = false;
      return;
    }
    for (const button of buttons) {
      button.disabled = true;
    }
    try {
      await send(output, isError);
      // The call's completion may have streamed in before the POST's 202
      // (the server stores it first): a closed card keeps what it shows.
      if (!state.closed) {
        setCardState(card, "answered", "result sent");
      }
      card.root.dataset.resultSent = "true";
    } catch (failure) {
      error.textContent = `Could not send the result: ${failure.message}${failure.code ? ` (${failure.code})` : ""}`;
      error.hidden = false;
      if (!state.closed) {
        for (const button of buttons) {
          button.disabled = false;
        }
      }
    }
  };
  sendResult.addEventListener("click", () => answer(false));
  sendError.addEventListener("click", () => answer(true));
  card.root.classList.add("client-tool-card");
  card.root.querySelector("[data-testid=tool-arguments]").after(holder);
  card.clientTool = state;
  setCardState(card, "awaiting", "waiting for the client");
  return state;
}
