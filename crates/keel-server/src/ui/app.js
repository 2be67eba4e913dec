// The web UI of keel serve: the session list (a drawer at phone width), the
// new-session form and the chat view of the session named in the URL
// (#/sessions/{id}), with its title, rename, delete and compact actions and
// the per-message actions (edit, fork, regenerate) of chat.js; who the page
// signed in as, and what its scopes allow, is principal.js's. The
// conversation follows new content (follow.js), a fork shows what it
// inherited (inherited.js), each session keeps its own draft (drafts.js),
// and the panels and keyboard shortcuts are panels.js's.
//
// Plain ES modules, no build step; served from the binary by
// src/server/ui.rs. The API is docs/http-api.md.

import { api, ApiError, newKey, sessionPath } from "./api.js";
import { ChatView, h } from "./chat.js";
import { Drafts } from "./drafts.js";
import { EventFeed } from "./feed.js";
import { closeNewChat } from "./new_chat.js";
import { groupByDay, isModelRefusal, offerModelSwitch } from "./sidebar.js";
import { Follower } from "./follow.js";
import { showInherited } from "./inherited.js";
import { installPanels } from "./panels.js";
import { actorLabel, loadPrincipal, onPrincipalChange, principalReady } from "./principal.js";
import { installSignIn } from "./signin.js";

const $ = (id) => document.getElementById(id);

const ui = {
  notice: $("notice"),
  sessionsToggle: $("sessions-toggle"),
  sidebar: $("sidebar"),
  sidebarBackdrop: $("sidebar-backdrop"),
  sessionsClose: $("sessions-close"),
  askToken: $("ask-token"),
  newForm: $("new-session"),
  newModel: $("new-model"),
  newBot: $("new-bot"),
  newInstructions: $("new-instructions"),
  newSubmit: $("new-session-submit"),
  newError: $("new-session-error"),
  sessionList: $("session-list"),
  sessionListStatus: $("session-list-status"),
  refreshSessions: $("refresh-sessions"),
  moreSessions: $("more-sessions"),
  modelRefusal: $("model-refusal"),
  emptyChat: $("empty-chat"),
  chatView: $("chat-view"),
  chatTitle: $("chat-title"),
  chatId: $("chat-id"),
  renameForm: $("rename-form"),
  renameInput: $("rename-input"),
  renameCancel: $("rename-cancel"),
  renameError: $("rename-error"),
  rename: $("rename"),
  compact: $("compact"),
  deleteSession: $("delete"),
  deleteConfirm: $("delete-confirm"),
  deleteYes: $("delete-yes"),
  deleteNo: $("delete-no"),
  chatMeta: $("chat-meta"),
  streamStatus: $("stream-status"),
  turnStatus: $("turn-status"),
  interrupt: $("interrupt"),
  eventsToggle: $("events-toggle"),
  sessionStatus: $("session-status"),
  sessionMenu: $("session-menu"),
  showShortcuts: $("show-shortcuts"),
  shortcutsHint: $("shortcuts-hint"),
  shortcutsDialog: $("shortcuts-dialog"),
  conversationScroll: $("conversation-scroll"),
  jumpLatest: $("jump-latest"),
  jumpCount: $("jump-count"),
  timeline: $("timeline"),
  timelineClose: $("timeline-close"),
  messages: $("messages"),
  composer: $("composer"),
  composerText: $("composer-text"),
  busyPolicy: $("busy-policy"),
  queueHint: $("queue-hint"),
  send: $("send"),
  composerError: $("composer-error"),
  timelineList: $("timeline-list"),
  timelineCount: $("timeline-count"),
  tokenDialog: $("token-dialog"),
  tokenForm: $("token-form"),
  tokenMessage: $("token-message"),
  tokenInput: $("token-input"),
};

const phone = window.matchMedia("(max-width: 720px)");

/** Sessions per page of the list: `?limit=N` in the page's URL, or 50. */
const PAGE_SIZE = (() => {
  const limit = Number(new URLSearchParams(location.search).get("limit"));
  return Number.isInteger(limit) && limit >= 1 && limit <= 500 ? limit : 50;
})();

function notify(text, kind = "info") {
  ui.notice.textContent = text;
  ui.notice.dataset.kind = kind;
}

