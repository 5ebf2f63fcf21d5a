"""End to end: the SDK's own client, two SDK server replicas (uvicorn) using cursorlog-mcp,
the real cursorlog binary, and a proxy in front that moves the client from replica A to B and
cuts its live connections mid-call."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ClientMessageMetadata

from cursorlog_mcp import CursorlogClient
from cursorlog_mcp.errors import PRODUCER_ABORTED, RESUME_DISCONTINUITY

from .harness import CursorlogServer, Replica, SwitchableProxy

pytestmark = pytest.mark.anyio

PROTOCOL = "2025-11-25"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def exec_log(workdir: Path) -> Path:
    return workdir / "executions.log"


@pytest.fixture(scope="module")
def replicas(cursorlog: CursorlogServer, workdir: Path, exec_log: Path) -> Iterator[dict[str, Replica]]:
    started: dict[str, Replica] = {}
    try:
        for name in ("A", "B"):
            started[name] = Replica(name, cursorlog.address, workdir, exec_log=exec_log)
        yield started
    finally:
        for replica in started.values():
            replica.stop()


@pytest.fixture
def proxy() -> Iterator[SwitchableProxy]:
    p = SwitchableProxy()
    try:
        yield p
    finally:
        p.close()


def executions(exec_log: Path, call_id: str) -> list[str]:
    if not exec_log.exists():
        return []
    return [line for line in exec_log.read_text().splitlines() if line.endswith(f" {call_id}")]


class Seen:
    """What one call delivered to the client."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.progress: list[float] = []

    async def on_token(self, token: str) -> None:
        self.tokens.append(token)

    async def on_progress(self, value: float, total: float | None, message: str | None) -> None:
        self.progress.append(value)


@asynccontextmanager
async def mcp_session(
    url: str,
    *,
    headers: dict[str, str] | None = None,
    terminate_on_close: bool = True,
    logging_callback: Any = None,
) -> AsyncIterator[tuple[ClientSession, dict[str, str]]]:
    """The SDK client over its own httpx2 client; the dict receives the Mcp-Session-Id."""
    ids: dict[str, str] = {}

    async def remember(response: httpx2.Response) -> None:
        if sid := response.headers.get("mcp-session-id"):
            ids["session"] = sid

    http = httpx2.AsyncClient(
        timeout=httpx2.Timeout(30, read=60), headers=headers, event_hooks={"response": [remember]}
    )
    async with (
        http,
        streamable_http_client(url, http_client=http, terminate_on_close=terminate_on_close) as (read, write),
        ClientSession(read, write, logging_callback=logging_callback) as session,
    ):
        yield session, ids


def call_request(call_id: str, steps: int, delay_s: float) -> types.CallToolRequest:
    return types.CallToolRequest(
        params=types.CallToolRequestParams(
            name="slow_count", arguments={"call_id": call_id, "steps": steps, "delay_s": delay_s}
        )
    )


async def call_slow_count(
    session: ClientSession,
    call_id: str,
    seen: Seen,
    *,
    steps: int,
    delay_s: float,
    on_progress: Callable[[float], Any] | None = None,
) -> types.CallToolResult:
    async def progress(value: float, total: float | None, message: str | None) -> None:
        await seen.on_progress(value, total, message)
        if on_progress is not None:
            await on_progress(value)

    return await session.send_request(
        call_request(call_id, steps, delay_s),
        types.CallToolResult,
        metadata=ClientMessageMetadata(on_resumption_token_update=seen.on_token),
        progress_callback=progress,
    )


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def stream_of(token: str) -> int:
    return int(token.split("-")[1])


def seq_of(token: str) -> int:
    return int(token.split("-")[2])


