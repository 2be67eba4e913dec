// The event-stream parser against the HTML standard's rules, fed in chunks
// split at every position.

import assert from "node:assert/strict";
import { test } from "node:test";

import { type SseMessage, SseParser } from "@keel/client";

/** The events of `text` fed as one chunk. */
function parse(text: string): SseMessage[] {
  return new SseParser().push(text);
}

/** The events of `text` fed split in two at every position, each as from one chunk. */
function parseSplitEverywhere(text: string): SseMessage[][] {
  const results: SseMessage[][] = [];
  for (let at = 0; at <= text.length; at++) {
    const parser = new SseParser();
    results.push([...parser.push(text.slice(0, at)), ...parser.push(text.slice(at))]);
  }
  return results;
}

test("a Keel event with id, event and data is one message", () => {
  const messages = parse('id: 5\nevent: turn_started\ndata: {"sequence":5}\n\n');
  assert.deepEqual(messages, [{ event: "turn_started", data: '{"sequence":5}', id: "5", retry: undefined }]);
});

test("every line ending (LF, CRLF, CR) works, also when a chunk splits it", () => {
  for (const end of ["\n", "\r\n", "\r"]) {
    const text = `id: 1${end}data: a${end}${end}: keep-alive${end}${end}id: 2${end}data: b${end}data: c${end}${end}`;
    const expected = [
      { event: "message", data: "a", id: "1", retry: undefined },
      { event: "message", data: "b\nc", id: "2", retry: undefined },
    ];
    assert.deepEqual(parse(text), expected, JSON.stringify(end));
    for (const [at, split] of parseSplitEverywhere(text).entries()) {
      assert.deepEqual(split, expected, `${JSON.stringify(end)} split at ${at}`);
    }
  }
});

test("byte-at-a-time feeding gives the same events", () => {
  const text = 'id: 7\r\nevent: x\r\ndata: {"a":\r\ndata: 1}\r\n\r\n';
  const parser = new SseParser();
  const messages = [...text].flatMap((char) => parser.push(char));
  assert.deepEqual(messages, [{ event: "x", data: '{"a":\n1}', id: "7", retry: undefined }]);
});

test("comments, unknown fields and events without data dispatch nothing", () => {
  assert.deepEqual(parse(": keep-alive\n\nfoo: bar\n\nevent: only-type\n\nid: 3\n\n"), []);
});

test("the id carries over to later events and one with NUL is ignored", () => {
  const messages = parse("id: 4\ndata: a\n\ndata: b\n\nid: 5\u0000\ndata: c\n\n");
  assert.deepEqual(
    messages.map((message) => message.id),
    ["4", "4", "4"],
  );
});

test("a field without a colon, a value without the space, retry and a BOM", () => {
  const messages = parse("\uFEFFretry: 1500\ndata\ndata:x\nretry: soon\n\n");
  assert.deepEqual(messages, [{ event: "message", data: "\nx", id: "", retry: 1500 }]);
});

test("an event the stream ends inside is dropped", () => {
  const parser = new SseParser();
  assert.deepEqual(parser.push("data: cut"), []);
  parser.finish();
  assert.deepEqual(parser.push("\n\ndata: next\n\n"), [{ event: "message", data: "next", id: "", retry: undefined }]);
});
