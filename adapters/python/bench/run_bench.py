"""End-to-end benchmark: an MCP front-end replica under load, cursorlog store vs. Redis store.

    python adapters/python/bench/run_bench.py --cursorlog-bin target/release/cursorlog

Starts, on this machine: cursorlog (``serve --sync always``, data on the disk under
``--workdir``), redis-server (``appendonly yes``, ``appendfsync always``, same disk), and one
front-end replica per store (``frontend.py``: the real SDK server under uvicorn). Then ``--calls``
client sessions (initialized once per replica) each make one concurrent ``tools/call`` per round
(``work(n)``: ``--events`` progress notifications and a result), and the rounds alternate
between the two replicas. Per round it measures durable events per second (progress + result
events received, each stored before it was sent, over the round's wall time) and the latency of
every event from its emission in the tool to its arrival at the client. Medians over rounds.

The load generator speaks raw HTTP/1.1 and SSE over asyncio streams (not the SDK client, not
httpx), to keep its own CPU cost per event far below the server's; it shares the machine's two
cores with everything else, equally for both sides. Each round also reports the CPU time the
front-end and the store server used per event (from /proc), which the machine's other load
does not skew.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
VERSION = "2025-11-25"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} is not listening on {port}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Round:
    side: str
    events: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds each process of the side used during the round."""

    def cpu_us_per_event(self, role: str) -> float:
        return self.cpu.get(role, 0.0) / self.events * 1e6

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds

    def pct(self, q: float) -> float:
        data = sorted(self.latencies_ms)
        return data[min(len(data) - 1, int(q * len(data)))]


class Connection:
    """A minimal HTTP/1.1 keep-alive client connection: the load generator's own CPU per event
    must stay far below the server's, so it parses chunked SSE by hand instead of using httpx."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self.host, self.port, self.path = host, port, path
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        """Sends a POST; returns status, headers and an async iterator over body lines."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        payload = json.dumps(body).encode()
        head = [f"POST {self.path} HTTP/1.1", f"host: {self.host}:{self.port}", f"content-length: {len(payload)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        response_headers: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            response_headers[key.strip().lower()] = value.strip()
        return status, response_headers, self._body(response_headers)

    async def _body(self, headers: dict[str, str]) -> Any:
        assert self.reader is not None
        if headers.get("transfer-encoding") == "chunked":
            pending = b""
            while True:
                size = int((await self.reader.readline()).strip(), 16)
                if size == 0:
                    await self.reader.readline()
                    if pending:
                        yield pending
                    return
                chunk = await self.reader.readexactly(size + 2)
                pending += chunk[:-2]
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.rstrip(b"\r")
        else:
            data = await self.reader.readexactly(int(headers.get("content-length", "0")))
            for line in data.split(b"\n"):
                yield line.rstrip(b"\r")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Session:
    """One MCP client session over raw HTTP (its own keep-alive connection)."""

    def __init__(self, url: str, index: int) -> None:
        host, _, rest = url.removeprefix("http://").partition(":")
        port, _, path = rest.partition("/")
        self.conn = Connection(host, int(port), "/" + path)
        self.index = index
        self.sid = ""
        self.next_id = 1

    async def _post(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], list[bytes]]:
        status, response_headers, lines = await self.conn.request(body, headers)
        return status, response_headers, [line async for line in lines]

    async def initialize(self) -> None:
        body = {
            "jsonrpc": "2.0",
            "id": f"s{self.index}-init",
            "method": "initialize",
            "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
        }
        status, headers, _ = await self._post(body, ACCEPT)
        if status != 200:
            raise RuntimeError(f"initialize answered {status}")
        self.sid = headers["mcp-session-id"]
        status, _, _ = await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"}, self.headers())
        if status != 202:
            raise RuntimeError(f"notifications/initialized answered {status}")

    def headers(self) -> dict[str, str]:
        return {**ACCEPT, "mcp-session-id": self.sid, "mcp-protocol-version": VERSION}

    async def call(self, n: int, latencies: list[float]) -> int:
        """One tools/call; returns the events with ids received (progress + result)."""
        request_id = f"s{self.index}-{self.next_id}"
        self.next_id += 1
        body = {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "work", "arguments": {"n": n}, "_meta": {"progressToken": request_id}},
        }
        status, _, lines = await self.conn.request(body, self.headers())
        if status != 200:
            raise RuntimeError(f"tools/call answered {status}")
        events = 0
        event_id: bytes | None = None
        result: int | None = None
        async for line in lines:
            if line.startswith(b"id:"):
                event_id = line[3:].strip()
            elif line.startswith(b"data:"):
                data = line[5:].strip()
                if not data:
                    continue  # the priming event
                now = time.time()
                if event_id is None:
                    raise RuntimeError(f"an event without an id: {data[:200]!r}")
                message = json.loads(data)
                events += 1
                if message.get("method") == "notifications/progress":
                    latencies.append((now - float(message["params"]["message"])) * 1000)
                elif message.get("id") == request_id:
                    if "error" in message:
                        raise RuntimeError(f"tool call failed: {message['error']}")
                    latencies.append((now - float(message["result"]["content"][0]["text"])) * 1000)
                    result = events
                event_id = None
        if result is None:
            raise RuntimeError(f"the stream of {request_id} ended without its result")
        return result


