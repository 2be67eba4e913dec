// The message box's drafts, one per session: what was typed in one session
// stays with it (kept in sessionStorage, so a reload keeps it too) and never
// shows up in another session's box, a fork's included.

const PREFIX = "keel.draft.";

function read(sessionId) {
  try {
    return sessionStorage.getItem(PREFIX + sessionId) ?? "";
  } catch {
    return "";
  }
}

function write(sessionId, text) {
  try {
    if (text) {
      sessionStorage.setItem(PREFIX + sessionId, text);
    } else {
      sessionStorage.removeItem(PREFIX + sessionId);
    }
  } catch {
    // Storage full or refused: the draft lives as long as the page.
  }
}

export class Drafts {
  /** `box` is the message box (a textarea). */
  constructor(box) {
    this.box = box;
    this.sessionId = null;
    box.addEventListener("input", () => this.save());
  }

  /** Keeps the box's text as the draft of the session it belongs to. */
  save() {
    if (this.sessionId !== null) {
      write(this.sessionId, this.box.value);
    }
  }

  /** Shows `sessionId`'s draft (none for `null`), keeping the one shown before. */
  switchTo(sessionId) {
    if (sessionId === this.sessionId) {
      return;
    }
    this.save();
    this.sessionId = sessionId;
    this.box.value = sessionId === null ? "" : read(sessionId);
    this.box.dispatchEvent(new Event("keel-resize"));
  }
}
