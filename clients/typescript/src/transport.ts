// One place where requests are made: the base URL and token, the API
// version check of every answer, error bodies turned into typed errors, and
// retries of the requests that are safe to repeat.

import { ApiVersionMismatchError, KeelConnectionError, KeelError, errorFromBody } from "./errors.js";
import { API_VERSION } from "./generated/version.js";
import { DEFAULT_RETRY, type RetryPolicy, backoffDelay, parseRetryAfter, sleep } from "./retry.js";

/** The header every API answer carries: the version of the API the server speaks. */
export const VERSION_HEADER = "keel-api-version";

/** What a `Keel` client is made with. */
export interface KeelOptions {
  /** The server's base URL, such as `http://127.0.0.1:7777`. */
  baseUrl: string;
  /** The bearer token (the content of the server's `--token-file`), when the server has one. */
  token?: string | undefined;
  /** Retries of submissions and reads (network errors and `503`s); see `RetryPolicy`. */
  retry?: Partial<RetryPolicy> | undefined;
  /** The `fetch` to use; the platform's by default. */
  fetch?: typeof fetch | undefined;
}

/** A request, relative to the base URL. */
export interface RequestSpec {
  method: "GET" | "POST" | "PATCH" | "DELETE";
  /** The path, starting with `/v1/`; its parts already encoded. */
  path: string;
  query?: Record<string, string | number | boolean | undefined> | undefined;
  /** A JSON body. */
  body?: unknown;
  headers?: Record<string, string> | undefined;
  signal?: AbortSignal | undefined;
  /**
   * Whether the request may be sent again after a network error that may
   * have come after the server got it (a cut connection, a lost answer).
   * Requests that never reached the server (a refused connect) and `503`s
   * (nothing was done) are retried whatever this says.
   */
  resend?: boolean | undefined;
}

/** Encodes one path segment (a session id may hold any character but control ones). */
export function segment(value: string): string {
  return encodeURIComponent(value);
}

/** The major version of a `MAJOR.MINOR.PATCH` string, or `undefined`. */
function major(version: string): string | undefined {
  return /^\s*(\d+)\.\d+(\.\d+)?/.exec(version)?.[1];
}

/** Throws `ApiVersionMismatchError` unless `response` says it speaks this client's major version. */
export function checkVersion(response: Response): void {
  const version = response.headers.get(VERSION_HEADER);
  if (version === null || major(version) === undefined || major(version) !== major(API_VERSION)) {
    throw new ApiVersionMismatchError(version, API_VERSION);
  }
}

/** Whether an error from `fetch` is the caller's abort rather than the network's failure. */
function aborted(signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true;
}

/** Sends requests to one server. */
export class Transport {
  readonly baseUrl: string;
  readonly retry: RetryPolicy;
  private readonly token: string | undefined;
  private readonly fetch: typeof fetch;

  constructor(options: KeelOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.token = options.token;
    this.retry = { ...DEFAULT_RETRY, ...options.retry };
    // Bound to the global object: browsers refuse a `fetch` called on another `this`.
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** The URL of `path` with `query`. */
  url(path: string, query?: RequestSpec["query"]): string {
    const url = new URL(this.baseUrl + path);
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value !== undefined) {
        url.searchParams.set(name, String(value));
      }
    }
    return url.toString();
  }

  /** The headers of every request: the token, and the JSON type when there is a body. */
  headers(extra?: Record<string, string>, json = false): Headers {
    const headers = new Headers(extra);
    if (this.token !== undefined) {
      headers.set("Authorization", `Bearer ${this.token}`);
    }
    if (json) {
      headers.set("Content-Type", "application/json");
    }
    return headers;
  }

  /**
   * Sends `spec` and returns the answer's JSON (`undefined` for an empty
   * body). An error answer throws its `KeelError`; a `503`, a connect that
   * failed, and with `spec.resend` any network error (the body's included),
   * is retried by the client's policy first.
   */
  json<T>(spec: RequestSpec): Promise<T> {
    return this.request(spec, async (response) => {
      let text: string;
      try {
        text = await response.text();
      } catch (error) {
        if (aborted(spec.signal)) {
          throw error;
        }
        throw new KeelConnectionError(`the answer from ${this.baseUrl} was cut: ${describe(error)}`, { cause: error });
      }
      return (text === "" ? undefined : JSON.parse(text)) as T;
    });
  }

  /** Sends `spec` and returns the successful answer with its body unread (see `json`). */
  send(spec: RequestSpec): Promise<Response> {
    return this.request(spec, (response) => Promise.resolve(response));
  }

  /** Sends `spec` and reads a successful answer with `read`, retrying both as `spec.resend` allows. */
  private async request<T>(spec: RequestSpec, read: (response: Response) => Promise<T>): Promise<T> {
    const attempts = Math.max(1, this.retry.maxAttempts);
    for (let attempt = 1; ; attempt++) {
      let retryAfterMs: number | undefined;
      try {
        return await read(await this.once(spec));
      } catch (error) {
        const retryable =
          (error instanceof KeelConnectionError && (error.beforeSending || spec.resend === true)) ||
          (error instanceof KeelError && error.status === 503);
        if (!retryable || attempt >= attempts || aborted(spec.signal)) {
          throw error;
        }
        retryAfterMs = error instanceof KeelError ? error.retryAfterMs : undefined;
      }
      await sleep(backoffDelay(attempt, this.retry, retryAfterMs), spec.signal);
    }
  }

  /** One attempt: the answer when it is a success, else its error. */
  async once(spec: RequestSpec): Promise<Response> {
    const hasBody = spec.body !== undefined;
    let response: Response;
    try {
      response = await this.fetch(this.url(spec.path, spec.query), {
        method: spec.method,
        headers: this.headers(spec.headers, hasBody),
        body: hasBody ? JSON.stringify(spec.body) : null,
        signal: spec.signal ?? null,
      });
    } catch (error) {
      if (aborted(spec.signal)) {
        throw error;
      }
      throw new KeelConnectionError(`cannot reach ${this.baseUrl}: ${describe(error)}`, {
        cause: error,
        beforeSending: connectFailed(error),
      });
    }
    checkVersion(response);
    if (response.ok) {
      return response;
    }
    let body: unknown;
    try {
      body = JSON.parse(await response.text());
    } catch {
      body = undefined;
    }
    throw errorFromBody(response.status, body, parseRetryAfter(response.headers.get("Retry-After")));
  }
}

/** Causes (Node's) that mean the connection was never made, so the server got nothing. */
const CONNECT_FAILURES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);

/**
 * Whether `error` (from `fetch`) says the connection was never made.
 * Browsers do not say why a fetch failed, so there every failure counts as
 * one that may have reached the server.
 */
function connectFailed(error: unknown): boolean {
  const cause = error instanceof Error ? (error.cause as { code?: unknown } | undefined) : undefined;
  return typeof cause?.code === "string" && CONNECT_FAILURES.has(cause.code);
}

/** A network error's message with its cause (undici hides the reason there). */
export function describe(error: unknown): string {
  if (!(error instanceof Error)) {
    return String(error);
  }
  const cause = error.cause instanceof Error ? `: ${error.cause.message}` : "";
  return `${error.message}${cause}`;
}
