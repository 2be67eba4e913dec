// Who the page acts as: after sign-in it asks the server (GET /v1/whoami)
// and shows the tenant and the key's or token's name in the header. What
// the principal's scopes forbid is hidden: elements marked
// `data-needs="submit"` (or approve, admin) are not shown without that
// scope, and those marked `data-lacks="…"` are shown only then, by the
// classes this module puts on <body> (principal.css). The server refuses
// the same requests anyway; hiding them spares the user a button that can
// only fail.
//
// Until the server has answered, <body> has the class `scopes-pending` and
// nothing that needs a scope is shown, so no Approve button flashes up for a
// read-only key.

import { api, ApiError, currentToken, forgetToken, onSignIn } from "./api.js";

/** Every scope, in order. */
export const SCOPES = ["read", "submit", "approve", "admin"];

/** What a server without `GET /v1/whoami` answers to: its one token is the operator. */
const OPERATOR = { tenant: null, principal_id: "operator", kind: "operator", name: null, scopes: SCOPES };

let viewer = null;
let settle = null;
const changeListeners = [];

/** Calls `listener()` when a principal other than the one shown signs in. */
export function onPrincipalChange(listener) {
  changeListeners.push(listener);
}
/** Resolves once the principal is known the first time (or could not be). */
export const principalReady = new Promise((resolve) => {
  settle = resolve;
});

/** The principal the page acts as, or null before the server said. */
export function currentPrincipal() {
  return viewer;
}

/** Whether the page may do what needs `scope` (true until the server said otherwise). */
export function can(scope) {
  return !viewer || viewer.scopes.includes(scope);
}

/** Whether `actor` (a `submitted_by` or `decided_by`) is the page's own principal. */
export function isViewer(actor) {
  return Boolean(viewer) && actor.kind === viewer.kind && actor.principal_id === viewer.principal_id;
}

/**
 * How `actor` is named in the conversation, or null when it is the page's
 * own principal (shown as "You"). The tenant is added when it is not the
 * viewer's own (the operator sees every tenant).
 */
export function actorLabel(actor) {
  if (!actor || !viewer || isViewer(actor)) {
    return null;
  }
  if (actor.kind === "operator") {
    return "The operator";
  }
  const name = actor.name ?? actor.principal_id;
  return viewer.tenant === actor.tenant ? name : `${name} (${actor.tenant})`;
}

function show(who) {
  const previous = viewer;
  viewer = { ...who, scopes: Array.isArray(who.scopes) ? who.scopes : [] };
  const body = document.body;
  body.classList.remove("scopes-pending");
  for (const scope of SCOPES) {
    body.classList.toggle(`lacks-${scope}`, !viewer.scopes.includes(scope));
  }
  body.dataset.principalKind = viewer.kind;
  const badge = document.getElementById("principal");
  if (viewer.tenant === null || viewer.tenant === undefined) {
    badge.textContent = viewer.kind === "operator" ? "Operator" : (viewer.name ?? viewer.principal_id);
  } else {
    badge.textContent = `Tenant ${viewer.tenant} · ${viewer.name ?? viewer.principal_id}`;
  }
  badge.dataset.tenant = viewer.tenant ?? "";
  badge.title = `Scopes: ${viewer.scopes.join(", ") || "none"}`;
  badge.hidden = false;
  document.getElementById("sign-out").hidden = !currentToken();
  if (previous && !isViewer(previous)) {
    for (const listener of changeListeners) {
      listener();
    }
  }
}

/** Asks the server who the page is, and shows it. */
export async function loadPrincipal() {
  try {
    show(await api("/v1/whoami"));
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      show(OPERATOR);
    } else if (!(error instanceof ApiError && error.status === 401)) {
      // The server is away: show everything, it refuses what it must.
      document.body.classList.remove("scopes-pending");
    }
  } finally {
    settle();
  }
}

document.getElementById("sign-out").addEventListener("click", () => {
  forgetToken();
  location.reload();
});

// A new credential may be another tenant's, with other scopes.
onSignIn(() => {
  loadPrincipal();
});
