// The conversation a fork (or an edit) inherited: its log starts with
// `session_forked`, and the history it was given is the parent's up to
// `at_sequence`. That part is read from the parent's log (and, for a fork of
// a fork, from its parent's, and so on) and shown above the fork's divider,
// marked as inherited and without actions: acting on it is done in the
// parent, which the divider links to.

import { api, ApiError, sessionPath } from "./api.js";
import { h } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

const PAGE = 1000;
/** Forks of forks are followed this far up. */
const MAX_DEPTH = 8;

/** The parent's events 1..`atSequence`, page by page. */
async function eventsUpTo(sessionId, atSequence) {
  const events = [];
  for (;;) {
    const after = events.at(-1)?.sequence ?? 0;
    if (after >= atSequence) {
      return events;
    }
    const query = new URLSearchParams({ after: String(after), before: String(atSequence + 1), limit: String(PAGE) });
    const page = await api(`${sessionPath(sessionId)}/events?${query}`);
    events.push(...page.events);
    if (!page.has_more || page.events.length === 0) {
      return events;
    }
  }
}

/**
 * The conversation of `events` as the model saw it: `{role, text}` for each
 * user message and answer, `{role: "tool", name}` for each tool call,
 * without the turns a regeneration undid.
 */
export function conversationOf(events) {
  const items = [];
  const undone = new Set();
  for (const event of events) {
    if (event.msg?.type === "turn_rolled_back") {
      undone.add(event.msg.rolled_back_turn_id);
    }
  }
  for (const event of events) {
    const msg = event.msg ?? {};
    if (msg.turn_id && undone.has(msg.turn_id)) {
      continue;
    }
    if (msg.type === "user_message") {
      items.push({ role: "user", text: msg.text });
    } else if (msg.type === "assistant_message" && msg.text) {
      items.push({ role: "assistant", text: msg.text });
    } else if (msg.type === "tool_call_started") {
      items.push({ role: "tool", text: msg.name });
    }
  }
  return items;
}

/** The inherited conversation of the fork whose first event is `forked`, oldest first. */
async function inheritedItems(forked) {
  const chain = [];
  let link = forked;
  for (let depth = 0; link && depth < MAX_DEPTH; depth += 1) {
    const events = await eventsUpTo(link.parent_session_id, link.at_sequence);
    chain.unshift(conversationOf(events));
    const first = events[0]?.msg;
    link = first?.type === "session_forked" ? first : null;
  }
  return chain.flat();
}

function itemElement(item) {
  const attributes = { class: `message inherited ${item.role}`, "data-testid": "inherited-message", "data-role": item.role };
  if (item.role === "tool") {
    return h("li", { ...attributes, class: "note inherited tool" }, "Tool call ", h("code", { text: item.text }));
  }
  const text = h("div", { class: item.role === "assistant" ? "text markdown" : "text" });
  if (item.role === "assistant") {
    renderMarkdown(text, item.text);
  } else {
    text.textContent = item.text;
  }
  return h("li", attributes, text);
}

/**
 * Fills in a fork's divider (`parts` from the chat view: the marker, its
 * link to the parent and a detail line) and shows the inherited
 * conversation above it, while `stillShown()` says the fork is on screen.
 */
export async function showInherited(forked, parts, stillShown) {
  const { marker, link, detail } = parts;
  marker.dataset.inherited = "loading";
  detail.textContent = "";
  try {
    const parent = await api(sessionPath(forked.parent_session_id));
    if (stillShown() && parent.title) {
      link.textContent = parent.title;
      link.title = parent.id;
    }
  } catch {
    // The link keeps the parent's id.
  }
  let items;
  try {
    items = await inheritedItems(forked);
  } catch (error) {
    if (stillShown()) {
      marker.dataset.inherited = "missing";
      detail.textContent =
        error instanceof ApiError && error.status === 404
          ? " The parent session is gone: the conversation before this point cannot be shown."
          : ` The earlier conversation cannot be shown: ${error.message}`;
    }
    return;
  }
  if (!stillShown()) {
    return;
  }
  marker.before(...items.map(itemElement));
  marker.dataset.inherited = String(items.length);
  detail.textContent = items.length ? " The conversation above is the parent's, up to here." : "";
}
