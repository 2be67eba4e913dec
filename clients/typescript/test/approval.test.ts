// An approval round trip: a tool call waits for the user's decision, the
// client answers it while waiting for the turn, and the tool runs.

import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Keel, isEvent } from "@keel/client";

import { KeelServer } from "./support/server.js";

let server: KeelServer;

before(async () => {
  server = await KeelServer.start();
});

after(async () => {
  await server.stop();
});

test("a tool call waits for approval, is approved, and runs", async () => {
  const model = await server.script("approve.jsonl", [
    { tool_calls: [{ id: "w1", name: "write_file", arguments: { path: "approved.txt", content: "yes" } }] },
    { text: "Written." },
    { tool_calls: [{ id: "w2", name: "write_file", arguments: { path: "denied.txt", content: "no" } }] },
    { text: "Not written." },
  ]);
  const keel = new Keel({ baseUrl: server.baseUrl, token: server.token });
  const session = await keel.sessions.create({
    id: "approvals",
    model,
    tools: { shell: false },
    approvals: { default: "ask" },
  });

  const asked: string[] = [];
  const turn = await keel.waitForTurn(session.id, await keel.say(session.id, "Write the file"), {
    timeoutMs: 30_000,
    onEvent: async (event) => {
      if (isEvent(event, "approval_requested")) {
        asked.push(event.msg.call_id);
        const shown = await keel.sessions.get(session.id);
        assert.equal(shown.state, "awaiting_approval");
        assert.deepEqual(await keel.pendingApprovals(session.id), [event.msg.call_id]);
        await keel.approve(session.id, event.msg.call_id);
      }
    },
  });
  assert.deepEqual(asked, ["w1"]);
  assert.ok(turn.completed);
  assert.equal(turn.text, "Written.");
  const decided = turn.events.find((event) => isEvent(event, "approval_decided"));
  assert.ok(decided !== undefined && isEvent(decided, "approval_decided"));
  assert.equal(decided.msg.decision, "approve");
  const completed = turn.events.find((event) => isEvent(event, "tool_call_completed"));
  assert.ok(completed !== undefined && isEvent(completed, "tool_call_completed"));
  assert.equal(completed.msg.is_error, false);
  assert.equal(await readFile(join(server.workspaces, "approvals", "approved.txt"), "utf8"), "yes");

  const denied = await keel.waitForTurn(session.id, await keel.say(session.id, "Write another"), {
    timeoutMs: 30_000,
    onEvent: async (event) => {
      if (isEvent(event, "approval_requested")) {
        await keel.approve(session.id, event.msg.call_id, "deny");
      }
    },
  });
  assert.equal(denied.text, "Not written.");
  const refused = denied.events.find((event) => isEvent(event, "tool_call_completed"));
  assert.ok(refused !== undefined && isEvent(refused, "tool_call_completed"));
  assert.equal(refused.msg.is_error, true);
  await assert.rejects(readFile(join(server.workspaces, "approvals", "denied.txt")), { code: "ENOENT" });
  assert.deepEqual((await keel.sessions.get(session.id)).pending_approvals, []);
});
