"""Processes and a switchable TCP proxy for the tests: the real cursorlog binary, example
replicas (uvicorn + the MCP SDK + cursorlog-mcp), and a proxy that can move new connections
from one replica to another and cut the live ones."""

from __future__ import annotations

import asyncio
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

ADAPTER = Path(__file__).resolve().parents[1]
REPO = ADAPTER.parents[1]
REPLICA_SCRIPT = ADAPTER / "examples" / "replica.py"


def cursorlog_bin() -> Path:
    path = Path(os.environ.get("CURSORLOG_BIN", REPO / "target" / "debug" / "cursorlog"))
    if not path.is_file():
        raise RuntimeError(
            f"cursorlog binary not found at {path}: run `cargo build -p cursorlog-server --bins` in {REPO} "
            "or set CURSORLOG_BIN"
        )
    return path


_HANDED: set[int] = set()
_SPAN = 12_000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A free loopback port for a server to bind, drawn from just below the kernel's ephemeral
    range and never handed out twice by this process. A port bound on 0 and released comes from
    the ephemeral range, where any outgoing connection (another member's Raft RPC) may take it
    before the server binds it; below that range only explicit binds use a port."""
    high = max(_ephemeral_low(), 1024 + _SPAN)
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(2 * _SPAN):
        port = rng.randrange(high - _SPAN, high)
        if port in _HANDED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {high - _SPAN}..{high}")


def _wait_port(port: int, proc: subprocess.Popen[Any], log: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening; log:\n{_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout_s}s; log:\n{_tail(log)}")


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
    """The real cursorlog binary on a free port, data in ``data_dir``."""

    def __init__(self, data_dir: Path, log: Path, *, listen: str = "127.0.0.1:0", args: tuple[str, ...] = ()) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            [str(cursorlog_bin()), "serve", "--listen", listen, "--data-dir", str(data_dir), *args],
            stdout=subprocess.PIPE,
            stderr=self._log_file,
        )
        self.address = self._read_address()

    def _read_address(self, timeout_s: float = 20.0) -> str:
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


class CursorlogCluster:
    """Three real ``cursorlog serve --node-id … --peers …`` members on free ports, short Raft
    timing (election 300–600 ms, heartbeat 50 ms), data under ``workdir``."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(size)]
        self._workdir = workdir
        self._peers = ",".join(f"{i + 1}={a}" for i, a in enumerate(self.addresses))
        self.members: dict[str, CursorlogServer] = {}
        try:
            for address in self.addresses:
                self._start(address)
        except BaseException:
            self.stop()
            raise

    def _start(self, address: str, log_suffix: str = "") -> None:
        n = self.addresses.index(address) + 1
        args = ("--node-id", str(n), "--peers", self._peers, "--election-timeout-ms", "300", "--heartbeat-ms", "50")
        self.members[address] = CursorlogServer(
            self._workdir / f"member-{n}", self._workdir / f"member-{n}{log_suffix}.log", listen=address, args=args
        )

    def restart(self, address: str) -> None:
        """Starts the member at ``address`` again (after ``kill``) on its data directory."""
        assert address not in self.members, f"{address} is running"
        self._start(address, log_suffix=f".{time.monotonic_ns()}")

    @property
    def target(self) -> str:
        """The comma-separated member list, as the adapter takes it."""
        return ",".join(self.addresses)

    def kill(self, address: str) -> None:
        """SIGKILLs the member at ``address``."""
        member = self.members.pop(address)
        member.proc.kill()
        member.proc.wait(timeout=10)
        member.stop()

    def stop(self) -> None:
        for member in self.members.values():
            member.proc.kill()
            member.stop()
        self.members.clear()


class Replica:
    """``examples/replica.py`` in its own process."""

    def __init__(
        self,
        name: str,
        cursorlog: str,
        workdir: Path,
        *,
        exec_log: Path,
        lease_ms: int = 10_000,
        retry_ms: int = 100,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.port = free_port()
        self.log = workdir / f"replica-{name}.log"
        self._log_file = self.log.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(REPLICA_SCRIPT),
                "--port",
                str(self.port),
                "--cursorlog",
                cursorlog,
                "--name",
                name,
                "--lease-ms",
                str(lease_ms),
                "--retry-ms",
                str(retry_ms),
                "--exec-log",
                str(exec_log),
                *extra_args,
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            # Generous: importing the SDK stack takes tens of seconds on a loaded 2-core machine.
            _wait_port(self.port, self.proc, self.log, timeout_s=90.0)
        except BaseException:
            self.kill()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: the producer dies without a word."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._log_file.close()

    def stop(self) -> None:
        stop_process(self.proc, grace_s=3.0)
        self._log_file.close()


class SwitchableProxy:
    """A TCP proxy on its own thread and event loop.

    New connections go to the current target port; ``pause()`` holds new connections until
    ``route()`` names a target; ``cut()`` aborts every live connection (both sides)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-proxy", daemon=True)
        self._thread.start()
        self._target: int | None = None
        self._routed: asyncio.Event | None = None
        self._live: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.connections: Counter[int] = Counter()
        self._server: asyncio.base_events.Server = self._run(self._start())
        self.port: int = self._server.sockets[0].getsockname()[1]

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _start(self) -> asyncio.base_events.Server:
        self._routed = asyncio.Event()
        return await asyncio.start_server(self._handle, "127.0.0.1", 0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def route(self, port: int) -> None:
        async def set_target() -> None:
            assert self._routed is not None
            self._target = port
            self._routed.set()

        self._run(set_target())

    def pause(self) -> None:
        async def unset() -> None:
            assert self._routed is not None
            self._target = None
            self._routed.clear()

        self._run(unset())

    def cut(self) -> int:
        """Aborts every live connection; returns how many were cut."""

        async def abort_all() -> int:
            live = list(self._live)
            self._live.clear()
            for client, upstream in live:
                client.transport.abort()
                upstream.transport.abort()
            return len(live)

        return int(self._run(abort_all()))

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        assert self._routed is not None
        await self._routed.wait()
        target = self._target
        assert target is not None
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_writer.transport.abort()
            return
        self.connections[target] += 1
        pair = (client_writer, up_writer)
        self._live.add(pair)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while chunk := await reader.read(65536):
                    writer.write(chunk)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass  # the other side went away (or cut()); closing below is all there is to do
            finally:
                if not writer.transport.is_closing():
                    writer.close()

        await asyncio.gather(pipe(client_reader, up_writer), pipe(up_reader, client_writer))
        self._live.discard(pair)

    def close(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            for client, upstream in list(self._live):
                client.transport.abort()
                upstream.transport.abort()

        self._run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
