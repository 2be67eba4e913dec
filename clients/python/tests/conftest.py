"""Fixtures: a real `keel serve` process (binary from `KEEL_BIN`) on a
temporary SQLite database, with a bearer token and scripted models, and a
TCP proxy in front of it that can drop answers or rewrite their bytes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

TOKEN = "client-test-token"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class KeelServer:
    """One `keel serve` on a fixed port, so that it can be restarted in place."""

    def __init__(self, binary: str, root: Path) -> None:
        self.binary = binary
        self.root = root
        self.scripts = root / "scripts"
        self.scripts.mkdir()
        (root / "workspaces").mkdir()
        (root / "token").write_text(TOKEN + "\n")
        self.script("default.jsonl", [{"text": "Hello from the default script."}] * 50)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def script(self, name: str, lines: list[dict]) -> str:
        """Writes a model script; answers the model spec naming it."""
        (self.scripts / name).write_text("".join(json.dumps(line) + "\n" for line in lines))
        return f"script:{name}"

    @property
    def log(self) -> Path:
        return self.root / f"serve-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        command = [
            self.binary, "serve",
            "--create", "--db", str(self.root / "keel.sqlite3"),
            "--listen", f"127.0.0.1:{self.port}",
            "--token-file", str(self.root / "token"),
            "--model", f"script:{self.scripts / 'default.jsonl'}",
            "--script-dir", str(self.scripts),
            "--workspace-root", str(self.root / "workspaces"),
            "--store-reserve-mb", "0",
            "--shutdown-grace-secs", "1",
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while b"listening on" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"keel serve did not start: {self.log.read_text()}")
            time.sleep(0.02)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def keel_bin() -> str:
    binary = os.environ.get("KEEL_BIN")
    if not binary or not Path(binary).is_file():
        pytest.fail("set KEEL_BIN to a built `keel` binary (cargo build; target/debug/keel)")
    return binary


@pytest.fixture
def server(keel_bin: str, tmp_path: Path) -> Iterator[KeelServer]:
    keel = KeelServer(keel_bin, tmp_path)
    keel.start()
    yield keel
    keel.stop()


class Proxy:
    """A TCP proxy to `port`. `drop` answers, per connection (from 0),
    whether to read the server's answer and close the connection instead of
    passing it on; `rewrite` changes the bytes sent back."""

    def __init__(
        self,
        port: int,
        drop: Callable[[int], bool] = lambda _: False,
        rewrite: Callable[[bytes], bytes] = lambda data: data,
    ) -> None:
        self.upstream = port
        self.drop = drop
        self.rewrite = rewrite
        self.connections = 0
        self.dropped = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            number = self.connections
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.drop(number)), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, dropping: bool) -> None:
        try:
            while data := source.recv(65536):
                if dropping:
                    self.dropped += 1
                    break
                sink.sendall(self.rewrite(data))
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def proxy_to(server: KeelServer) -> Iterator[Callable[..., Proxy]]:
    proxies: list[Proxy] = []

    def make(**options: object) -> Proxy:
        proxy = Proxy(server.port, **options)  # type: ignore[arg-type]
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()
