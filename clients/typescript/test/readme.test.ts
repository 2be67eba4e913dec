// The README's flow against a real `keel serve`: create, submit, stream the
// answer, wait for a turn, then list, get, rename, fork, usage and delete.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Keel, NotFoundError } from "@keel/client";

import { wholeLog } from "./support/events.js";
import { KeelServer } from "./support/server.js";

let server: KeelServer;

before(async () => {
  server = await KeelServer.start();
});

after(async () => {
  await server.stop();
});

test("the README flow", async () => {
  const model = await server.script("readme.jsonl", [
    { chunks: ["Hello", ", ", "world", "!"], delay_ms: 20, usage: { input_tokens: 7, output_tokens: 4 } },
    { text: "Second answer." },
  ]);
  // As in README.md:
  const keel = new Keel({ baseUrl: server.baseUrl, token: server.token });
  const session = await keel.sessions.create({ bot_id: "docs", model });
  const accepted = await keel.say(session.id, "Hello!");
  let answer = "";
  for await (const event of keel.stream(session.id, { after: accepted.sequence - 1 })) {
    if (event.msg.type === "assistant_content_delta") answer += event.msg.delta;
    if (event.msg.type === "turn_complete" || event.msg.type === "turn_aborted") break;
  }
  assert.equal(answer, "Hello, world!");
  assert.equal(session.state, "idle");
  assert.equal(session.bot_id, "docs");

  const second = await keel.say(session.id, "Again");
  assert.equal(second.duplicate, false);
  const turn = await keel.waitForTurn(session.id, second, { timeoutMs: 30_000 });
  assert.ok(turn.completed);
  assert.equal(turn.text, "Second answer.");
  assert.equal(turn.events.at(-1)?.msg.type, "turn_complete");
  assert.ok(turn.events.every((event) => "turn_id" in event.msg && event.msg.turn_id === turn.turnId));

  const shown = await keel.sessions.get(session.id);
  assert.equal(shown.turns_completed, 2);
  assert.equal(shown.title, "Hello!");
  assert.equal(shown.usage.input_tokens, 7);
  const renamed = await keel.sessions.rename(session.id, "Greetings");
  assert.equal(renamed.title, "Greetings");

  const listed = [];
  for await (const each of keel.sessions.all({ botId: "docs", limit: 1 })) listed.push(each.id);
  assert.deepEqual(listed, [session.id]);

  const log = await wholeLog(keel, session.id);
  const firstEnd = log.find((event) => event.msg.type === "turn_complete");
  assert.ok(firstEnd !== undefined);
  const fork = await keel.sessions.fork(session.id, { at_sequence: firstEnd.sequence, id: `${session.id}-fork` });
  assert.equal(fork.id, `${session.id}-fork`);
  const forkLog = await wholeLog(keel, fork.id);
  assert.equal(forkLog[0]?.msg.type, "session_forked");

  const usage = await keel.usage({ botId: "docs" });
  assert.equal(usage.total.input_tokens, 7);
  assert.equal(usage.total.output_tokens, 4);

  await keel.sessions.delete(fork.id);
  await keel.sessions.delete(session.id, { workspace: true });
  await assert.rejects(keel.sessions.get(session.id), NotFoundError);
});