function showError(element, text) {
  element.textContent = text;
  element.hidden = !text;
}

/** Handles an API failure that is not a form's own business. */
function reportFailure(what, error) {
  if (error instanceof ApiError && error.status === 401) {
    notify("This server needs an access token.", "error");
    ui.askToken.hidden = false;
    return;
  }
  notify(`${what}: ${error.message}`, "error");
}

// --- Signing in -------------------------------------------------------------

installSignIn(ui, () => notify(""));

ui.askToken.addEventListener("click", () => {
  ui.askToken.hidden = true;
  notify("");
  loadPrincipal();
  loadSessions();
  if (current) {
    const id = current.id;
    closeSession();
    openSession(id);
  }
});

// --- The session list ------------------------------------------------------

const listing = { cursor: null, generation: 0 };

function formatTime(ms) {
  return new Date(ms).toLocaleString(undefined, { dateStyle: "short", timeStyle: "short" });
}

const STATE_LABELS = {
  idle: "idle",
  running: "running",
  awaiting_approval: "awaiting approval",
  awaiting_client_tool: "awaiting a client tool",
};

function stateLabel(state) {
  return STATE_LABELS[state] ?? state;
}

function sessionItem(session) {
  const link = h(
    "a",
    { href: `#/sessions/${encodeURIComponent(session.id)}`, "data-testid": "session-link" },
    session.title
      ? h("span", { class: "session-title", "data-testid": "session-title", text: session.title })
      : h("span", { class: "session-id", "data-testid": "session-title", text: session.id }),
  );
  const state = h("span", {
    class: "badge",
    "data-testid": "session-state",
    "data-state": session.state,
    text: stateLabel(session.state),
  });
  const turns = `${session.turns_completed} turn${session.turns_completed === 1 ? "" : "s"}`;
  const item = h(
    "li",
    { "data-testid": "session-item", "data-session-id": session.id },
    link,
    session.title ? h("div", { class: "session-meta session-id", text: session.id }) : null,
    h("div", { class: "session-meta" }, state, ` ${session.bot_id} · ${turns} · ${formatTime(session.updated_at_ms)}`),
  );
  item.dataset.updatedAt = String(session.updated_at_ms);
  if (current?.id === session.id) {
    link.setAttribute("aria-current", "page");
  }
  return item;
}

/** The first page of sessions, or with `more` the next one. */
async function loadSessions({ more = false } = {}) {
  const generation = more ? listing.generation : ++listing.generation;
  const query = new URLSearchParams({ limit: String(PAGE_SIZE), order: "activity" });
  if (more) {
    if (!listing.cursor) {
      return;
    }
    query.set("cursor", listing.cursor);
  }
  ui.moreSessions.disabled = true;
  ui.sessionList.setAttribute("aria-busy", "true");
  try {
    const page = await api(`/v1/sessions?${query}`);
    if (generation !== listing.generation) {
      return;
    }
    const items = page.sessions.map(sessionItem);
    if (more) {
      const shown = new Set(Array.from(ui.sessionList.children, (item) => item.dataset.sessionId));
      ui.sessionList.append(...items.filter((item) => !shown.has(item.dataset.sessionId)));
    } else {
      ui.sessionList.replaceChildren(...items);
    }
    groupByDay(ui.sessionList);
    listing.cursor = page.next_cursor ?? null;
    ui.moreSessions.hidden = !listing.cursor;
    ui.sessionListStatus.textContent = ui.sessionList.querySelector("[data-session-id]") ? "" : "No sessions yet.";
  } catch (error) {
    if (generation === listing.generation) {
      ui.sessionListStatus.textContent = `Cannot list the sessions: ${error.message}`;
      reportFailure("Cannot list the sessions", error);
    }
  } finally {
    ui.moreSessions.disabled = false;
    ui.sessionList.removeAttribute("aria-busy");
  }
}

function listedItem(sessionId) {
  return Array.from(ui.sessionList.querySelectorAll(":scope > [data-session-id]")).find(
    (item) => item.dataset.sessionId === sessionId,
  );
}

/** Shows a session's state in its list entry, if listed. */
function updateListedState(sessionId, state) {
  const badge = listedItem(sessionId)?.querySelector("[data-testid=session-state]");
  if (badge) {
    badge.dataset.state = state;
    badge.textContent = stateLabel(state);
  }
}