async def test_cut_mid_call_resumes_on_the_other_replica_exactly_once(
    replicas: dict[str, Replica], proxy: SwitchableProxy, exec_log: Path
) -> None:
    a, b = replicas["A"], replicas["B"]
    proxy.route(a.port)
    call_id = uuid.uuid4().hex
    seen = Seen()
    cut = anyio.Event()

    async def cut_after_two(value: float) -> None:
        if value == 2 and not cut.is_set():
            # A keeps running the tool. The client's connections die; its reconnect waits in
            # the proxy while A appends more, then goes to B, which must replay what was missed
            # from cursorlog and follow the rest live.
            proxy.pause()
            assert proxy.cut() >= 1
            cut.set()

    async with mcp_session(proxy.url) as (session, ids):
        await session.initialize()
        async with anyio.create_task_group() as tg:

            async def reroute() -> None:
                await cut.wait()
                await anyio.sleep(0.6)  # about four progress events are missed meanwhile
                proxy.route(b.port)

            tg.start_soon(reroute)
            with anyio.fail_after(30):
                result = await call_slow_count(
                    session, call_id, seen, steps=10, delay_s=0.15, on_progress=cut_after_two
                )
        # The session itself now lives on B too: a new call is served there.
        who = await session.call_tool("whoami", {})
        assert text_of(who) == "B"

    assert text_of(result) == f"{call_id}: counted to 10 on A"
    assert seen.progress == [float(i) for i in range(1, 11)], "every progress notification exactly once, in order"
    assert executions(exec_log, call_id) == [f"A slow_count {call_id}"], "the tool ran once, on A"
    # Resumption tokens are cursorlog cursors of one stream, strictly increasing: nothing
    # replayed twice, nothing skipped (priming seq 0, progress 1..10, result 11).
    assert len({stream_of(t) for t in seen.tokens}) == 1
    assert [seq_of(t) for t in seen.tokens] == list(range(0, 12))
    assert proxy.connections[b.port] >= 1
    b_log = b.log_text()
    assert f"session {ids['session']}: restored from cursorlog" in b_log
    # B resumed from the last event the client had before the cut (progress 2, or 3 if it was
    # already in flight), so the events A appended during the pause came from cursorlog.
    resumed = re.findall(rf"session={ids['session']} cursor=(\S+) verdict=RESUMABLE .*stream_kind=request", b_log)
    assert len(resumed) == 1 and resumed[0] in seen.tokens and 2 <= seq_of(resumed[0]) <= 4, resumed


async def test_standalone_stream_carries_messages_from_any_replica(
    replicas: dict[str, Replica], proxy: SwitchableProxy
) -> None:
    """The client's GET stream is served by B; a server notification produced on A reaches it."""
    a, b = replicas["A"], replicas["B"]
    proxy.route(b.port)
    received: list[Any] = []
    arrived = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            received.append(message)
            arrived.set()

    http = httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60))
    ids: dict[str, str] = {}

    async def remember(response: httpx2.Response) -> None:
        if sid := response.headers.get("mcp-session-id"):
            ids["session"] = sid

    http.event_hooks["response"].append(remember)
    async with (
        http,
        streamable_http_client(proxy.url, http_client=http) as (read, write),
        ClientSession(read, write, message_handler=on_message) as session,
    ):
        await session.initialize()
        await anyio.sleep(0.5)  # the client opens its GET stream (on B) after `initialized`
        headers = {
            "mcp-session-id": ids["session"],
            "mcp-protocol-version": PROTOCOL,
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
        }
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "announce", "arguments": {}}}
        async with httpx.AsyncClient(timeout=10) as direct:
            response = await direct.post(a.url, json=body, headers=headers)  # A restores the session
            assert response.status_code == 200 and "announced by A" in response.text
        with anyio.fail_after(10):
            await arrived.wait()
    assert len(received) == 1


async def test_explicit_resumption_token_from_a_new_client(
    replicas: dict[str, Replica], proxy: SwitchableProxy, exec_log: Path
) -> None:
    """A client that lost its process resumes the call with `resumption_token` on B."""
    a, b = replicas["A"], replicas["B"]
    proxy.route(a.port)
    call_id = uuid.uuid4().hex
    first = Seen()
    gone = anyio.Event()

    async def lose_connection(value: float) -> None:
        if value == 3:
            gone.set()

    async with mcp_session(proxy.url, terminate_on_close=False) as (session, ids):
        await session.initialize()
        async with anyio.create_task_group() as tg:

            async def doomed_call() -> None:
                await call_slow_count(session, call_id, first, steps=8, delay_s=0.15, on_progress=lose_connection)

            tg.start_soon(doomed_call)
            await gone.wait()
            proxy.pause()  # the client's reconnects hang in the proxy...
            proxy.cut()
            tg.cancel_scope.cancel()  # ...and the client process "dies"
    token = first.tokens[-1]
    assert 3 <= seq_of(token) < 8

    proxy.route(b.port)
    second = Seen()
    headers = {"mcp-session-id": ids["session"], "mcp-protocol-version": PROTOCOL}
    async with mcp_session(proxy.url, headers=headers) as (resumed, _):
        with anyio.fail_after(30):
            result = await resumed.send_request(
                call_request(call_id, 8, 0.15),
                types.CallToolResult,
                metadata=ClientMessageMetadata(resumption_token=token, on_resumption_token_update=second.on_token),
            )
    assert text_of(result) == f"{call_id}: counted to 8 on A"
    # Every event after the token, once: the remaining progress and the result (seq 9).
    assert [seq_of(t) for t in second.tokens] == list(range(seq_of(token) + 1, 10))
    assert {stream_of(t) for t in second.tokens} == {stream_of(token)}
    assert executions(exec_log, call_id) == [f"A slow_count {call_id}"]


