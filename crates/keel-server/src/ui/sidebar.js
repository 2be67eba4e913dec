// The session list's grouping by day of last activity (Today, Yesterday,
// Previous 7 days, Older), and the offer to switch the model of a session
// the server cannot load with its own (`session_model_unavailable`, or a
// script model over the server's ceiling after a restart).

import { api, sessionPath } from "./api.js";

/** The codes that mean "this session's model is not available here". */
const MODEL_REFUSALS = new Set(["session_model_unavailable", "script_model_over_ceiling"]);

/** Whether `error` (an ApiError) refuses a session because of its model. */
export function isModelRefusal(error) {
  return MODEL_REFUSALS.has(error?.code) && /not loaded|cannot be loaded/.test(error?.message ?? "");
}

const DAY_MS = 24 * 60 * 60 * 1000;

/** The group a time of last activity falls in, seen at `now`. */
export function dayGroup(ms, now = new Date()) {
  const midnight = new Date(now.getFullYear(), now.getMonth(), now.getDate()).getTime();
  if (ms >= midnight) {
    return "Today";
  }
  if (ms >= midnight - DAY_MS) {
    return "Yesterday";
  }
  if (ms >= midnight - 7 * DAY_MS) {
    return "Previous 7 days";
  }
  return "Older";
}

/**
 * Puts a heading before the first entry of each day group of `list`, whose
 * entries (most recently active first) carry `data-updated-at`. Headings
 * are `li`s without a session id, so code that walks the entries by
 * `data-session-id` passes them by.
 */
export function groupByDay(list, now = new Date()) {
  for (const heading of list.querySelectorAll(":scope > .day-heading")) {
    heading.remove();
  }
  let previous = null;
  for (const item of [...list.children]) {
    const group = dayGroup(Number(item.dataset.updatedAt), now);
    if (group !== previous) {
      const heading = document.createElement("li");
      heading.className = "day-heading";
      heading.dataset.testid = "day-heading";
      heading.setAttribute("role", "presentation");
      heading.textContent = group;
      item.before(heading);
      previous = group;
    }
  }
}

/** The models of the server (`GET /v1/models`), fetched once per page. */
let models = null;

export function serverModels() {
  models ??= api("/v1/models").catch((error) => {
    models = null;
    throw error;
  });
  return models;
}

/** Fills `select` with the server's models, the default chosen and marked. */
export async function fillModelPicker(select) {
  const list = await serverModels();
  select.replaceChildren(
    ...list.models.map((model) => {
      const option = document.createElement("option");
      option.value = model.spec;
      const what = model.model && model.model !== model.spec ? ` (${model.provider}: ${model.model})` : "";
      option.textContent = `${model.spec}${what}${model.default ? " · default" : ""}`;
      option.selected = model.default;
      return option;
    }),
  );
  return list;
}

/**
 * Shows, in `box`, why session `sessionId` cannot be loaded (`error`) and
 * a picker to switch its model; `onSwitched(session)` once it is switched.
 */
export async function offerModelSwitch(box, sessionId, error, onSwitched) {
  const why = document.createElement("p");
  why.dataset.testid = "model-refusal-message";
  why.textContent = `This session cannot run here: ${error.message}`;
  const label = document.createElement("label");
  label.textContent = "Switch its model to";
  const select = document.createElement("select");
  select.dataset.testid = "model-switch-picker";
  select.id = "model-switch-picker";
  label.htmlFor = select.id;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "primary";
  button.dataset.testid = "model-switch-submit";
  button.textContent = "Switch model";
  const failure = document.createElement("p");
  failure.className = "inline-error";
  failure.hidden = true;
  failure.dataset.testid = "model-switch-error";
  box.replaceChildren(why, label, select, button, failure);
  box.hidden = false;
  try {
    await fillModelPicker(select);
  } catch (listError) {
    failure.textContent = `Cannot list the server's models: ${listError.message}`;
    failure.hidden = false;
  }
  button.disabled = select.options.length === 0;
  button.addEventListener("click", async () => {
    button.disabled = true;
    failure.hidden = true;
    try {
      const session = await api(sessionPath(sessionId), { method: "PATCH", body: { model: select.value } });
      box.hidden = true;
      box.replaceChildren();
      onSwitched(session);
    } catch (patchError) {
      failure.textContent = `Not switched: ${patchError.message}`;
      failure.hidden = false;
      button.disabled = false;
    }
  });
}
