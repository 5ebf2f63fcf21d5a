"""The real cursorlog binary for the tests (copied from adapters/python/tests/harness.py: the two
distributions do not import each other)."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

ADAPTER = Path(__file__).resolve().parents[1]
REPO = ADAPTER.parents[1]


def cursorlog_bin() -> Path:
    path = Path(os.environ.get("CURSORLOG_BIN", REPO / "target" / "debug" / "cursorlog"))
    if not path.is_file():
        raise RuntimeError(
            f"cursorlog binary not found at {path}: run `cargo build -p cursorlog-server --bins` in {REPO} "
            "or set CURSORLOG_BIN"
        )
    return path


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process(proc: subprocess.Popen[Any], *, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after the grace period; always reaps."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class CursorlogServer:
    """The real cursorlog binary on a port the kernel picks (``--listen 127.0.0.1:0``; it prints
    ``listening on <address>``), data in ``data_dir``."""

    def __init__(self, data_dir: Path, log: Path, *, args: tuple[str, ...] = (), listen: str = "127.0.0.1:0") -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            [str(cursorlog_bin()), "serve", "--listen", listen, "--data-dir", str(data_dir), *args],
            stdout=subprocess.PIPE,
            stderr=self._log_file,
        )
        self.address = self._read_address()

    def _read_address(self, timeout_s: float = 30.0) -> str:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        buffer = b""
        while time.monotonic() < deadline:
            if not sel.select(timeout=0.1):
                if self.proc.poll() is not None:
                    break
                continue
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buffer += chunk
            for line in buffer.decode(errors="replace").splitlines():
                if line.startswith("listening on "):
                    return line.removeprefix("listening on ").strip()
        self.stop()
        raise RuntimeError(f"cursorlog did not report its address; stdout {buffer!r}; log:\n{_tail(self.log)}")

    def stop(self) -> None:
        stop_process(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log_file.close()


_handed_ports: set[int] = set()
_PORT_SPAN = 12_000


def free_port() -> int:
    """A free loopback port for a cluster member to bind, drawn from just below the kernel's
    ephemeral range (a port bound on 0 and released may be taken by another member's outgoing
    Raft connection before the member binds it), never handed out twice by this process."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768
    high = max(low, 1024 + _PORT_SPAN)
    for _ in range(2 * _PORT_SPAN):
        port = high - _PORT_SPAN + random.randrange(_PORT_SPAN)
        if port in _handed_ports:
            continue
        _handed_ports.add(port)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port")


class CursorlogCluster:
    """Three real ``cursorlog serve --node-id … --peers …`` members on free ports with short Raft
    timing (election 300–600 ms, heartbeat 50 ms), data under ``workdir``."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(size)]
        peers = ",".join(f"{i + 1}={a}" for i, a in enumerate(self.addresses))
        self.members: list[CursorlogServer | None] = []
        try:
            for i, address in enumerate(self.addresses):
                self.members.append(
                    CursorlogServer(
                        workdir / f"data-{i + 1}",
                        workdir / f"cursorlog-{i + 1}.log",
                        listen=address,
                        args=("--node-id", str(i + 1), "--peers", peers, "--election-timeout-ms", "300", "--heartbeat-ms", "50"),
                    )
                )
        except BaseException:
            self.stop()
            raise

    @property
    def list(self) -> str:
        """The comma-separated member list, as the store takes it."""
        return ",".join(self.addresses)

    def kill(self, address: str) -> None:
        """SIGKILLs the member at ``address`` (and reaps it)."""
        i = self.addresses.index(address)
        member = self.members[i]
        if member is not None:
            member.proc.kill()
            member.stop()
            self.members[i] = None

    def stop(self) -> None:
        for member in self.members:
            if member is not None:
                member.proc.kill()
                member.stop()
        self.members = []