// Once a turn has ended (and the log has gone quiet for a moment, so a
// replay costs one request), the session's list entry is fetched again.
let entryRefresh = null;

function refreshListedSoon(sessionId) {
  clearTimeout(entryRefresh);
  entryRefresh = setTimeout(async () => {
    try {
      const session = await api(sessionPath(sessionId));
      listedItem(sessionId)?.replaceWith(sessionItem(session));
      if (current?.id === sessionId) {
        showTitle(session);
      }
    } catch {
      // The entry keeps what it showed; the list's Refresh button is there.
    }
  }, 300);
}

function markCurrentInList() {
  for (const item of ui.sessionList.querySelectorAll(":scope > [data-session-id]")) {
    const link = item.querySelector("a");
    if (current && item.dataset.sessionId === current.id) {
      link.setAttribute("aria-current", "page");
    } else {
      link.removeAttribute("aria-current");
    }
  }
}

ui.refreshSessions.addEventListener("click", () => loadSessions());
ui.moreSessions.addEventListener("click", () => loadSessions({ more: true }));

// --- A new session ---------------------------------------------------------

ui.newForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  showError(ui.newError, "");
  const body = {};
  const model = ui.newModel.value.trim();
  const bot = ui.newBot.value.trim();
  const instructions = ui.newInstructions.value.trim();
  if (model) {
    body.model = model;
  }
  if (bot) {
    body.bot_id = bot;
  }
  if (instructions) {
    body.instructions = instructions;
  }
  ui.newSubmit.disabled = true;
  try {
    const session = await api("/v1/sessions", { method: "POST", body });
    ui.newForm.reset();
    closeNewChat();
    location.hash = `#/sessions/${encodeURIComponent(session.id)}`;
    await loadSessions();
    ui.composerText.focus();
  } catch (error) {
    showError(ui.newError, `Cannot create the session: ${error.message}`);
  } finally {
    ui.newSubmit.disabled = false;
  }
});

// --- The chat view ---------------------------------------------------------

/** The open session: { id, feed, title }. */
let current = null;

const TURN_STATUS = {
  running: "Running…",
  awaiting_approval: "Waiting for your approval",
  awaiting_client_tool: "Waiting for a client tool's result",
  idle: "",
};

// The runtime's own events, as the session's status in the header: they
// are not part of the conversation.
const LIFECYCLE = {
  started: () => "",
  resumed: (event) => `Reopened ${formatTime(event.timestamp_ms ?? Date.now())}`,
  shut_down: () => "Unloaded while idle: it reopens with your next message",
  tools_changed: (_event, detail) => `The tools changed: ${detail}`,
};

function showLifecycle(kind, event, detail = "") {
  ui.sessionStatus.textContent = LIFECYCLE[kind]?.(event, detail) ?? "";
  ui.sessionStatus.dataset.kind = kind;
}

const follower = new Follower({
  scroller: ui.conversationScroll,
  content: ui.messages,
  jump: ui.jumpLatest,
  count: ui.jumpCount,
});

const drafts = new Drafts(ui.composerText);

const chat = new ChatView({
  messages: ui.messages,
  timeline: ui.timelineList,
  author: actorLabel,
  onApproval: async (callId, decision) => {
    const session = current;
    await api(`${sessionPath(session.id)}/submissions`, {
      method: "POST",
      body: { op: { type: "approval", call_id: callId, decision } },
    });
  },
  onClientToolResult: (callId, output, isError) =>
    submitOp({ type: "client_tool_result", call_id: callId, output, is_error: isError }),
  onTurn: (turnId, state) => {
    if (turnId && state === "running" && ui.sessionStatus.dataset.kind !== "tools_changed") {
      showLifecycle("started");
    }
    ui.interrupt.hidden = !turnId;
    if (!turnId) {
      ui.interrupt.disabled = false;
    }
    ui.turnStatus.textContent = TURN_STATUS[state] ?? "";
    ui.turnStatus.dataset.state = state;
    if (current) {
      updateListedState(current.id, state);
      if (state === "idle") {
        refreshListedSoon(current.id);
      }
    }
  },
  onUsage: (total) => {
    if (total) {
      ui.chatMeta.dataset.usage = `${total.input_tokens} tokens in, ${total.output_tokens} out`;
      renderMeta();
    }
  },
  // The first message titles the session (the server sets it).
  onUserMessage: () => {
    if (current && !current.title) {
      refreshListedSoon(current.id);
    }
  },
  onLifecycle: (kind, event, detail) => showLifecycle(kind, event, detail),
  onForked: (msg, parts) => {
    const session = current;
    showInherited(msg, parts, () => current === session);
  },
  actions: {
    edit: (turnId, text) => forkAndOpen({ before_turn: turnId, message: text }),
    fork: (atSequence) => forkAndOpen({ at_sequence: atSequence }),
    regenerate: () => submitOp({ type: "regenerate" }),
  },
});

