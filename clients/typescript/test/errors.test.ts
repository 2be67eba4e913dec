// The server's error codes arrive as typed errors, and a server of another
// major API version (or one that does not say) is refused.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  ApiVersionMismatchError,
  ConflictError,
  IdempotencyKeyReusedError,
  InvalidRequestError,
  Keel,
  KeelError,
  NotFoundError,
  SessionBusyError,
  UnauthorizedError,
  isEvent,
} from "@keel/client";

import { Proxy } from "./support/proxy.js";
import { KeelServer } from "./support/server.js";

let server: KeelServer;
let keel: Keel;

before(async () => {
  server = await KeelServer.start();
  keel = new Keel({ baseUrl: server.baseUrl, token: server.token });
});

after(async () => {
  await server.stop();
});

/** Asserts that `promise` rejects with an instance of `Class` with `status` and `code`. */
async function refused(promise: Promise<unknown>, Class: typeof KeelError, status: number, code: string) {
  await assert.rejects(promise, (error: unknown) => {
    assert.ok(error instanceof Class, `${String(error)} is a ${Class.name}`);
    assert.ok(error instanceof KeelError);
    assert.equal(error.status, status);
    assert.equal(error.code, code);
    assert.ok(error.message.length > 0);
    return true;
  });
}

test("404 not_found", async () => {
  await refused(keel.sessions.get("no-such-session"), NotFoundError, 404, "not_found");
  await refused(keel.say("no-such-session", "Hi"), NotFoundError, 404, "not_found");
});

test("401 unauthorized, with a wrong token or none", async () => {
  const wrong = new Keel({ baseUrl: server.baseUrl, token: "wrong" });
  await refused(wrong.sessions.list(), UnauthorizedError, 401, "unauthorized");
  const none = new Keel({ baseUrl: server.baseUrl });
  await refused(none.sessions.create(), UnauthorizedError, 401, "unauthorized");
});

test("409 session_busy, conflict and idempotency_key_reused, 400 invalid_request", async () => {
  const model = await server.script("busy.jsonl", [
    { tool_calls: [{ id: "hold", name: "write_file", arguments: { path: "held.txt", content: "x" } }] },
    { text: "Done." },
  ]);
  const session = await keel.sessions.create({ id: "busy", model, tools: { shell: false }, approvals: { default: "ask" } });
  await refused(keel.sessions.create({ id: "busy" }), ConflictError, 409, "conflict");

  const first = await keel.say(session.id, "Hold the turn", { idempotencyKey: "key-1" });
  for await (const event of keel.stream(session.id, { after: first.sequence })) {
    if (isEvent(event, "approval_requested")) break;
  }
  await refused(keel.say(session.id, "Now!", { onBusy: "reject" }), SessionBusyError, 409, "session_busy");

  const again = await keel.say(session.id, "Hold the turn", { idempotencyKey: "key-1" });
  assert.deepEqual(again, { ...first, duplicate: true }, "the same key and body answer as the first time");
  await refused(
    keel.say(session.id, "Another body", { idempotencyKey: "key-1" }),
    IdempotencyKeyReusedError,
    409,
    "idempotency_key_reused",
  );

  const past = keel.stream(session.id, { after: 1_000_000 });
  await refused(
    (async () => {
      for await (const _ of past) break;
    })(),
    InvalidRequestError,
    400,
    "invalid_request",
  );
  await keel.approve(session.id, "hold", "deny");
});

/** The answers of `proxy` with header `keel-api-version` set to `version` (removed when `null`). */
function serverVersion(proxy: Proxy, version: string | null): void {
  proxy.rules = {
    headers: (headers) => {
      if (version === null) delete headers["keel-api-version"];
      else headers["keel-api-version"] = version;
    },
  };
}

test("a server of another major version, or without a version, is refused", async () => {
  const proxy = await Proxy.start(server.baseUrl);
  try {
    const client = new Keel({ baseUrl: proxy.baseUrl, token: server.token });
    serverVersion(proxy, "2.0.0");
    await assert.rejects(client.sessions.list(), (error: unknown) => {
      assert.ok(error instanceof ApiVersionMismatchError);
      assert.equal(error.serverVersion, "2.0.0");
      assert.match(error.message, /2\.0\.0/);
      return true;
    });
    await assert.rejects(
      (async () => {
        for await (const _ of client.stream("busy")) break;
      })(),
      ApiVersionMismatchError,
    );
    serverVersion(proxy, null);
    await assert.rejects(client.sessions.get("busy"), (error: unknown) => {
      assert.ok(error instanceof ApiVersionMismatchError);
      assert.equal(error.serverVersion, null);
      return true;
    });
    serverVersion(proxy, "0.9.0");
    await assert.rejects(client.sessions.get("no-such-session"), ApiVersionMismatchError, "checked before the error body");
    serverVersion(proxy, "1.99.7");
    assert.equal((await client.sessions.get("busy")).id, "busy", "a newer minor version is fine");
  } finally {
    await proxy.stop();
  }
});