async def _evict_mid_call(
    a: Replica,
    b: Replica,
    proxy: SwitchableProxy,
    cursorlog: CursorlogServer,
    seen: Seen,
    logs: list[Any],
    evicted_after: list[str],
) -> types.CallToolResult | MCPError:
    """Cut the client at progress 3, evict two events past its cursor, resume on ``b``."""
    proxy.route(a.port)
    call_id = uuid.uuid4().hex
    log = CursorlogClient(cursorlog.address)
    cut = anyio.Event()

    async def cut_at_three(value: float) -> None:
        if value == 3 and not cut.is_set():
            proxy.pause()
            proxy.cut()
            cut.set()

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    try:
        async with mcp_session(proxy.url, logging_callback=on_log) as (session, ids):
            await session.initialize()
            async with anyio.create_task_group() as tg:

                async def evict_then_route() -> None:
                    await cut.wait()
                    token = seen.tokens[-1]
                    evicted_after.append(token)
                    # Let A append past the client's cursor, then evict beyond it.
                    await anyio.sleep(0.6)
                    await log.trim(ids["session"], stream_of(token), seq_of(token) + 2)
                    proxy.route(b.port)

                tg.start_soon(evict_then_route)
                with anyio.fail_after(30):
                    try:
                        return await call_slow_count(
                            session, call_id, seen, steps=30, delay_s=0.1, on_progress=cut_at_three
                        )
                    except MCPError as e:
                        return e
    finally:
        await log.close()


async def test_evicted_cursor_marks_the_gap_then_delivers_the_rest_and_the_result(
    replicas: dict[str, Replica], proxy: SwitchableProxy, cursorlog: CursorlogServer
) -> None:
    seen, logs, cursors = Seen(), [], []
    result = await _evict_mid_call(replicas["A"], replicas["B"], proxy, cursorlog, seen, logs, cursors)
    assert isinstance(result, types.CallToolResult), result
    assert text_of(result).endswith("counted to 30 on A"), "the pending call got its real result"
    (cursor,) = cursors
    at = seq_of(cursor)
    gaps = [entry for entry in logs if entry.logger == "cursorlog"]
    assert len(gaps) == 1, logs
    gap = gaps[0]
    assert gap.level == "warning"
    assert gap.data["verdict"] == "CURSOR_EVICTED" and gap.data["reason"] == "cursor_evicted"
    assert gap.data["cursor"] == cursor
    assert gap.data["watermark"] == at + 3 and gap.data["lostSeqs"] == [at + 1, at + 2]
    # Progress i is seq i: up to the cursor before the cut, two evicted, the rest after the marker.
    assert seen.progress == [float(i) for i in range(1, at + 1)] + [float(i) for i in range(at + 3, 31)]


async def test_evicted_cursor_can_end_the_call_with_an_explicit_error_instead(
    replicas: dict[str, Replica], proxy: SwitchableProxy, cursorlog: CursorlogServer, workdir: Path, exec_log: Path
) -> None:
    strict = Replica("C", cursorlog.address, workdir, exec_log=exec_log, extra_args=("--on-evicted", "error"))
    try:
        seen, logs, cursors = Seen(), [], []
        raised = await _evict_mid_call(replicas["A"], strict, proxy, cursorlog, seen, logs, cursors)
    finally:
        strict.stop()
    assert isinstance(raised, MCPError), raised
    error = raised.error
    assert error.code == RESUME_DISCONTINUITY
    assert error.data["verdict"] == "CURSOR_EVICTED"
    assert error.data["reason"] == "cursor_evicted"
    assert error.data["cursor"] == seen.tokens[-1]
    assert error.data["watermark"] == seq_of(seen.tokens[-1]) + 3
    assert "evicted" in error.message and "reconcile" in error.message
    # The client got exactly the progress up to its cursor (progress i is seq i), then the error.
    assert seen.progress == [float(i) for i in range(1, seq_of(seen.tokens[-1]) + 1)]
    assert not [entry for entry in logs if entry.logger == "cursorlog"]


