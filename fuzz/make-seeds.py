#!/usr/bin/env python3
"""Builds fuzz/corpus/<target>/ from tests/fixtures/ and the hand-written
seeds in this file. Run from the repository root; the corpus is committed,
so this only needs to run again when fixtures or seeds change."""

import json
import pathlib
import re
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CORPUS = ROOT / "fuzz" / "corpus"
MAX_SEED_BYTES = 16 * 1024


def write(target, name, data):
    directory = CORPUS / target
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (directory / name).write_bytes(data)


def fixtures(provider, suffixes):
    for path in sorted((FIXTURES / provider).iterdir()):
        if path.suffix in suffixes and path.stat().st_size <= MAX_SEED_BYTES:
            yield path


PROVIDERS = {
    "openai_chat": "openai-chat",
    "openai_responses": "openai-responses",
    "anthropic": "anthropic",
}

for target, provider in PROVIDERS.items():
    for path in fixtures(provider, {".sse", ".json"}):
        if path.name.endswith(".request.json"):
            continue
        write(target, path.name, path.read_bytes())

# A complete (non-streamed) answer of each protocol, as a server that does
# not stream sends one.
write("openai_chat", "complete.json", json.dumps({
    "id": "c", "object": "chat.completion", "model": "m",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Let me look.",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "clock", "arguments": "{}"}}]}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}))
write("openai_responses", "complete.json", json.dumps({
    "id": "resp_1", "object": "response", "status": "completed",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "abc"},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "It is noon.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "clock",
         "arguments": "{}", "status": "completed"}],
    "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
              "input_tokens_details": {"cached_tokens": 2},
              "output_tokens_details": {"reasoning_tokens": 1}}}))