PIDS: dict[str, dict[str, int]] = {}
"""Per side: the pid of its front-end and of its store server."""


async def run_round(sessions: list[Session], side: str, n: int) -> Round:
    latencies: list[float] = []
    # This process too: the load generator's own CPU per event.
    pids = {**PIDS.get(side, {}), "driver": os.getpid()}
    before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    start = time.perf_counter()
    counts = await asyncio.gather(*(s.call(n, latencies) for s in sessions))
    seconds = time.perf_counter() - start
    cpu = {role: cpu_seconds(pid) - before[role] for role, pid in pids.items()}
    return Round(side, sum(counts), seconds, latencies, cpu)


async def drive(urls: dict[str, str], calls: int, events: int, rounds: int) -> list[Round]:
    sessions = {side: [Session(url, i) for i in range(calls)] for side, url in urls.items()}
    try:
        for side_sessions in sessions.values():
            await asyncio.gather(*(s.initialize() for s in side_sessions))
        order = list(urls)
        for side in order:  # warm-up, not counted
            await run_round(sessions[side], side, events)
        results: list[Round] = []
        for r in range(rounds):
            for side in order if r % 2 == 0 else list(reversed(order)):
                done = await run_round(sessions[side], side, events)
                print(
                    f"round {r + 1} {side:18s} {done.events_per_s:9.0f} events/s  p50 {done.pct(0.5):7.2f} ms"
                    f"  p99 {done.pct(0.99):7.2f} ms  ({done.events} events in {done.seconds:.2f}s)"
                    f"  CPU/event: front-end {done.cpu_us_per_event('frontend'):.0f} us,"
                    f" store {done.cpu_us_per_event('store'):.0f} us",
                    flush=True,
                )
                results.append(done)
        return results
    finally:
        for side_sessions in sessions.values():
            for s in side_sessions:
                s.conn.close()