/** Submits an op to the open session; throws what the server refused. */
async function submitOp(op) {
  if (!current) {
    throw new Error("no session is open");
  }
  return api(`${sessionPath(current.id)}/submissions`, { method: "POST", body: { op } });
}

/** Forks the open session and opens the fork. */
async function forkAndOpen(body) {
  if (!current) {
    throw new Error("no session is open");
  }
  const fork = await api(`${sessionPath(current.id)}/fork`, { method: "POST", body });
  location.hash = `#/sessions/${encodeURIComponent(fork.id)}`;
  loadSessions();
  return fork;
}

/** Shows the session's title (or its id when it has none) in the header. */
function showTitle(session) {
  if (!current || current.id !== session.id) {
    return;
  }
  current.title = session.title ?? null;
  if (ui.renameForm.hidden) {
    ui.chatTitle.textContent = session.title ?? session.id;
  }
  ui.chatTitle.dataset.untitled = String(!session.title);
  ui.chatId.textContent = session.title ? session.id : "";
}

const STREAM_STATUS = {
  connecting: "Connecting…",
  live: "Live",
  reconnecting: "Reconnecting…",
  closed: "Disconnected",
};

function renderMeta() {
  const parts = [ui.chatMeta.dataset.info, ui.chatMeta.dataset.usage].filter(Boolean);
  ui.chatMeta.textContent = parts.join(" · ");
}

function openSession(id) {
  if (current?.id === id) {
    return;
  }
  closeSession();
  ui.emptyChat.hidden = true;
  ui.chatView.hidden = false;
  ui.chatView.dataset.sessionId = id;
  ui.chatTitle.textContent = id;
  ui.chatTitle.dataset.untitled = "true";
  ui.chatId.textContent = "";
  closeRename();
  ui.deleteConfirm.hidden = true;
  ui.modelRefusal.hidden = true;
  ui.modelRefusal.replaceChildren();
  ui.chatMeta.dataset.info = "";
  ui.chatMeta.dataset.usage = "";
  renderMeta();
  showError(ui.composerError, "");
  chat.reset();
  follower.reset();
  showLifecycle("started");
  panels.closeMenu();
  drafts.switchTo(id);
  draftKey = null;
  fitComposer();
  ui.timelineCount.textContent = "0";
  ui.interrupt.hidden = true;
  ui.turnStatus.textContent = "";
  const session = { id, feed: null, title: null };
  current = session;
  markCurrentInList();
  session.feed = new EventFeed(id, {
    onEvent: (event) => {
      chat.apply(event);
      ui.timelineCount.textContent = String(chat.count);
    },
    onStatus: (status) => {
      ui.streamStatus.textContent = STREAM_STATUS[status] ?? status;
      ui.streamStatus.dataset.state = status;
    },
    onError: (error) => {
      if (current === session) {
        reportFailure("The event stream failed", error);
      }
    },
  });
  // Who sent what is told apart from the viewer once the viewer is known.
  principalReady.then(() => session.feed.start());
  api(sessionPath(id))
    .then((info) => {
      if (current !== session) {
        return;
      }
      showTitle(info);
      ui.chatMeta.dataset.info = [info.model && `model ${info.model}`, `bot ${info.bot_id}`]
        .filter(Boolean)
        .join(" · ");
      renderMeta();
      if ([...ui.busyPolicy.options].some((option) => option.value === info.on_busy)) {
        ui.busyPolicy.value = info.on_busy;
      }
      session.queueMode = info.queue_mode;
      showQueueHint();
    })
    .catch((error) => {
      if (current !== session) {
        return;
      }
      if (error instanceof ApiError && error.status === 404) {
        session.feed.stop();
        ui.streamStatus.textContent = STREAM_STATUS.closed;
        notify(`There is no session ${id}.`, "error");
      } else {
        reportFailure("Cannot show the session", error);
      }
    });
}