write("anthropic", "complete.json", json.dumps({
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
    "content": [{"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "clock", "input": {}}],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 5}}))

# The SSE parser: every stream fixture, and the edge cases of its tests.
for provider in PROVIDERS.values():
    for path in fixtures(provider, {".sse"}):
        write("sse", f"{provider}-{path.name}", path.read_bytes())
write("sse", "split-lines", "event: message_start\r\ndata: {\"a\":\"h\u00e9llo \U0001F30D\"}\r\n\r\n"
      ": keep-alive\n\ndata: line one\ndata: line two\n\ndata:[DONE]\r\r")
write("sse", "error-line", "data: {\"choices\": []}\n\nerror: {\"code\": 500, \"message\": \"out of memory\"}\n\n"
      "data: [DONE]\n\n")
write("sse", "fields", ": ping\n\nid: 7\nretry: 10\n\nevent: ping\n\ndata\ndata:\n\n")
write("sse", "bad-utf8", b"data: \xff\xfe\n\n")

OPS = [
    {"type": "user_input", "text": "What time is it?"},
    {"type": "interrupt"},
    {"type": "interrupt", "turn_id": "0193a5e0-0000-7000-8000-000000000001"},
    {"type": "shutdown"},
    {"type": "approval", "call_id": "call_1", "decision": "approve"},
    {"type": "approval", "call_id": "call_1", "decision": "approve_for_session"},
    {"type": "approval", "call_id": "call_1", "decision": "deny"},
    {"type": "steer", "text": "shorter, please"},
    {"type": "compact"},
    {"type": "regenerate"},
]
TURN = "0193a5e0-0000-7000-8000-000000000001"
USAGE = {"input_tokens": 10, "output_tokens": 5, "cached_input_tokens": 2, "reasoning_output_tokens": 1}
MSGS = [
    {"type": "session_started", "session_id": "s", "bot_id": "b", "resumed": False, "history_items": 0,
     "sandbox": {"policy": "workspace-write", "enforced": True, "detail": "landlock", "network_blocked": True},
     "tools": ["clock", "read_file"]},
    {"type": "session_forked", "parent_session_id": "p", "at_sequence": 7, "history_items": 3},
    {"type": "turn_started", "turn_id": TURN},
    {"type": "user_message", "turn_id": TURN, "text": "What time is it?"},
    {"type": "model_step_started", "turn_id": TURN, "step": 1},
    {"type": "assistant_content_delta", "turn_id": TURN, "delta": "It is "},
    {"type": "reasoning_delta", "turn_id": TURN, "delta": "The user asks"},
    {"type": "assistant_message", "turn_id": TURN, "text": "It is noon."},
    {"type": "approval_requested", "turn_id": TURN, "call_id": "c", "name": "shell", "arguments": "{\"command\":\"ls\"}"},
    {"type": "approval_decided", "turn_id": TURN, "call_id": "c", "decision": "deny"},
    {"type": "tool_call_started", "turn_id": TURN, "call_id": "c", "name": "clock", "arguments": "{}"},
    {"type": "tool_call_completed", "turn_id": TURN, "call_id": "c", "output": "12:00", "is_error": False},
    {"type": "tool_call_progress", "turn_id": TURN, "call_id": "c", "progress": 0.5, "total": 1.0, "message": "half"},
    {"type": "tools_changed", "turn_id": TURN, "tools": ["a"], "added": ["a"], "removed": []},
    {"type": "token_usage", "turn_id": TURN, "step": 1, "usage": USAGE, "session_total": USAGE},
    {"type": "turn_complete", "turn_id": TURN},
    {"type": "turn_complete", "turn_id": TURN, "length_limited": True},
    {"type": "turn_aborted", "turn_id": TURN, "reason": "interrupted"},
    {"type": "warning", "message": "slow"},
    {"type": "error", "turn_id": TURN, "message": "the model failed"},
    {"type": "submission_rejected", "reason": "shutting down"},
    {"type": "shutdown_complete"},
    {"type": "context_compacted", "reason": "threshold", "summary": "s", "replaced_from": 0, "replaced_to": 4,
     "tokens_before": 1000, "tokens_after": 100, "duration_ms": 5},
    {"type": "turn_rolled_back", "rolled_back_turn_id": TURN, "history_from": 2, "items_removed": 3,
     "compaction_undone": True},
]
ITEMS = [
    {"type": "user_message", "text": "hi"},
    {"type": "assistant_message", "text": "hello"},
    {"type": "tool_call", "call_id": "c", "name": "clock", "arguments": "{}"},
    {"type": "tool_result", "call_id": "c", "output": "12:00", "is_error": False},
    {"type": "reasoning", "provider": "anthropic", "data": {"thinking": "hm", "signature": "sig"}},
]

for index, op in enumerate(OPS):
    write("protocol_json", f"op-{index:02}", json.dumps(op))
    write("protocol_json", f"submit-{index:02}", json.dumps({"op": op, "on_busy": "queue"}))
write("protocol_json", "submit-steer", json.dumps({"op": OPS[0], "on_busy": "steer"}))
events = []
for index, msg in enumerate(MSGS):
    event = {"sequence": index + 1, "recorded_at_ms": 1764430000000, "submission_id": "sub-1", "msg": msg}
    events.append({"submission_id": "sub-1", "msg": msg})
    write("protocol_json", f"event-{index:02}-{msg['type']}", json.dumps(event))
for index, item in enumerate(ITEMS):
    write("protocol_json", f"item-{index:02}-{item['type']}", json.dumps(item))

# The store: a row header (first and last sequence, u64 little endian, and
# a byte of history cut) before a stored value, plain or compressed.
def row(first, last, cut, stored):
    return struct.pack("<QQB", first, last, cut) + stored

batch = json.dumps(events[:6]).encode()
write("store_codec", "batch-plain", row(1, 6, 255, batch))
write("store_codec", "history-plain", row(4, 4, 1, json.dumps(ITEMS).encode()))
write("store_codec", "one-event", row(9, 9, 255, json.dumps(events[2:3]).encode()))
write("store_codec", "string", row(1, 1, 0, b'"text"'))
try:
    import lz4.block  # optional: compressed seeds

    big = json.dumps(events * 4).encode()
    compressed = b"\x01" + struct.pack("<I", len(big)) + lz4.block.compress(big, store_size=False)
    write("store_codec", "batch-compressed", row(1, len(events) * 4, 255, compressed))
except ImportError:
    pass
write("store_codec", "damaged-length", row(1, 1, 255, b"\x01\xff\xff\xff\x7f\x10abc"))

# keel.toml: the README's and the config module's examples.
for source in [ROOT / "README.md", ROOT / "src" / "config" / "mod.rs"]:
    text = source.read_text()
    if source.suffix == ".rs":
        text = "\n".join(line[4:] if line.startswith("//! ") else line[3:] for line in text.splitlines()
                         if line.startswith("//!"))
    for index, block in enumerate(re.findall(r"```toml\n(.*?)```", text, re.S)):
        write("keel_toml", f"{source.stem}-{index}.toml", block)
write("keel_toml", "empty.toml", "")
write("keel_toml", "unknown-key.toml", "[models.x]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"sk\"\n")
write("keel_toml", "mcp-both.toml", "[mcp.servers.x]\ncommand = \"a\"\nurl = \"http://h/mcp\"\n")
write("keel_toml", "script.toml", "model = \"s\"\n[models.s]\nprovider = \"script\"\nmodel = \"turns.jsonl\"\n"
      "idle_timeout_secs = 5\nresponse_timeout_secs = 10\nstep_timeout_secs = 60\nmax_retries = 0\n")
