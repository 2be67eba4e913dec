// Drives Keel's AI SDK routes with the `ai` package itself (no React):
// `DefaultChatTransport` sends and reconnects, `readUIMessageStream`
// assembles the message, and every frame of every stream is parsed again
// with `parseJsonEventStream` and `uiMessageChunkSchema`.
//
// Usage: node chat.mjs <base URL> <params JSON>; KEEL_TOKEN holds the
// bearer token; KEEL_NODE_MODULES where `ai` is installed (.ci/node's by
// default). Prints `FIRST` once the first text of a stream
// arrived, then `RESULT <json>`.

import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const modules = resolve(process.env.KEEL_NODE_MODULES ?? join(here, "../../../.ci/node/node_modules"));
const ai = await import(pathToFileURL(join(modules, "ai/dist/index.js")).href);
const { DefaultChatTransport, parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } = ai;

const [base, paramsText] = process.argv.slice(2);
const params = JSON.parse(paramsText);
const headers = { authorization: `Bearer ${process.env.KEEL_TOKEN}` };

// Every stream's frames, checked as they come.
const streams = [];

async function check(stream, record) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  for (;;) {
    const { value, done } = await reader.read().catch((error) => ({ done: true, error }));
    if (done) break;
    text += value;
  }
  record.raw = text;
  record.done = /(^|\n)data: \[DONE\]\n\n$/.test(text);
  const parsed = parseJsonEventStream({
    stream: new Response(text).body,
    schema: uiMessageChunkSchema,
  });
  for await (const result of parsed) {
    if (result.success) record.chunks.push(result.value);
    else record.invalid.push(String(result.error));
  }
}

const pending = [];
async function teeFetch(url, init) {
  const response = await fetch(url, init);
  const record = { url: String(url), method: init?.method ?? "GET", status: response.status, header: response.headers.get("x-vercel-ai-ui-message-stream"), chunks: [], invalid: [] };
  streams.push(record);
  if (!response.body || response.status === 204) return response;
  const [mine, theirs] = response.body.tee();
  pending.push(check(theirs, record));
  return new Response(mine, { status: response.status, headers: response.headers });
}

const transport = new DefaultChatTransport({ api: `${base}/v1/ai-sdk/chat`, headers, fetch: teeFetch });

let firstSeen = false;
// Assembles a stream into the last message state; `message` continues one.
async function assemble(stream, message) {
  let last = message;
  const errors = [];
  try {
    for await (const state of readUIMessageStream({ stream, message, onError: (error) => errors.push(String(error)) })) {
      last = structuredClone(state);
      if (!firstSeen && state.parts.some((part) => part.type === "text" && part.text !== "")) {
        firstSeen = true;
        console.log("FIRST");
      }
    }
  } catch (error) {
    errors.push(String(error));
  }
  return { message: last, errors };
}

function userMessage(id, text) {
  return { id, role: "user", parts: [{ type: "text", text }] };
}

const chatId = params.chat;
const result = {};
const history = [];
async function send(messages) {
  const stream = await transport.sendMessages({
    chatId,
    messages,
    trigger: "submit-message",
    messageId: undefined,
    abortSignal: undefined,
  });
  const last = messages.at(-1);
  return assemble(stream, last.role === "assistant" ? structuredClone(last) : undefined);
}

switch (params.action) {
  case "send": {
    const user = userMessage(params.message_id ?? "m1", params.text ?? "Hello");
    result.first = await send([user]);
    break;
  }
  case "reconnect": {
    const stream = await transport.reconnectToStream({ chatId });
    result.none = stream === null;
    if (stream) result.first = await assemble(stream);
    break;
  }
  case "answer": {
    // Send, then answer every call the message waits on the way `useChat`
    // does (addToolApprovalResponse / addToolOutput), then send again.
    const user = userMessage(params.message_id ?? "m1", params.text ?? "Go");
    history.push(user);
    result.first = await send(history);
    const assistant = structuredClone(result.first.message);
    for (const part of assistant?.parts ?? []) {
      if (part.state === "approval-requested") {
        part.state = "approval-responded";
        part.approval = { ...part.approval, approved: params.approve !== false };
      } else if (part.state === "input-available" && params.outputs?.[part.toolName ?? part.type.slice(5)] !== undefined) {
        part.state = "output-available";
        part.output = params.outputs[part.toolName ?? part.type.slice(5)];
      }
    }
    history.push(assistant);
    result.second = await send(history);
    if (params.resend) result.resent = await send(history);
    break;
  }
  default:
    throw new Error(`unknown action ${params.action}`);
}
await Promise.all(pending);
result.streams = streams.map(({ raw, ...rest }) => ({ ...rest, rawTail: raw?.slice(-40) }));
console.log(`RESULT ${JSON.stringify(result)}`);