function closeSession() {
  if (current) {
    current.feed?.stop();
    current = null;
  }
  chat.reset();
  drafts.switchTo(null);
  ui.chatView.hidden = true;
  ui.emptyChat.hidden = false;
  markCurrentInList();
}

const panels = installPanels({
  ui,
  phone,
  setDrawer,
  hasSession: () => Boolean(current),
  interrupt: () => {
    if (!current || !chat.running || ui.interrupt.hidden || ui.interrupt.disabled) {
      return false;
    }
    ui.interrupt.click();
    return true;
  },
});

ui.interrupt.addEventListener("click", async () => {
  if (!current || !chat.running) {
    return;
  }
  ui.interrupt.disabled = true;
  try {
    await api(`${sessionPath(current.id)}/submissions`, {
      method: "POST",
      body: { op: { type: "interrupt", turn_id: chat.running } },
    });
  } catch (error) {
    ui.interrupt.disabled = false;
    reportFailure("Cannot interrupt the turn", error);
  }
});

// --- Rename, delete, compact ------------------------------------------------

function closeRename() {
  ui.renameForm.hidden = true;
  ui.chatTitle.hidden = false;
  ui.rename.disabled = false;
  showError(ui.renameError, "");
}

ui.rename.addEventListener("click", () => {
  if (!current) {
    return;
  }
  ui.renameInput.value = current.title ?? "";
  ui.renameForm.hidden = false;
  ui.chatTitle.hidden = true;
  ui.rename.disabled = true;
  ui.renameInput.focus();
  ui.renameInput.select();
});

ui.renameCancel.addEventListener("click", closeRename);

ui.renameInput.addEventListener("keydown", (event) => {
  if (event.key === "Escape") {
    closeRename();
  }
});

ui.renameForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  const session = current;
  const title = ui.renameInput.value.trim();
  if (!session || !title) {
    return;
  }
  showError(ui.renameError, "");
  try {
    const renamed = await api(sessionPath(session.id), { method: "PATCH", body: { title } });
    if (current !== session) {
      return;
    }
    closeRename();
    showTitle(renamed);
    listedItem(renamed.id)?.replaceWith(sessionItem(renamed));
  } catch (error) {
    showError(ui.renameError, `Cannot rename: ${error.message}`);
  }
});

ui.deleteSession.addEventListener("click", () => {
  ui.deleteConfirm.hidden = false;
  ui.deleteNo.focus();
});

ui.deleteNo.addEventListener("click", () => {
  ui.deleteConfirm.hidden = true;
  ui.deleteSession.focus();
});

ui.deleteYes.addEventListener("click", async () => {
  const session = current;
  if (!session) {
    return;
  }
  ui.deleteYes.disabled = true;
  try {
    await api(sessionPath(session.id), { method: "DELETE" });
    listedItem(session.id)?.remove();
    if (current === session) {
      location.hash = "#/";
    }
    notify(`Deleted the session ${session.title ? `“${session.title}”` : session.id}.`);
    loadSessions();
  } catch (error) {
    reportFailure("Cannot delete the session", error);
  } finally {
    ui.deleteYes.disabled = false;
    ui.deleteConfirm.hidden = true;
  }
});

// A refusal (nothing to compact yet) comes as a `submission_rejected`
// event, shown once in the conversation.
ui.compact.addEventListener("click", async () => {
  ui.compact.disabled = true;
  try {
    await submitOp({ type: "compact" });
  } catch (error) {
    reportFailure("Cannot compact", error);
  } finally {
    ui.compact.disabled = false;
  }
});

// --- The sessions drawer (phone width) --------------------------------------


function setDrawer(open) {
  document.body.classList.toggle("sessions-open", open);
  ui.sessionsToggle.setAttribute("aria-expanded", String(open));
}

