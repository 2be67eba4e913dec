// Drives Keel's AG-UI endpoint with @ag-ui/client's HttpAgent, the way a
// CopilotKit or AG-UI front end does, and prints what the client assembled.
//
//   node runs.mjs '<params JSON>'
//
// params: {thread, token?, messages?, runs: [{url, message?, tools?, resume?, toolResult?}]}
//   messages    the messages a page kept from an earlier run (its report's)
//   message     a user message added before the run
//   resume      "approve" | "deny": answer every pending interrupt
//   toolResult  {content}: answer every pending frontend tool call with a
//               tool message
//   interruptOnText  a URL: on the run's first TEXT_MESSAGE_CONTENT, POST an
//               `interrupt` op there (Keel's submissions route), as a page's
//               stop button does; the client keeps what it was shown
//   signalOnText  a file path: created on the run's first
//               TEXT_MESSAGE_CONTENT (for the test to crash the server)
//   mayFail     go on after this run fails
// Each run uses a fresh HttpAgent (another browser tab, another node) that
// carries over the messages and pending interrupts of the last one.
// Prints one line `RESULT <json>`: per run the event types, the outcome and
// every event's @ag-ui/core schema failure; then the assembled messages.

import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { randomUUID } from "node:crypto";
import { writeFileSync } from "node:fs";

const modules = process.env.KEEL_NODE_MODULES;
if (!modules) throw new Error("KEEL_NODE_MODULES names the node_modules with @ag-ui/client");
const load = (path) => import(pathToFileURL(join(modules, path)).href);
const { HttpAgent, buildResumeArray, getRunOutcome } = await load("@ag-ui/client/dist/index.mjs");
const { EventSchema } = await load("@ag-ui/core/dist/schemas.mjs");

// @ag-ui/client 1.0.0 leaves undici's rejection unhandled when the
// connection drops (docs/ag-ui.md): runAgent has rejected already.
process.on("unhandledRejection", (reason) => {
  if (reason instanceof TypeError && reason.message === "terminated" && reason.cause?.code === "UND_ERR_SOCKET") {
    return;
  }
  throw reason;
});

const params = JSON.parse(process.argv[2]);
const headers = params.token ? { Authorization: `Bearer ${params.token}` } : {};
const report = { runs: [], messages: [] };
let messages = params.messages ?? [];
let pendingInterrupts = [];
let pendingToolCallIds = [];

for (const run of params.runs) {
  const agent = new HttpAgent({ url: run.url, headers, threadId: params.thread, initialMessages: messages });
  agent.pendingInterrupts = pendingInterrupts;
  if (run.message) {
    agent.addMessage({ id: randomUUID(), role: "user", content: run.message });
  }
  if (run.toolResult) {
    for (const toolCallId of pendingToolCallIds) {
      agent.addMessage({ id: randomUUID(), role: "tool", toolCallId, content: run.toolResult.content });
    }
  }
  const input = {};
  if (run.tools) input.tools = run.tools;
  if (run.resume) {
    const responses = Object.fromEntries(
      agent.pendingInterrupts.map((interrupt) => [
        interrupt.id,
        { status: "resolved", payload: { approved: run.resume === "approve" } },
      ]),
    );
    input.resume = buildResumeArray(agent.pendingInterrupts, responses);
  }
  const seen = { types: [], schemaErrors: [], outcome: null, runId: null, error: null, events: [] };
  try {
    await agent.runAgent(input, {
      onEvent: ({ event }) => {
        if (run.interruptOnText && event.type === "TEXT_MESSAGE_CONTENT" && !seen.interrupted) {
          seen.interrupted = fetch(run.interruptOnText, {
            method: "POST",
            headers: { ...headers, "Content-Type": "application/json" },
            body: JSON.stringify({ op: { type: "interrupt" } }),
          }).then((response) => response.status);
        }
        if (run.signalOnText && event.type === "TEXT_MESSAGE_CONTENT" && !seen.signalled) {
          seen.signalled = true;
          writeFileSync(run.signalOnText, "text");
        }
        seen.types.push(event.type);
        seen.events.push(event);
        const parsed = EventSchema.safeParse(event);
        if (!parsed.success) seen.schemaErrors.push({ type: event.type, issues: parsed.error.issues });
      },
      onRunStartedEvent: ({ event }) => {
        seen.runId = event.runId;
      },
      onRunFinishedEvent: (finished) => {
        seen.outcome = getRunOutcome(finished.event) ?? { type: "success" };
        seen.pendingToolCallIds = finished.pendingToolCallIds ?? [];
      },
      onRunErrorEvent: ({ event }) => {
        seen.error = { message: event.message, code: event.code };
      },
    });
  } catch (error) {
    seen.error = { message: String(error?.message ?? error), status: error?.status, payload: error?.payload };
  }
  if (seen.interrupted) seen.interrupted = await seen.interrupted;
  messages = agent.messages;
  pendingInterrupts = agent.pendingInterrupts;
  pendingToolCallIds = seen.pendingToolCallIds ?? [];
  report.runs.push(seen);
  if (seen.error && !run.mayFail) break;
}
report.messages = messages;
console.log(`RESULT ${JSON.stringify(report)}`);
