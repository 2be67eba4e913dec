// Switching a session's model between turns: `sessions.setModel` (PATCH with
// `model`), seen in the session, in a `model_changed` event and in the next
// answer.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Keel } from "@keel/client";

import { wholeLog } from "./support/events.js";
import { KeelServer } from "./support/server.js";

let server: KeelServer;

before(async () => {
  server = await KeelServer.start();
});

after(async () => {
  await server.stop();
});

test("a session's model is switched between turns", async () => {
  const keel = new Keel({ baseUrl: server.baseUrl, token: server.token });
  const first = await server.script("first.jsonl", [{ text: "From the first model." }]);
  const session = await keel.sessions.create({ model: first });
  const one = await keel.waitForTurn(session.id, await keel.say(session.id, "Hi"), { timeoutMs: 30_000 });
  assert.equal(one.text, "From the first model.");

  // A script goes on from the session's count of model calls: one filler line.
  const other = await server.script("other.jsonl", [{ text: "unused" }, { text: "From the other model." }]);
  const switched = await keel.sessions.setModel(session.id, other);
  assert.ok(switched.model?.endsWith("other.jsonl"), String(switched.model));
  assert.equal((await keel.sessions.get(session.id)).model, switched.model);
  const two = await keel.waitForTurn(session.id, await keel.say(session.id, "Again"), { timeoutMs: 30_000 });
  assert.equal(two.text, "From the other model.");

  const changed = (await wholeLog(keel, session.id)).filter((event) => event.msg.type === "model_changed");
  assert.equal(changed.length, 1);
});
