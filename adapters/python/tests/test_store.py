"""The store against the real cursorlog binary: session isolation and the verdict → behaviour
mapping of ``replay_events_after``."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import anyio
import pytest
from mcp.server.streamable_http import GET_STREAM_KEY, EventMessage
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCNotification, JSONRPCResponse

from cursorlog_mcp import CursorlogClient, CursorlogEventStore, SessionBindingError, SessionEventStore
from cursorlog_mcp._proto import cursorlog_pb2 as pb
from cursorlog_mcp.errors import PRODUCER_ABORTED, RESUME_DISCONTINUITY
from cursorlog_mcp.resume import (
    SESSION_INIT_CORRELATION,
    correlation_for_request,
    request_id_from_correlation,
)
from cursorlog_mcp.record import InitCapture

from .harness import CursorlogServer

pytestmark = pytest.mark.anyio


def progress(token: Any, n: int) -> JSONRPCNotification:
    return JSONRPCNotification(
        jsonrpc="2.0", method="notifications/progress", params={"progressToken": token, "progress": n}
    )


def result(request_id: Any, text: str) -> JSONRPCResponse:
    return JSONRPCResponse(jsonrpc="2.0", id=request_id, result={"content": [{"type": "text", "text": text}]})


def stream_of(cursor: str) -> int:
    return int(cursor.split("-")[1])


class Collector:
    def __init__(self) -> None:
        self.events: list[EventMessage] = []
        self.arrived = anyio.Event()

    async def __call__(self, event: EventMessage) -> None:
        self.events.append(event)
        self.arrived.set()

    @property
    def ids(self) -> list[str | None]:
        return [e.event_id for e in self.events]

    @property
    def messages(self) -> list[JSONRPCMessage]:
        return [e.message for e in self.events]

    def only_error(self) -> JSONRPCError:
        assert len(self.events) == 1, f"expected exactly one error response, got {self.messages}"
        (event,) = self.events
        assert isinstance(event.message, JSONRPCError), event.message
        assert event.event_id is None
        aborted = event.message.error.data["reason"] in ("producer_aborted", "stream_superseded")
        assert event.message.error.code == (PRODUCER_ABORTED if aborted else RESUME_DISCONTINUITY)
        return event.message


async def replay(store: SessionEventStore, cursor: str, timeout_s: float = 10.0) -> tuple[Collector, Any]:
    collector = Collector()
    with anyio.fail_after(timeout_s):
        returned = await store.replay_events_after(cursor, collector)
    return collector, returned


# -- isolation ------------------------------------------------------------------------------------


async def assert_sessions_isolated(a: SessionEventStore, b: SessionEventStore, client: CursorlogClient) -> None:
    """The isolation contract, checked from both the SDK's and cursorlog's side."""
    # The SDK uses the same stream ids in every session: request ids and the GET stream.
    prime_a = await a.store_event("1", None)
    prime_b = await b.store_event("1", None)
    assert stream_of(prime_a) != stream_of(prime_b), "same SDK stream id of two sessions shares a cursorlog stream"
    a1 = await a.store_event("1", progress(1, 1))
    b1 = await b.store_event("1", progress(1, 101))
    get_a = await a.store_event(GET_STREAM_KEY, progress("ga", 1))
    get_b = await b.store_event(GET_STREAM_KEY, progress("gb", 1))
    assert stream_of(get_a) != stream_of(get_b), "_GET_stream of two sessions shares a cursorlog stream"

    # cursorlog sees each stream under the real MCP session id, and only there.
    for cursor, owner, other in ((a1, a, b), (b1, b, a), (get_a, a, b), (get_b, b, a)):
        mine = await client.resolve(owner.session_id, cursor)
        assert mine.verdict == pb.RESUMABLE, (cursor, owner.session_id, pb.Verdict.Name(mine.verdict))
        theirs = await client.resolve(other.session_id, cursor)
        assert theirs.verdict == pb.UNKNOWN_CURSOR, (cursor, other.session_id, pb.Verdict.Name(theirs.verdict))

    # Session B presenting A's cursors gets an explicit error and nothing of A.
    for foreign in (prime_a, a1, get_a):
        seen, returned = await replay(b, foreign, timeout_s=5)
        assert returned is None
        error = seen.only_error()
        assert error.error.data["verdict"] == "UNKNOWN_CURSOR"
        assert "101" not in json.dumps(error.model_dump()) and "ga" not in str(error.error.data.get("detail"))


async def test_sessions_are_isolated(root: CursorlogEventStore, client: CursorlogClient) -> None:
    a = root.for_session(f"iso-a-{uuid.uuid4().hex}")
    b = root.for_session(f"iso-b-{uuid.uuid4().hex}")
    await assert_sessions_isolated(a, b, client)


class _SessionRewritingClient:
    """A broken binding: forwards every cursorlog call under one shared session id."""

    def __init__(self, inner: CursorlogClient, shared: str) -> None:
        self._inner = inner
        self._shared = shared

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        def call(session: str, *args: Any, **kwargs: Any) -> Any:
            return method(self._shared, *args, **kwargs)

        return call


async def test_isolation_check_catches_a_wrong_session(root: CursorlogEventStore, client: CursorlogClient) -> None:
    """The isolation test above fails if the wrapper passes a wrong session id to cursorlog."""
    shared = f"shared-{uuid.uuid4().hex}"
    a = root.for_session(f"iso-a-{uuid.uuid4().hex}")
    b = root.for_session(f"iso-b-{uuid.uuid4().hex}")
    a._client = b._client = _SessionRewritingClient(root.client, shared)  # type: ignore[assignment]
    with pytest.raises(AssertionError):
        await assert_sessions_isolated(a, b, client)


async def test_root_store_refuses_unbound_use(root: CursorlogEventStore) -> None:
    with pytest.raises(SessionBindingError, match="unbound root store"):
        await root.store_event("1", None)
    with pytest.raises(SessionBindingError, match="unbound root store"):
        await root.replay_events_after("1-1-1", Collector())


def test_request_correlations_cannot_take_reserved_names() -> None:
    assert correlation_for_request("7") == "7"
    assert correlation_for_request(SESSION_INIT_CORRELATION) != SESSION_INIT_CORRELATION
    assert request_id_from_correlation(correlation_for_request(SESSION_INIT_CORRELATION)) == SESSION_INIT_CORRELATION
    assert request_id_from_correlation("7") == 7
    assert request_id_from_correlation("007") == "007"
    assert request_id_from_correlation("req-a") == "req-a"
    assert request_id_from_correlation(SESSION_INIT_CORRELATION) is None
    assert request_id_from_correlation(None) is None


# -- verdict → behaviour --------------------------------------------------------------------------


async def test_resumable_replays_then_follows_live_appends_to_the_end(root: CursorlogEventStore) -> None:
    producer = root.for_session(f"v-{uuid.uuid4().hex}")
    start = await producer.store_event("5", None)
    assert start.endswith("-0")
    e1 = await producer.store_event("5", progress(5, 1))
    e2 = await producer.store_event("5", progress(5, 2))
    # Another replica resumes: a store bound to the same session, sharing nothing in memory.
    resumer = root.for_session(producer.session_id)
    seen = Collector()
    async with anyio.create_task_group() as tg:
        returned: list[Any] = []

        async def resume() -> None:
            returned.append(await resumer.replay_events_after(e1, seen))

        tg.start_soon(resume)
        with anyio.fail_after(5):
            await seen.arrived.wait()  # e2 replayed; the follow is now live
        e3 = await producer.store_event("5", progress(5, 3))
        done = await producer.store_event("5", result(5, "done"))
    assert returned == [None]
    assert seen.ids == [e2, e3, done]
    assert [m.model_dump(exclude_unset=True) for m in seen.messages] == [
        progress(5, 2).model_dump(exclude_unset=True),
        progress(5, 3).model_dump(exclude_unset=True),
        result(5, "done").model_dump(exclude_unset=True),
    ]
    # From the priming cursor the whole stream replays, exactly once.
    again, _ = await replay(resumer, start)
    assert again.ids == [done]  # terminated: only the outcome, see the next test


async def test_terminated_stream_delivers_only_the_stored_outcome_under_its_id(root: CursorlogEventStore) -> None:
    store = root.for_session(f"v-{uuid.uuid4().hex}")
    await store.store_event("9", None)
    e1 = await store.store_event("9", progress(9, 1))
    await store.store_event("9", progress(9, 2))
    terminal = await store.store_event("9", result(9, "the result"))
    seen, returned = await replay(store, e1)
    assert returned is None
    assert seen.ids == [terminal]
    assert seen.messages[0].model_dump(exclude_unset=True) == result(9, "the result").model_dump(exclude_unset=True)
    # At the terminal seq the client has everything: clean end, nothing sent.
    at_end, returned = await replay(store, terminal)
    assert (at_end.events, returned) == ([], None)


async def test_evicted_cursor_ends_the_call_with_an_explicit_error(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    store = root.for_session(f"v-{uuid.uuid4().hex}")
    await store.store_event("3", None)
    e1 = await store.store_event("3", progress(3, 1))
    for n in (2, 3, 4):
        await store.store_event("3", progress(3, n))
    await client.trim(store.session_id, stream_of(e1), 3)
    seen, _ = await replay(store, e1)
    error = seen.only_error()
    assert error.id == 3
    assert error.error.data["verdict"] == "CURSOR_EVICTED"
    assert error.error.data["reason"] == "cursor_evicted"
    assert error.error.data["watermark"] == 4 and error.error.data["head"] == 4
    assert error.error.data["cursor"] == e1
    assert "evicted" in error.error.message and "re-issue" in error.error.message


async def test_cursor_ahead_unknown_and_malformed_cursors_fail_explicitly(root: CursorlogEventStore) -> None:
    store = root.for_session(f"v-{uuid.uuid4().hex}")
    start = await store.store_event("4", None)
    epoch, stream, _ = start.split("-")
    cases = {
        f"{epoch}-{stream}-7": ("CURSOR_AHEAD", "cursor_ahead", 4),
        f"{epoch}-999999999-1": ("UNKNOWN_CURSOR", "unknown_cursor", None),
        "not-a-cursor": ("MALFORMED_CURSOR", "malformed_cursor", None),
    }
    for cursor, (verdict, reason, request_id) in cases.items():
        seen, _ = await replay(store, cursor)
        error = seen.only_error()
        assert (error.error.data["verdict"], error.error.data["reason"], error.id) == (verdict, reason, request_id)


async def test_epoch_mismatch_ends_cleanly(root: CursorlogEventStore, client: CursorlogClient) -> None:
    store = root.for_session(f"v-{uuid.uuid4().hex}")
    await store.store_event("2", None)
    e1 = await store.store_event("2", progress(2, 1))
    await client.advance_epoch(store.session_id)
    seen, returned = await replay(store, e1)
    assert (seen.events, returned) == ([], None)


async def test_producer_lease_expiry_ends_a_followed_call_with_the_aborted_error(cursorlog: CursorlogServer) -> None:
    # This "replica" writes with a 300 ms lease and never renews it (as if it had died).
    dead = CursorlogEventStore(cursorlog.address, lease_ms=300)
    reader = CursorlogEventStore(cursorlog.address, lease_ms=300)
    try:
        producer = dead.for_session(f"v-{uuid.uuid4().hex}")
        await producer.store_event("8", None)
        e1 = await producer.store_event("8", progress(8, 1))
        e2 = await producer.store_event("8", progress(8, 2))
        async with reader.running():
            seen, returned = await replay(reader.for_session(producer.session_id), e1, timeout_s=5)
        assert returned is None
        assert seen.ids[0] == e2
        error = seen.messages[1]
        assert isinstance(error, JSONRPCError) and len(seen.events) == 2
        assert error.id == 8
        assert error.error.data["reason"] == "producer_aborted"
        assert error.error.data["state"] == "ABORTED"
        assert error.error.data["detail"] == "producer lease expired"
        # A later resume gets the same answer from the tombstone (no terminal frame to deliver),
        # also from the head, which is the aborted stream's terminal seq.
        for cursor in (e1, e2):
            late, _ = await replay(reader.for_session(producer.session_id), cursor)
            assert late.only_error().error.data["reason"] == "producer_aborted", cursor
            assert late.only_error().error.data["verdict"] == "STREAM_TERMINATED"
            assert late.only_error().error.data["terminal_seq"] == 2
    finally:
        await dead.client.close()
        await reader.client.close()


async def test_keepalive_holds_the_lease_of_a_live_producer(
    cursorlog: CursorlogServer, client: CursorlogClient
) -> None:
    store = CursorlogEventStore(cursorlog.address, lease_ms=300)
    async with store.running():
        session = store.for_session(f"v-{uuid.uuid4().hex}")
        e1 = await session.store_event("1", None)
        assert (session.session_id, stream_of(e1)) in store.held_leases()
        await anyio.sleep(1.2)  # four leases long
        resolution = await client.resolve(session.session_id, e1)
        assert (pb.Verdict.Name(resolution.verdict), resolution.stream_state) == ("RESUMABLE", pb.STREAM_STATE_OPEN)
        await session.store_event("1", result(1, "ok"))
        assert store.held_leases() == []


async def test_init_record_stream_is_never_revealed(root: CursorlogEventStore, client: CursorlogClient) -> None:
    capture = InitCapture()
    capture.feed(
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"},
                },
            }
        ).encode()
    )
    store = root.for_session(f"v-{uuid.uuid4().hex}", init_capture=capture)
    await store.store_event("0", None)
    await store.store_event("0", JSONRPCResponse(jsonrpc="2.0", id=0, result={"protocolVersion": "2025-11-25"}))
    record = await root.load_session_record(store.session_id)
    assert record is not None and record.protocol_version == "2025-11-25"
    assert record.get_stream == store.get_stream
    outcome = await client.get_outcome(store.session_id, correlation=SESSION_INIT_CORRELATION)
    forged = outcome.outcome.terminal_event_id
    for cursor in (forged, forged[: forged.rindex("-")] + "-0"):
        seen, _ = await replay(store, cursor)
        assert seen.only_error().error.data["reason"] == "unknown_cursor"


async def test_every_verdict_is_logged(root: CursorlogEventStore, caplog: pytest.LogCaptureFixture) -> None:
    store = root.for_session(f"v-{uuid.uuid4().hex}")
    await store.store_event("1", None)
    cursor = await store.store_event("1", progress(1, 1))
    await store.store_event("1", result(1, "x"))
    with caplog.at_level(logging.INFO, logger="cursorlog_mcp.resume"):
        await replay(store, cursor)
        await replay(store, "garbage")
    lines = [r.getMessage() for r in caplog.records if r.name == "cursorlog_mcp.resume"]
    assert any(
        f"session={store.session_id}" in line
        and f"cursor={cursor}" in line
        and "verdict=STREAM_TERMINATED" in line
        and '"terminal_seq": 2' in line
        for line in lines
    ), lines
    assert any("cursor=garbage" in line and "verdict=MALFORMED_CURSOR" in line for line in lines), lines


async def test_client_without_priming_gets_a_stream_on_the_first_message(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    """Clients older than 2025-11-25 get no priming event: the stream opens lazily."""
    store = root.for_session(f"v-{uuid.uuid4().hex}")
    e1 = await store.store_event("11", progress(11, 1))
    assert e1.endswith("-1")
    done = await store.store_event("11", result(11, "ok"))
    assert stream_of(done) == stream_of(e1)
    outcome = await client.get_outcome(store.session_id, correlation="11")
    assert outcome.found and outcome.outcome.state == pb.STREAM_STATE_COMPLETED
    assert outcome.outcome.terminal_event_id == done


async def test_reused_request_id_gets_a_new_stream_and_ends_the_old_one(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    store = root.for_session(f"v-{uuid.uuid4().hex}")
    first = await store.store_event("1", None)
    old = await store.store_event("1", progress(1, 1))
    second = await store.store_event("1", None)
    assert stream_of(second) != stream_of(first)
    seen, _ = await replay(store, old)
    error = seen.only_error()
    assert (error.error.data["reason"], error.error.data["detail"]) == (
        "producer_aborted",
        "request id reused by a new request",
    )
    assert (store.session_id, stream_of(first)) not in root.held_leases()


async def test_standalone_stream_gap_is_announced_then_followed_from_its_head(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    """No pending call on the GET stream: a warning notification, then live messages."""
    store = root.for_session(f"v-{uuid.uuid4().hex}")
    g1 = await store.store_event(GET_STREAM_KEY, progress("g", 1))
    for n in (2, 3, 4):
        await store.store_event(GET_STREAM_KEY, progress("g", n))
    await client.trim(store.session_id, stream_of(g1), 3)
    seen = Collector()
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.replay_events_after, g1, seen)
        with anyio.fail_after(5):
            await seen.arrived.wait()
        notice = seen.messages[0]
        assert isinstance(notice, JSONRPCNotification) and notice.method == "notifications/message"
        assert notice.params is not None and notice.params["data"]["reason"] == "cursor_evicted"
        await anyio.sleep(0.2)  # following from the head now: g4 is not replayed
        live = await store.store_event(GET_STREAM_KEY, progress("g", 5))
        with anyio.fail_after(5):
            while len(seen.events) < 2:
                await anyio.sleep(0.01)
        await client.expire_session(store.session_id)  # ends the standalone stream (ABORTED)
    assert seen.ids == [None, live]
    assert seen.messages[1].model_dump(exclude_unset=True) == progress("g", 5).model_dump(exclude_unset=True)


async def test_aborted_stream_with_a_terminal_frame_delivers_it_once(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    store = root.for_session(f"v-{uuid.uuid4().hex}")
    await store.store_event("6", None)
    e1 = await store.store_event("6", progress(6, 1))
    failure = JSONRPCError(jsonrpc="2.0", id=6, error={"code": -32603, "message": "gave up"})
    aborted = await client.abort(
        store.session_id,
        stream_of(e1),
        "operator abort",
        terminal=pb.NewEvent(kind="error", payload=failure.model_dump_json(by_alias=True, exclude_unset=True).encode()),
    )
    seen, _ = await replay(store, e1)
    assert seen.ids == [aborted.terminal_event_id]
    assert seen.messages[0].model_dump(exclude_unset=True) == failure.model_dump(exclude_unset=True)
    at_frame, _ = await replay(store, aborted.terminal_event_id)
    assert at_frame.events == []  # the client has the frame: no duplicate