async def test_cursor_of_another_session_ends_the_call_with_an_explicit_error(
    replicas: dict[str, Replica], proxy: SwitchableProxy, exec_log: Path
) -> None:
    a, b = replicas["A"], replicas["B"]
    proxy.route(a.port)
    call_id = uuid.uuid4().hex
    victim = Seen()
    async with mcp_session(proxy.url) as (session, _):
        await session.initialize()
        await call_slow_count(session, call_id, victim, steps=3, delay_s=0.01)
    foreign = victim.tokens[1]  # a progress event of the other session's call

    proxy.route(b.port)
    seen = Seen()
    async with mcp_session(proxy.url) as (attacker, _):
        await attacker.initialize()
        with pytest.raises(MCPError) as raised, anyio.fail_after(15):
            await attacker.send_request(
                call_request(call_id, 3, 0.01),
                types.CallToolResult,
                metadata=ClientMessageMetadata(resumption_token=foreign, on_resumption_token_update=seen.on_token),
            )
    error = raised.value.error
    assert error.code == RESUME_DISCONTINUITY
    assert error.data["verdict"] == "UNKNOWN_CURSOR"
    assert error.data["reason"] == "unknown_cursor"
    assert "does not name a stream of this session" in error.message
    # Nothing of the other session leaked: no facts of its stream, no events.
    assert set(error.data) <= {"verdict", "reason", "cursor", "current_epoch"}
    assert seen.tokens == []
    assert executions(exec_log, call_id) == [f"A slow_count {call_id}"]


@pytest.mark.parametrize("resume", ["while_following", "after_lease_expiry"])
async def test_killed_producer_ends_the_resumed_call_within_the_lease(
    replicas: dict[str, Replica],
    proxy: SwitchableProxy,
    cursorlog: CursorlogServer,
    workdir: Path,
    exec_log: Path,
    resume: str,
) -> None:
    """SIGKILL the replica running the tool. Either the client is already following on B when
    the lease runs out (the follow ends ABORTED), or it comes back only afterwards with a cursor
    at the aborted stream's head (its terminal seq, with no terminal frame)."""
    lease_s = 1.5
    doomed = Replica(f"A2-{resume}", cursorlog.address, workdir, exec_log=exec_log, lease_ms=int(lease_s * 1000))
    b = replicas["B"]
    try:
        proxy.route(doomed.port)
        call_id = uuid.uuid4().hex
        seen = Seen()
        killed = anyio.Event()
        killed_at: list[float] = []

        async def kill_at_two(value: float) -> None:
            if value == 2 and not killed.is_set():
                if resume == "while_following":
                    proxy.route(b.port)
                else:
                    proxy.pause()
                doomed.kill()  # SIGKILL mid-call: no Complete, no Abort, no more keep-alives
                killed_at.append(time.monotonic())
                killed.set()

        async with mcp_session(proxy.url) as (session, _):
            await session.initialize()
            async with anyio.create_task_group() as tg:
                if resume == "after_lease_expiry":

                    async def route_late() -> None:
                        await killed.wait()
                        await anyio.sleep(lease_s + 0.5)
                        proxy.route(b.port)

                    tg.start_soon(route_late)
                with pytest.raises(MCPError) as raised, anyio.fail_after(30):
                    await call_slow_count(session, call_id, seen, steps=20, delay_s=0.2, on_progress=kill_at_two)
            ended_at = time.monotonic()
    finally:
        doomed.kill()
    error = raised.value.error
    assert error.code == PRODUCER_ABORTED
    assert error.data["reason"] == "producer_aborted"
    assert error.data["state"] == "ABORTED"
    assert error.data["detail"] == "producer lease expired"
    expected_verdict = "RESUMABLE" if resume == "while_following" else "STREAM_TERMINATED"
    assert error.data["verdict"] == expected_verdict
    assert "Re-issue the request" in error.message
    # Lease + lease check tick + the client's reconnect delay (+ the deliberate late routing),
    # with slack for a loaded machine.
    bound = lease_s + 3.0 + (lease_s + 0.5 if resume == "after_lease_expiry" else 0.0)
    assert ended_at - killed_at[0] < bound, ended_at - killed_at[0]
    assert seen.progress[:2] == [1.0, 2.0]
    assert executions(exec_log, call_id) == [f"A2-{resume} slow_count {call_id}"]


async def test_delete_on_one_replica_ends_the_session_on_every_replica(
    replicas: dict[str, Replica], proxy: SwitchableProxy
) -> None:
    a, b = replicas["A"], replicas["B"]
    proxy.route(a.port)
    async with mcp_session(proxy.url) as (session, ids):  # DELETE on exit
        await session.initialize()
        assert text_of(await session.call_tool("whoami", {})) == "A"
        proxy.route(b.port)
        proxy.cut()
        assert text_of(await session.call_tool("whoami", {})) == "B"  # restored on B
    # The DELETE went to B; A still has the session in memory but must answer 404 now.
    headers = {
        "mcp-session-id": ids["session"],
        "mcp-protocol-version": PROTOCOL,
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
    }
    body = {"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "whoami", "arguments": {}}}
    async with httpx.AsyncClient(timeout=10) as http:
        for replica in (a, b):
            response = await http.post(replica.url, json=body, headers=headers)
            assert response.status_code == 404, (replica.name, response.status_code, response.text)
        unknown = await http.post(a.url, json=body, headers={**headers, "mcp-session-id": uuid.uuid4().hex})
        assert unknown.status_code == 404
