// The HTTP API of keel serve (docs/http-api.md), as the page uses it: JSON
// requests with the bearer credential, and the URL of a session's event
// stream.
//
// The credential (an API key, a JWT or the server's token) lives in
// sessionStorage, never in the page's URL. When the API answers 401 the page
// asks for it once (one prompt, however many requests were refused at the
// same time), keeps it, and retries the refused requests. A credential that
// worked and is now refused (a revoked key, an expired JWT) is asked for
// again with a message saying so.

const TOKEN_KEY = "keel.token";

/** An error answer of the API: HTTP status, machine code, human message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

/** The token the page holds, or null. */
export function currentToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

function storeToken(token) {
  try {
    if (token) {
      sessionStorage.setItem(TOKEN_KEY, token);
    } else {
      sessionStorage.removeItem(TOKEN_KEY);
    }
  } catch {
    // Storage refused (a private window): the token lives as long as the page.
  }
  memoryToken = token;
}

let memoryToken = null;
// The last credential the server accepted: a refusal of that one means it
// was revoked or expired, not mistyped.
let acceptedToken = null;
// Who hears of a new credential given at the prompt.
const signInListeners = [];

/** Calls `listener()` each time the user gives a new credential. */
export function onSignIn(listener) {
  signInListeners.push(listener);
}

/** Forgets the credential the page holds. */
export function forgetToken() {
  storeToken(null);
  acceptedToken = null;
}

function token() {
  return currentToken() ?? memoryToken;
}

// How the page asks for a token: a function (message) => Promise<string>
// that rejects when the user declines. Set by the page.
let prompt = null;
// The question being asked, shared by every request that needs its answer.
let asking = null;

/** Sets how the page asks the user for a token. */
export function setTokenPrompt(ask) {
  prompt = ask;
}

/** What the prompt says after `refused` (null: nothing was sent) was refused. */
function refusalMessage(refused) {
  if (!refused) {
    return "This server needs an access token: an API key, a JWT from your identity provider, or the server's token.";
  }
  if (refused === acceptedToken) {
    return "The server no longer accepts your key or token: it may have been revoked or have expired. Sign in again.";
  }
  return "The server refused that key or token. Enter the right one.";
}

/**
 * A token other than `refused` (the one a request was just refused with):
 * the one another request already got, or the user's answer.
 */
function tokenAfterRefusal(refused) {
  const held = token();
  if (held && held !== refused) {
    return Promise.resolve(held);
  }
  if (!asking) {
    if (!prompt) {
      return Promise.reject(new ApiError(401, "unauthorized", "this server needs a token"));
    }
    storeToken(null);
    asking = prompt(refusalMessage(refused))
      .then((given) => {
        storeToken(given);
        for (const listener of signInListeners) {
          listener();
        }
        return given;
      })
      .finally(() => {
        asking = null;
      });
  }
  return asking;
}

/**
 * Calls the API: `path` under the page's origin, a JSON `body` when given.
 * Answers the parsed JSON body; throws ApiError for an error answer.
 */
export async function api(path, { method = "GET", body, headers = {} } = {}) {
  for (;;) {
    const sent = token();
    const requestHeaders = { Accept: "application/json", ...headers };
    if (sent) {
      requestHeaders.Authorization = `Bearer ${sent}`;
    }
    if (body !== undefined) {
      requestHeaders["Content-Type"] = "application/json";
    }
    let response;
    try {
      response = await fetch(path, {
        method,
        headers: requestHeaders,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
      });
    } catch (error) {
      throw new ApiError(0, "network", `cannot reach the server (${error.message})`);
    }
    if (response.status === 401) {
      await tokenAfterRefusal(sent);
      continue;
    }
    // Only a success proves the credential: an unknown route can answer
    // 404 before any credential is checked.
    if (sent && response.ok) {
      acceptedToken = sent;
    }
    const text = await response.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    if (!response.ok) {
      const error = json?.error ?? {};
      throw new ApiError(
        response.status,
        error.code ?? "http_error",
        error.message ?? `the server answered ${response.status} ${response.statusText}`,
      );
    }
    return json;
  }
}

/** A path segment for a session id. */
export function sessionPath(sessionId) {
  return `/v1/sessions/${encodeURIComponent(sessionId)}`;
}

/**
 * The URL of a session's event stream after `after`. EventSource cannot send
 * headers, so the token goes in the query.
 */
export function streamUrl(sessionId, after) {
  const query = new URLSearchParams({ after: String(after) });
  const held = token();
  if (held) {
    query.set("access_token", held);
  }
  return `${sessionPath(sessionId)}/events/stream?${query}`;
}

/** A fresh idempotency key for a submission. */
export function newKey() {
  if (globalThis.crypto?.randomUUID) {
    return crypto.randomUUID();
  }
  // Outside a secure context: random enough to tell retries apart.
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}
