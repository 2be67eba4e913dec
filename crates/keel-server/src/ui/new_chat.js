// The "New chat" action: a dialog holding the new-session form, whose model
// field offers the server's models (GET /v1/models, the default shown), the
// bot id and instructions folded under "More options". The form's submit
// handler is app.js's; this module opens and closes the dialog.

import { can } from "./principal.js";
import { serverModels } from "./sidebar.js";

const dialog = document.getElementById("new-chat-dialog");
const open = document.getElementById("new-chat");
const cancel = document.getElementById("new-chat-cancel");
const model = document.getElementById("new-model");
const choices = document.getElementById("new-model-choices");
const defaultHint = document.getElementById("new-model-default");

/** Offers the server's models in the model field, the default as its hint. */
async function offerModels() {
  try {
    const list = await serverModels();
    choices.replaceChildren(
      ...list.models.map((entry) => {
        const option = document.createElement("option");
        option.value = entry.spec;
        option.label = entry.default ? `${entry.provider ?? ""} · default`.trim() : (entry.provider ?? "");
        return option;
      }),
    );
    model.placeholder = list.default ? `${list.default} (the server's default)` : "a model spec (no default)";
    defaultHint.textContent = list.default ? `Default: ${list.default}` : "This server has no default model.";
    defaultHint.dataset.default = list.default ?? "";
  } catch {
    defaultHint.textContent = "";
  }
}

/** Opens the dialog, the model field first (a principal that may submit only). */
export function openNewChat() {
  if (!can("submit")) {
    return;
  }
  if (!dialog.open) {
    dialog.showModal();
  }
  offerModels();
  model.focus();
}

/** Closes the dialog (after a session was created, or on Cancel). */
export function closeNewChat() {
  if (dialog.open) {
    dialog.close();
  }
}

open.addEventListener("click", openNewChat);
cancel.addEventListener("click", closeNewChat);
