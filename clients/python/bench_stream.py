"""Events per second of `Keel.stream()` (and `AsyncKeel.stream()`) against
`curl -N`, on the same long stream of a real `keel serve`.

    KEEL_BIN=target/release/keel python clients/python/bench_stream.py [--turns 3000] [--runs 3]

It starts a server on a temporary database (on /dev/shm when there is one,
so that building the log is quick), records `--turns` short turns (about
eight events each) in one session, then reads the whole log from the
stream, `--runs` times each way, and prints the best rate of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from keel_client import AsyncKeel, Keel, events

TOKEN = "bench-token"


def start_server(binary: str, root: Path, turns: int) -> tuple[subprocess.Popen[bytes], str]:
    script = root / "short.jsonl"
    line = json.dumps({"text": "ok", "usage": {"input_tokens": 1, "output_tokens": 1}}) + "\n"
    script.write_text(line * (turns + 1))
    (root / "token").write_text(TOKEN)
    (root / "ws").mkdir()
    log = root / "serve.log"
    command = [
        binary, "serve", "--db", str(root / "keel.sqlite3"), "--listen", "127.0.0.1:0",
        "--token-file", str(root / "token"), "--model", f"script:{script}",
        "--workspace-root", str(root / "ws"), "--store-reserve-mb", "0",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    deadline = time.monotonic() + 30
    while not (found := re.search(r"listening on (http://\S+)", log.read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"keel serve did not start: {log.read_text()}")
        time.sleep(0.05)
    return proc, found.group(1)


def build_log(keel: Keel, turns: int) -> tuple[str, int]:
    session = keel.sessions.create().id
    done = 0
    keel.submit(session, "go")
    for event in keel.stream(session):
        if isinstance(event.msg, events.TurnComplete):
            done += 1
            if done == turns:
                break
            keel.submit(session, "go")
    return session, keel.sessions.get(session).last_sequence


def time_curl(url: str, session: str, last: int) -> float:
    command = [
        "curl", "-sN", "-H", f"Authorization: Bearer {TOKEN}",
        f"{url}/v1/sessions/{session}/events/stream?after=0",
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None
    # Each event is one `id: N` line; a match across two reads is counted
    # once (the kept tail is shorter than the pattern).
    seen, tail, first = 0, b"", True
    while seen < last:
        chunk = os.read(proc.stdout.fileno(), 1 << 20)
        if not chunk:
            raise SystemExit("curl ended early")
        if first:
            seen, first = int(chunk.startswith(b"id: ")), False
        seen += (tail + chunk).count(b"\nid: ")
        tail = chunk[-4:]
    elapsed = time.perf_counter() - start
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    return elapsed


def time_sync(url: str, session: str, last: int) -> float:
    with Keel(url, token=TOKEN) as keel:
        start = time.perf_counter()
        for event in keel.stream(session):
            if event.sequence == last:
                break
        return time.perf_counter() - start


def time_async(url: str, session: str, last: int) -> float:
    async def run() -> float:
        async with AsyncKeel(url, token=TOKEN) as keel:
            start = time.perf_counter()
            async for event in keel.stream(session):
                if event.sequence == last:
                    break
            return time.perf_counter() - start

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    binary = os.environ.get("KEEL_BIN") or shutil.which("keel")
    if not binary:
        raise SystemExit("set KEEL_BIN to a keel binary")
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        proc, url = start_server(binary, Path(tmp), args.turns)
        try:
            with Keel(url, token=TOKEN) as keel:
                began = time.perf_counter()
                session, last = build_log(keel, args.turns)
                print(f"log: {last} events in {time.perf_counter() - began:.1f} s")
            rates = {}
            for name, measure in (("curl -N", time_curl), ("Keel.stream", time_sync), ("AsyncKeel.stream", time_async)):
                best = min(measure(url, session, last) for _ in range(args.runs))
                rates[name] = last / best
                print(f"{name:18} {rates[name]:10.0f} events/s (best of {args.runs}: {best:.3f} s)")
            for name in ("Keel.stream", "AsyncKeel.stream"):
                print(f"{name} / curl -N = {rates[name] / rates['curl -N']:.2f}")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait()


if __name__ == "__main__":
    main()
