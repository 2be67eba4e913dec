// A submission whose answer is lost with its connection (the server stored
// it and answered 202; a proxy drops the connection before the client reads
// the answer) is sent again with the same Idempotency-Key, and queued once.

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, before, test } from "node:test";

import { Keel, KeelConnectionError } from "@keel/client";

import { wholeLog } from "./support/events.js";
import { Proxy } from "./support/proxy.js";
import { KeelServer } from "./support/server.js";

let server: KeelServer;
let proxy: Proxy;

before(async () => {
  server = await KeelServer.start();
  proxy = await Proxy.start(server.baseUrl);
});

after(async () => {
  await proxy.stop();
  await server.stop();
});

test("a submission retried after a dropped connection is queued once", async () => {
  const model = await server.script("retry.jsonl", [{ text: "Answered once." }]);
  const keel = new Keel({ baseUrl: proxy.baseUrl, token: server.token });
  const session = await keel.sessions.create({ model });
  let drops = 1;
  proxy.rules = {
    dropAnswer: (request) => request.method === "POST" && request.url?.endsWith("/submissions") === true && drops-- > 0,
  };

  const accepted = await keel.say(session.id, "Only once, please");
  proxy.rules = {};

  assert.equal(proxy.dropped.length, 1);
  assert.match(proxy.dropped[0] ?? "", /submissions 202$/, "the server had answered the dropped request");
  const posts = proxy.seen.filter((line) => line.startsWith("POST") && line.endsWith("/submissions"));
  assert.equal(posts.length, 2, "the client sent it again");
  assert.equal(proxy.keys.length, 2);
  assert.equal(proxy.keys[0], proxy.keys[1], "with the same key");
  assert.equal(accepted.duplicate, true, "the server knew the retry");

  const turn = await keel.waitForTurn(session.id, accepted, { timeoutMs: 30_000 });
  assert.equal(turn.text, "Answered once.");
  const log = await wholeLog(keel, session.id);
  const queued = log.filter((event) => event.msg.type === "submission_queued");
  assert.equal(queued.length, 1, "queued once");
  assert.equal(queued[0]?.submission_id, accepted.submission_id);
  assert.equal(queued[0]?.sequence, accepted.sequence);
  assert.equal(log.filter((event) => event.msg.type === "user_message").length, 1);
  assert.equal(log.filter((event) => event.msg.type === "turn_started").length, 1);
});

test("retries are bounded: a server that never answers ends in KeelConnectionError", async () => {
  const model = await server.script("never.jsonl", [{ text: "Never seen." }]);
  const keel = new Keel({
    baseUrl: proxy.baseUrl,
    token: server.token,
    retry: { maxAttempts: 3, baseDelayMs: 10, maxDelayMs: 20 },
  });
  const session = await keel.sessions.create({ model });
  const before = proxy.dropped.length;
  proxy.rules = { dropAnswer: (request) => request.method === "POST" && request.url?.endsWith("/submissions") === true };
  await assert.rejects(keel.say(session.id, "Lost every time"), KeelConnectionError);
  proxy.rules = {};
  assert.equal(proxy.dropped.length - before, 3, "three attempts in all");
  const log = await wholeLog(keel, session.id);
  assert.equal(log.filter((event) => event.msg.type === "submission_queued").length, 1, "all three were one submission");
});

test("an interrupt of whatever runs is not resent after a lost answer; one of a named turn is", async () => {
  const keel = new Keel({
    baseUrl: proxy.baseUrl,
    token: server.token,
    retry: { maxAttempts: 3, baseDelayMs: 10, maxDelayMs: 20 },
  });
  const session = await keel.sessions.create();
  const posts = () => proxy.seen.filter((line) => line.startsWith("POST") && line.endsWith("/submissions")).length;
  proxy.rules = { dropAnswer: (request) => request.method === "POST" && request.url?.endsWith("/submissions") === true };
  try {
    let before = posts();
    await assert.rejects(keel.interrupt(session.id), (error: unknown) => {
      assert.ok(error instanceof KeelConnectionError);
      assert.equal(error.beforeSending, false, "the server got it");
      return true;
    });
    assert.equal(posts() - before, 1, "sent once: a copy could stop later work");
    before = posts();
    await assert.rejects(keel.submit(session.id, { type: "shutdown" }), KeelConnectionError);
    assert.equal(posts() - before, 1, "a shutdown is sent once too");
    before = posts();
    await assert.rejects(keel.interrupt(session.id, "a-turn-that-ended"), KeelConnectionError);
    assert.equal(posts() - before, 3, "an interrupt of a named turn is safe to resend");
  } finally {
    proxy.rules = {};
  }
});

test("a request whose connect is refused is retried, a create included, until the server is back", async () => {
  const keel = new Keel({
    baseUrl: server.baseUrl,
    token: server.token,
    retry: { maxAttempts: 40, baseDelayMs: 50, maxDelayMs: 200 },
  });
  await server.kill();
  const creating = keel.sessions.create({ id: "made-after-restart" });
  await new Promise((done) => setTimeout(done, 400));
  await server.restart();
  const session = await creating;
  assert.equal(session.id, "made-after-restart");
  const dead = new Keel({ baseUrl: `http://127.0.0.1:${await freePort()}`, retry: { maxAttempts: 2, baseDelayMs: 5, maxDelayMs: 5 } });
  await assert.rejects(dead.sessions.list(), (error: unknown) => {
    assert.ok(error instanceof KeelConnectionError);
    assert.equal(error.beforeSending, true, "nothing reached a server");
    return true;
  });
});

/** A loopback port nothing listens on (it was free a moment ago). */
async function freePort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((done) => probe.listen(0, "127.0.0.1", done));
  const address = probe.address();
  await new Promise<void>((done) => probe.close(() => done()));
  assert.ok(address !== null && typeof address === "object");
  return address.port;
}
