// A stream that outlives its server: `kill -9` in the middle of a streamed
// answer, a restart on the same database and port, and the stream goes on
// by itself with every event exactly once, in order, as the log holds them.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Keel, type RecordedEvent } from "@keel/client";

import { sequences, until, wholeLog } from "./support/events.js";
import { KeelServer } from "./support/server.js";

let server: KeelServer;

before(async () => {
  server = await KeelServer.start();
});

after(async () => {
  await server.stop();
});

test("a stream survives kill -9 and a restart with every event once, in order", async () => {
  const chunks = Array.from({ length: 60 }, (_, index) => `c${index} `);
  const model = await server.script("resume.jsonl", [{ chunks, delay_ms: 40 }, { text: "After the restart." }]);
  const keel = new Keel({ baseUrl: server.baseUrl, token: server.token, retry: { maxAttempts: 20 } });
  const session = await keel.sessions.create({ model });

  const seen: RecordedEvent[] = [];
  const stop = new AbortController();
  const stream = keel.stream(session.id, { signal: stop.signal, reconnect: { maxDelayMs: 500 } });
  const reading = (async () => {
    for await (const event of stream) {
      seen.push(event);
    }
  })();

  await keel.say(session.id, "Stream a long answer");
  const deltas = () => seen.filter((event) => event.msg.type === "assistant_content_delta").length;
  await until(() => deltas() >= 5, "the first deltas");
  await server.kill();
  const atKill = seen.length;
  await new Promise((done) => setTimeout(done, 300));
  await server.restart();

  // The restarted server closes the cut turn; a new message runs a new one.
  const second = await keel.say(session.id, "And now?");
  const turn = await keel.waitForTurn(session.id, second, { timeoutMs: 30_000 });
  assert.equal(turn.text, "After the restart.");
  await until(() => seen.at(-1)?.sequence === turn.end.sequence, "the stream to reach the second turn's end");
  stop.abort();
  await reading;

  const log = await wholeLog(keel, session.id);
  assert.deepEqual(sequences(seen), sequences(log), "every sequence once, in order, none missing");
  assert.deepEqual(seen, log, "the stream delivered the log's events as stored");
  assert.deepEqual(
    sequences(seen),
    Array.from({ length: seen.length }, (_, index) => index + 1),
  );
  assert.ok(atKill < seen.length, "events came after the kill");
  const aborted = seen.find((event) => event.msg.type === "turn_aborted");
  assert.ok(aborted !== undefined && aborted.msg.type === "turn_aborted");
  assert.equal(aborted.msg.reason, "runtime_stopped", "the kill cut the first turn");
  assert.ok(
    seen.some((event) => event.msg.type === "session_started" && event.msg.resumed),
    "the restarted server's events reached the stream",
  );
  assert.equal(stream.lastSequence, log.at(-1)?.sequence);
});

test("a stream goes on across a graceful restart, which ends it", async () => {
  const model = await server.script("graceful.jsonl", [{ text: "Before." }, { text: "After." }]);
  const keel = new Keel({ baseUrl: server.baseUrl, token: server.token, retry: { maxAttempts: 20 } });
  const session = await keel.sessions.create({ model });
  const first = await keel.waitForTurn(session.id, await keel.say(session.id, "One"), { timeoutMs: 30_000 });
  assert.equal(first.text, "Before.");

  const seen: RecordedEvent[] = [];
  const stop = new AbortController();
  const reading = (async () => {
    for await (const event of keel.stream(session.id, { after: first.end.sequence, signal: stop.signal })) {
      seen.push(event);
    }
  })();
  await server.terminate();
  await server.restart();
  const second = await keel.say(session.id, "Two");
  const turn = await keel.waitForTurn(session.id, second, { timeoutMs: 30_000 });
  assert.equal(turn.text, "After.");
  await until(() => seen.at(-1)?.sequence === turn.end.sequence, "the stream to reach the second turn's end");
  stop.abort();
  await reading;

  const log = await wholeLog(keel, session.id);
  assert.deepEqual(seen, log.slice(first.end.sequence), "the events after the first turn, once each, in order");
  assert.ok(seen.some((event) => event.msg.type === "shutdown_complete"), "the shutdown's own events were streamed");
});
