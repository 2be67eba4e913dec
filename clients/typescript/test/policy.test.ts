// The pure parts: backoff bounds, Retry-After, and which error class each
// documented code gets.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  BudgetExhaustedError,
  CeilingError,
  ConflictError,
  DEFAULT_RETRY,
  ForbiddenError,
  IdempotencyKeyReusedError,
  InternalError,
  InvalidRequestError,
  KeelError,
  NotFoundError,
  QueueFullError,
  SessionBusyError,
  UnauthorizedError,
  UnavailableError,
  WorkspaceError,
  backoffDelay,
  errorFromBody,
  parseRetryAfter,
} from "@keel/client";

test("backoff doubles from the base, stays under the cap and at least at half its ceiling", () => {
  const policy = { maxAttempts: 10, baseDelayMs: 100, maxDelayMs: 1000 };
  assert.equal(backoffDelay(1, policy, undefined, () => 0), 50);
  assert.equal(backoffDelay(1, policy, undefined, () => 1), 100);
  assert.equal(backoffDelay(3, policy, undefined, () => 1), 400);
  assert.equal(backoffDelay(9, policy, undefined, () => 1), 1000);
  assert.equal(backoffDelay(40, policy, undefined, () => 0), 500);
});

test("a server's Retry-After wins over a shorter backoff, up to a minute", () => {
  assert.equal(backoffDelay(1, DEFAULT_RETRY, 3000, () => 0), 3000);
  assert.equal(backoffDelay(1, DEFAULT_RETRY, 3_600_000, () => 0), 60_000);
  assert.equal(backoffDelay(1, DEFAULT_RETRY, 0, () => 1), DEFAULT_RETRY.baseDelayMs);
});

test("Retry-After is read as seconds or as an HTTP date", () => {
  assert.equal(parseRetryAfter("2"), 2000);
  assert.equal(parseRetryAfter(" 0 "), 0);
  const now = Date.parse("2026-01-01T00:00:00Z");
  assert.equal(parseRetryAfter("Thu, 01 Jan 2026 00:00:05 GMT", now), 5000);
  assert.equal(parseRetryAfter("Wed, 31 Dec 2025 00:00:00 GMT", now), 0);
  assert.equal(parseRetryAfter(null), undefined);
  assert.equal(parseRetryAfter("soon"), undefined);
});

test("each documented code has its class; an unknown code the base one", () => {
  const cases: [string, number, new (...args: never[]) => KeelError][] = [
    ["invalid_request", 400, InvalidRequestError],
    ["too_large", 413, InvalidRequestError],
    ["unauthorized", 401, UnauthorizedError],
    ["tool_over_ceiling", 403, CeilingError],
    ["not_found", 404, NotFoundError],
    ["conflict", 409, ConflictError],
    ["session_busy", 409, SessionBusyError],
    ["queue_full", 409, QueueFullError],
    ["workspace_exists", 409, WorkspaceError],
    ["idempotency_key_reused", 409, IdempotencyKeyReusedError],
    ["store_unavailable", 503, UnavailableError],
  ];
  for (const [code, status, Class] of cases) {
    const error = errorFromBody(status, { error: { code, message: "m" } });
    assert.ok(error instanceof Class, code);
    assert.ok(error instanceof KeelError, code);
    assert.equal(error.code, code);
    assert.equal(error.status, status);
    assert.equal(error.message, "m");
  }
  const unknown = errorFromBody(418, { error: { code: "teapot", message: "short and stout" } });
  assert.equal(unknown.constructor, KeelError);
  assert.equal(unknown.code, "teapot");
  const shapeless = errorFromBody(502, undefined);
  assert.equal(shapeless.constructor, KeelError);
  assert.equal(shapeless.code, "unknown");
  assert.ok(errorFromBody(409, { error: { code: "session_busy", message: "" } }) instanceof ConflictError);
});

/** Every error code the OpenAPI document declares, with the statuses it is declared under. */
function documentedCodes(): Map<string, Set<string>> {
  const path = new URL("../../../../docs/openapi.json", import.meta.url);
  const document = JSON.parse(readFileSync(path, "utf8")) as {
    paths: Record<string, Record<string, { responses?: Record<string, unknown> }>>;
  };
  const codes = new Map<string, Set<string>>();
  for (const item of Object.values(document.paths)) {
    for (const operation of Object.values(item)) {
      for (const [status, response] of Object.entries(operation.responses ?? {})) {
        // The shared ErrorBody, its `code` narrowed to the answer's codes.
        const error = (response as any)?.content?.["application/json"]?.schema?.properties?.error;
        const narrowed = (error?.allOf ?? []).find((part: any) => part?.properties?.code);
        const code = narrowed?.properties?.code;
        for (const each of (code?.enum ?? []) as string[]) {
          codes.set(each, (codes.get(each) ?? new Set()).add(status));
        }
      }
    }
  }
  return codes;
}

test("every code the OpenAPI document declares has a class of its status's family", () => {
  const families: Record<string, new (...args: never[]) => KeelError> = {
    "400": InvalidRequestError,
    "401": UnauthorizedError,
    "403": ForbiddenError,
    "404": NotFoundError,
    "405": InvalidRequestError,
    "408": InvalidRequestError,
    "409": ConflictError,
    "413": InvalidRequestError,
    "415": InvalidRequestError,
    "421": InvalidRequestError,
    "429": BudgetExhaustedError,
    "500": InternalError,
    "503": UnavailableError,
  };
  const codes = documentedCodes();
  assert.ok(codes.size >= 20, `the document declares ${codes.size} codes`);
  for (const [code, statuses] of codes) {
    for (const status of statuses) {
      const error = errorFromBody(Number(status), { error: { code, message: "m" } });
      assert.notEqual(error.constructor, KeelError, `${code} has a class of its own family`);
      const family = families[status];
      assert.ok(family !== undefined, `a family for status ${status} (${code})`);
      assert.ok(error instanceof family, `${code} (${status}) is a ${family.name}`);
    }
  }
});