def summarize(results: list[Round]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for side in sorted({r.side for r in results}):
        mine = [r for r in results if r.side == side]
        out[side] = {
            "events_per_s": statistics.median(r.events_per_s for r in mine),
            "p50_ms": statistics.median(r.pct(0.5) for r in mine),
            "p99_ms": statistics.median(r.pct(0.99) for r in mine),
            "frontend_cpu_us_per_event": statistics.median(r.cpu_us_per_event("frontend") for r in mine),
            "store_cpu_us_per_event": statistics.median(r.cpu_us_per_event("store") for r in mine),
            "driver_cpu_us_per_event": statistics.median(r.cpu_us_per_event("driver") for r in mine),
            "rounds": len(mine),
            "events_per_s_each_round": [r.events_per_s for r in mine],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cursorlog-bin", required=True)
    parser.add_argument("--redis-bin", default=shutil.which("redis-server") or "redis-server")
    parser.add_argument("--workdir", default=None, help="data directories (default: a temp dir under ./target)")
    parser.add_argument("--calls", type=int, default=200, help="concurrent tool calls (one session each)")
    parser.add_argument("--events", type=int, default=20, help="progress notifications per call")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per side")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="front-end event loop")
    parser.add_argument("--max-in-flight", type=int, default=1)
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--sides", default="cursorlog,redis")
    parser.add_argument("--json", default=None, help="write the summary here")
    args = parser.parse_args()

    base = Path(args.workdir) if args.workdir else Path.cwd() / "target"
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cursorlog-bench-", dir=base))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        urls: dict[str, str] = {}
        sides = args.sides.split(",")
        front = [sys.executable, str(HERE / "frontend.py"), "--loop", args.loop]
        variants = [s for s in sides if s.startswith("cursorlog")]
        if variants:
            log = (work / "cursorlog.log").open("wb")
            cl = subprocess.Popen(
                [
                    args.cursorlog_bin,
                    "serve",
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    str(work / "cl"),
                    "--sync",
                    "always",
                ],
                stdout=subprocess.PIPE,
                stderr=log,
            )
            procs.append(cl)
            assert cl.stdout is not None
            line = cl.stdout.readline().decode()
            match = re.search(r"listening on (\S+)", line)
            if not match:
                raise RuntimeError(f"cursorlog printed {line!r}")
        for side in variants:
            # cursorlog[-noverify][-mifN]: the store's levers, each its own front-end.
            verify = "noverify" not in side and not args.no_verify
            mif = re.search(r"mif(\d+)", side)
            in_flight = int(mif.group(1)) if mif else args.max_in_flight
            port = free_port()
            extra = ["--max-in-flight", str(in_flight)] + ([] if verify else ["--no-verify"])
            fe = subprocess.Popen(
                [*front, "--port", str(port), "--store", "cursorlog", "--cursorlog", match.group(1), *extra]
            )
            procs.append(fe)
            wait_port(port, fe, f"{side} front-end")
            urls[side] = f"http://127.0.0.1:{port}/mcp"
            PIDS[side] = {"frontend": fe.pid, "store": cl.pid}
        if "redis" in sides:
            rport = free_port()
            (work / "redis").mkdir()
            rd = subprocess.Popen(
                [
                    args.redis_bin,
                    "--port",
                    str(rport),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    str(work / "redis"),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--save",
                    "",
                    "--daemonize",
                    "no",
                ],
                stdout=subprocess.DEVNULL,
            )
            procs.append(rd)
            wait_port(rport, rd, "redis-server")
            port = free_port()
            fe = subprocess.Popen(
                [*front, "--port", str(port), "--store", "redis", "--redis", f"redis://127.0.0.1:{rport}/0"]
            )
            procs.append(fe)
            wait_port(port, fe, "redis front-end")
            urls["redis"] = f"http://127.0.0.1:{port}/mcp"
            PIDS["redis"] = {"frontend": fe.pid, "store": rd.pid}
        if "memory" in sides:
            port = free_port()
            fe = subprocess.Popen([*front, "--port", str(port), "--store", "memory"])
            procs.append(fe)
            wait_port(port, fe, "memory front-end")
            urls["memory"] = f"http://127.0.0.1:{port}/mcp"
            PIDS["memory"] = {"frontend": fe.pid}
        results = asyncio.run(drive(urls, args.calls, args.events, args.rounds))
        summary = summarize(results)
        print(json.dumps(summary, indent=2))
        if "cursorlog" in summary and "redis" in summary:
            c, r = summary["cursorlog"], summary["redis"]
            print(
                f"cursorlog/redis throughput {c['events_per_s'] / r['events_per_s']:.2f}x, "
                f"p99 {c['p99_ms']:.1f} vs {r['p99_ms']:.1f} ms, p50 {c['p50_ms']:.1f} vs {r['p50_ms']:.1f} ms"
            )
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary}, indent=2))
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
