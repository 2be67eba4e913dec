// The chat view's panels and the keyboard: the event timeline (closed by
// default; a side column on a wide screen, a sheet over the conversation on
// a phone), the session's menu of secondary actions, the list of keyboard
// shortcuts, and what Esc closes.

import { installShortcuts } from "./shortcuts.js";

/**
 * Wires the panels. `ui` holds the page's elements, `phone` the phone-width
 * media query, `setDrawer(open)` opens or closes the sessions drawer,
 * `hasSession()` says whether a session is shown and `interrupt()`
 * interrupts its running turn (answering whether one ran). Answers
 * `{ setTimeline, closeMenu }`.
 */
export function installPanels({ ui, phone, setDrawer, hasSession, interrupt }) {
  function setTimeline(open) {
    ui.timeline.hidden = !open;
    ui.chatView.classList.toggle("events-open", open);
    ui.eventsToggle.setAttribute("aria-expanded", String(open));
    if (open) {
      // Closed, the list was not kept at its end: it opens there.
      ui.timelineList.scrollTop = ui.timelineList.scrollHeight;
    }
  }

  ui.eventsToggle.addEventListener("click", () => setTimeline(ui.timeline.hidden));
  ui.timelineClose.addEventListener("click", () => {
    setTimeline(false);
    ui.eventsToggle.focus();
  });

  function closeMenu() {
    ui.sessionMenu.open = false;
  }

  // A choice closes the menu; so does a click or a tap anywhere else.
  ui.sessionMenu.querySelector(".menu-items").addEventListener("click", (event) => {
    if (event.target.closest("button")) {
      closeMenu();
    }
  });
  document.addEventListener("pointerdown", (event) => {
    if (ui.sessionMenu.open && !ui.sessionMenu.contains(event.target)) {
      closeMenu();
    }
  });

  function showShortcuts() {
    if (!ui.shortcutsDialog.open) {
      ui.shortcutsDialog.showModal();
    }
  }

  ui.showShortcuts.addEventListener("click", showShortcuts);
  ui.shortcutsHint.addEventListener("click", showShortcuts);

  /** Closes the topmost open panel; answers whether one was open. */
  function closePanel() {
    if (ui.sessionMenu.open) {
      closeMenu();
      ui.sessionMenu.querySelector("summary").focus();
      return true;
    }
    // With no session shown, a phone's drawer is the page itself.
    if (document.body.classList.contains("sessions-open") && (hasSession() || !phone.matches)) {
      setDrawer(false);
      return true;
    }
    if (!ui.timeline.hidden) {
      setTimeline(false);
      return true;
    }
    if (!ui.deleteConfirm.hidden) {
      ui.deleteConfirm.hidden = true;
      return true;
    }
    return false;
  }

  /**
   * Starts a new chat: a control marked `data-shortcut="new-chat"` if the
   * page has one, else the new-session form (in its drawer on a phone).
   */
  function newChat() {
    const action = document.querySelector('[data-shortcut="new-chat"]');
    if (action) {
      action.click();
      return;
    }
    if (phone.matches) {
      setDrawer(true);
    }
    ui.newForm?.querySelector("input, textarea, button")?.focus();
  }

  installShortcuts({
    closePanel,
    interrupt,
    newChat,
    focusComposer: () => {
      if (!ui.chatView.hidden) {
        ui.composerText.focus();
      }
    },
    showHelp: showShortcuts,
  });

  return { setTimeline, closeMenu };
}
