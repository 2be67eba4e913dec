// The page's keyboard shortcuts (listed in the shortcuts dialog):
// Esc closes the open panel or menu, or else interrupts the running turn;
// Ctrl/Cmd+Shift+O starts a new chat; "/" goes to the message box and "?"
// opens the list, both only when not typing somewhere.

/** Whether `target` is somewhere text is typed. */
function typing(target) {
  return Boolean(target?.closest?.("input, textarea, select, [contenteditable=''], [contenteditable=true]"));
}

/**
 * Installs the shortcuts. `closePanel()` closes the topmost open panel and
 * answers whether there was one; `interrupt()` interrupts the running turn
 * and answers whether one was; `newChat()`, `focusComposer()` and
 * `showHelp()` do what they say.
 */
export function installShortcuts({ closePanel, interrupt, newChat, focusComposer, showHelp }) {
  document.addEventListener("keydown", (event) => {
    if (event.defaultPrevented || event.isComposing) {
      return;
    }
    const modifier = event.ctrlKey || event.metaKey;
    if (modifier && event.shiftKey && !event.altKey && event.code === "KeyO") {
      event.preventDefault();
      newChat();
      return;
    }
    if (event.key === "Escape") {
      // A dialog closes by itself; an editor of its own (rename, a past
      // message) handles its Esc.
      if (document.querySelector("dialog[open]")) {
        return;
      }
      const own = event.target?.closest?.("form");
      if (own && own.id !== "composer") {
        return;
      }
      if (closePanel() || interrupt()) {
        event.preventDefault();
      }
      return;
    }
    if (modifier || event.altKey || typing(event.target) || document.querySelector("dialog[open]")) {
      return;
    }
    if (event.key === "/") {
      event.preventDefault();
      focusComposer();
    } else if (event.key === "?") {
      event.preventDefault();
      showHelp();
    }
  });
}