ui.sessionsToggle.addEventListener("click", () => {
  const open = !document.body.classList.contains("sessions-open");
  setDrawer(open);
  if (open) {
    ui.sessionsClose.focus();
  }
});
ui.sidebarBackdrop.addEventListener("click", () => setDrawer(false));
ui.sessionsClose.addEventListener("click", () => {
  setDrawer(false);
  ui.sessionsToggle.focus();
});

// --- The message box -------------------------------------------------------

// The idempotency key of the message being sent: kept while its text is
// unchanged, so sending again after a failure cannot submit it twice.
let draftKey = null;

ui.composerText.addEventListener("input", () => {
  draftKey = null;
  fitComposer();
});

/** Grows the message box with its text, up to a third of the screen. */
function fitComposer() {
  const box = ui.composerText;
  box.style.height = "auto";
  box.style.height = `${Math.min(box.scrollHeight + 2, Math.max(120, window.innerHeight / 3))}px`;
}

ui.composerText.addEventListener("keel-resize", fitComposer);

// A phone's screen has no room for the keys' hint (the shortcuts list has it).
function fitPlaceholder() {
  ui.composerText.placeholder = phone.matches ? "Message" : "Message (Enter sends, Shift+Enter starts a new line)";
}
phone.addEventListener("change", fitPlaceholder);
fitPlaceholder();

ui.composerText.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing && !event.altKey && !event.ctrlKey && !event.metaKey) {
    event.preventDefault();
    ui.composer.requestSubmit();
  }
});

ui.composer.addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = ui.composerText.value;
  if (!current || !text.trim() || ui.send.disabled) {
    return;
  }
  showError(ui.composerError, "");
  draftKey ??= newKey();
  ui.send.disabled = true;
  const sessionId = current.id;
  // What is sent is followed: the answer comes at the end.
  follower.follow({ scroll: true });
  try {
    await api(`${sessionPath(sessionId)}/submissions`, {
      method: "POST",
      body: { op: { type: "user_input", text }, on_busy: ui.busyPolicy.value },
      headers: { "Idempotency-Key": draftKey },
    });
    if (ui.composerText.value === text && current?.id === sessionId) {
      ui.composerText.value = "";
      drafts.save();
      fitComposer();
    }
    draftKey = null;
  } catch (error) {
    showError(ui.composerError, `Not sent: ${error.message}`);
    if (isModelRefusal(error)) {
      const session = current;
      offerModelSwitch(ui.modelRefusal, session.id, error, (switched) => {
        showError(ui.composerError, "");
        notify(`The session now uses ${switched.model}; send your message again.`);
        refreshListedSoon(switched.id);
      });
    }
  } finally {
    ui.send.disabled = false;
    ui.composerText.focus();
  }
});

// --- Routing ---------------------------------------------------------------

function route() {
  const match = /^#\/sessions\/(.+)$/.exec(location.hash);
  // At phone width the drawer makes way for the chosen session, and opens
  // when there is none to show.
  setDrawer(!match && phone.matches);
  if (match) {
    let id;
    try {
      id = decodeURIComponent(match[1]);
    } catch {
      id = match[1];
    }
    openSession(id);
  } else {
    closeSession();
  }
}

window.addEventListener("hashchange", route);
loadPrincipal();
route();
loadSessions();

// Another principal signed in (another tenant, other scopes): the list and
// the open session are shown again as it sees them.
onPrincipalChange(() => {
  loadSessions();
  if (current) {
    const id = current.id;
    closeSession();
    openSession(id);
  }
});

/**
 * What a message sent while a turn runs will get, from the chosen busy
 * policy and the session's queue mode (`merge`: queued messages share one
 * next turn; `each`: one answer per message).
 */
function showQueueHint() {
  const policy = ui.busyPolicy.value;
  const each = current?.queueMode === "each";
  ui.queueHint.dataset.queueMode = current?.queueMode ?? "";
  ui.queueHint.textContent = {
    queue: each ? "each waiting message gets its own answer" : "waiting messages are answered together, in one turn",
    interrupt: "stops the running answer, then answers this",
    steer: "joins the running turn",
  }[policy] ?? "";
}

ui.busyPolicy.addEventListener("change", showQueueHint);
