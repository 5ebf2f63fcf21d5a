"""The store against the real cursorlog binary: session isolation, the verdict → behaviour
mapping of ``replay_events_after`` (the corrected table of DESIGN.md), and loud failures.

``Bound`` plays ``CursorlogMiddleware``'s part: it names the session of every store call the
way the middleware does for an HTTP request (a context variable). Two ``CursorlogEventStore``
instances on one cursorlog are two replicas that share nothing in memory.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import anyio
import grpc
import pytest
from mcp.server.streamable_http import GET_STREAM_KEY, EventMessage
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCNotification, JSONRPCResponse

from cursorlog_mcp import CursorlogClient, CursorlogEventStore, SessionBindingError
from cursorlog_mcp._proto import cursorlog_pb2 as pb
from cursorlog_mcp.binding import Binding, bind, unbind
from cursorlog_mcp.errors import PRODUCER_ABORTED, RESUME_DISCONTINUITY
from cursorlog_mcp.resume import correlation_for_request, request_id_from_correlation

from .harness import CursorlogServer

pytestmark = pytest.mark.anyio

INIT_BODY = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
).encode()


class Bound:
    """The store as one session's requests see it (the middleware's binding, set per call)."""

    def __init__(
        self,
        store: CursorlogEventStore,
        session_id: str | None = None,
        *,
        opening: bool = True,
        protocol_version: str | None = "2025-11-25",
    ) -> None:
        self.store = store
        self.session_id = session_id or f"v-{uuid.uuid4().hex}"
        self.binding = Binding(
            self.session_id,
            {"type": "http", "headers": []},
            opening=opening,
            protocol_version=protocol_version,
            body=bytearray(INIT_BODY),
        )

    def on(self, store: CursorlogEventStore) -> Bound:
        """The same session as seen by another replica."""
        return Bound(store, self.session_id, opening=False, protocol_version=self.binding.protocol_version)

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        token = bind(self.binding)
        try:
            return await self.store.store_event(stream_id, message)
        finally:
            unbind(token)

    async def replay_events_after(self, cursor: str, send: Any) -> Any:
        token = bind(self.binding)
        try:
            return await self.store.replay_events_after(cursor, send)
        finally:
            unbind(token)


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


async def replay(store: Bound, cursor: str, timeout_s: float = 10.0) -> tuple[Collector, Any]:
    collector = Collector()
    with anyio.fail_after(timeout_s):
        returned = await store.replay_events_after(cursor, collector)
    return collector, returned


# -- isolation ------------------------------------------------------------------------------------


async def assert_sessions_isolated(a: Bound, b: Bound, client: CursorlogClient) -> None:
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

    # cursorlog sees each stream under the MCP session id, and only there.
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
    await assert_sessions_isolated(Bound(root), Bound(root), client)


async def test_isolation_check_catches_a_wrong_session(root: CursorlogEventStore, client: CursorlogClient) -> None:
    """Mutation check: a binding that names the wrong session must fail the isolation check."""
    a = Bound(root)
    confused = Bound(root)
    confused.binding = a.binding  # session B's calls made under session A's binding
    with pytest.raises(AssertionError):
        await assert_sessions_isolated(a, confused, client)


async def test_unbound_use_is_refused(root: CursorlogEventStore) -> None:
    with pytest.raises(SessionBindingError, match="CursorlogMiddleware"):
        await root.store_event("1", None)
    with pytest.raises(SessionBindingError):
        await root.replay_events_after("1-1-1", Collector())


def test_request_correlations_cannot_take_reserved_names() -> None:
    assert correlation_for_request("7") == "7"
    assert correlation_for_request("mcp:standalone") == "mcp:req:mcp:standalone"
    assert request_id_from_correlation("mcp:req:mcp:standalone") == "mcp:standalone"
    assert request_id_from_correlation("mcp:standalone") is None
    assert request_id_from_correlation("12") == 12
    assert request_id_from_correlation("abc") == "abc"


async def test_session_state_lives_in_cursorlog_for_any_replica(
    root: CursorlogEventStore, cursorlog: CursorlogServer
) -> None:
    a = Bound(root)
    a.binding.scope["user"] = None
    await a.store_event("0", None)
    other = CursorlogEventStore(cursorlog.address)
    try:
        state = await other.lookup_session(a.session_id)
        assert state is not None
        assert state.initialize_params == json.loads(INIT_BODY)["params"]
        assert state.owner is None and state.get_stream is not None
        assert await other.lookup_session(f"never-{uuid.uuid4().hex}") is None
        await other.end_session(a.session_id)
        assert await other.lookup_session(a.session_id) is None
    finally:
        await other.aclose()


# -- verdict → behaviour --------------------------------------------------------------------------


async def test_resumable_replays_then_follows_live_appends_to_the_end(
    root: CursorlogEventStore, cursorlog: CursorlogServer
) -> None:
    producer = Bound(root)
    start = await producer.store_event("5", None)
    assert start.endswith("-0")
    e1 = await producer.store_event("5", progress(5, 1))
    e2 = await producer.store_event("5", progress(5, 2))
    other = CursorlogEventStore(cursorlog.address)  # another replica: shares nothing in memory
    resumer = producer.on(other)
    seen = Collector()
    try:
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
    finally:
        await other.aclose()


async def test_local_stream_is_replayed_to_its_head_and_handed_back_to_the_sdk(root: CursorlogEventStore) -> None:
    """A stream this process still produces: replay up to the head, return its SDK stream id
    (so the SDK primes the connection and forwards live events), and hold the producer until
    the SDK's priming call, whose cursor is the head the replay reached."""
    session = Bound(root)
    await session.store_event("5", None)
    e1 = await session.store_event("5", progress(5, 1))
    e2 = await session.store_event("5", progress(5, 2))
    seen, returned = await replay(session, e1)
    assert returned == "5"
    assert seen.ids == [e2]
    held = anyio.Event()
    stored: list[str] = []

    async def produce() -> None:
        held.set()
        stored.append(await session.store_event("5", progress(5, 3)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        await held.wait()
        await anyio.sleep(0.1)
        assert stored == [], "the producer must wait for the SDK to take the connection over"
        priming = await session.store_event("5", None)  # what the SDK does next
        assert priming == e2
    assert stored and stored[0].endswith("-3")
    # An old client (no priming): handed back at once, the producer is not held.
    old = Bound(root, session.session_id, opening=False, protocol_version="2025-06-18")
    seen, returned = await replay(old, e2)
    assert returned == "5" and seen.ids == [stored[0]]
    done = await session.store_event("5", result(5, "ok"))
    assert done.endswith("-4")


async def test_finished_stream_replays_everything_the_client_missed_exactly_once(root: CursorlogEventStore) -> None:
    """STREAM_TERMINATED before the terminal seq, resumed by its own client: every event after
    the cursor through the terminal frame, under the original ids (DESIGN.md, corrected row)."""
    store = Bound(root)
    await store.store_event("9", None)
    e1 = await store.store_event("9", progress(9, 1))
    e2 = await store.store_event("9", progress(9, 2))
    e3 = await store.store_event("9", progress(9, 3))
    terminal = await store.store_event("9", result(9, "the result"))
    seen, returned = await replay(store, e1)
    assert returned is None
    assert seen.ids == [e2, e3, terminal]
    assert seen.messages[-1].model_dump(exclude_unset=True) == result(9, "the result").model_dump(exclude_unset=True)
    # At the terminal seq the client has everything: clean end, nothing sent.
    at_end, returned = await replay(store, terminal)
    assert (at_end.events, returned) == ([], None)


async def test_evicted_cursor_marks_the_gap_then_delivers_the_rest_and_the_result(
    root: CursorlogEventStore, client: CursorlogClient, cursorlog: CursorlogServer
) -> None:
    store = Bound(root)
    await store.store_event("3", None)
    e1 = await store.store_event("3", progress(3, 1))
    for n in (2, 3, 4):
        await store.store_event("3", progress(3, n))
    await client.trim(store.session_id, stream_of(e1), 3)
    other = CursorlogEventStore(cursorlog.address)  # resumed on another replica, still running
    seen = Collector()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.on(other).replay_events_after, e1, seen)
            with anyio.fail_after(5):
                while len(seen.events) < 2:
                    await anyio.sleep(0.01)
            done = await store.store_event("3", result(3, "still the truth"))
    finally:
        await other.aclose()
    notice = seen.messages[0]
    assert isinstance(notice, JSONRPCNotification) and notice.method == "notifications/message"
    assert seen.ids[0] is None
    assert notice.params is not None and notice.params["level"] == "warning"
    data = notice.params["data"]
    assert (data["verdict"], data["reason"], data["cursor"], data["watermark"], data["lostSeqs"]) == (
        "CURSOR_EVICTED",
        "cursor_evicted",
        e1,
        4,
        [2, 3],
    )
    assert seen.ids[1:] == [f"{e1.rsplit('-', 1)[0]}-4", done]
    # The same stream, finished meanwhile: its missed tail with the same marker.
    again, _ = await replay(store, e1)
    assert again.messages[0].params["data"]["lostSeqs"] == [2, 3]  # type: ignore[union-attr]
    assert again.messages[0].params["data"]["verdict"] == "STREAM_TERMINATED"  # type: ignore[union-attr]
    assert again.ids[1:] == seen.ids[1:]


async def test_evicted_cursor_can_end_the_call_with_an_error_instead(
    cursorlog: CursorlogServer, client: CursorlogClient
) -> None:
    strict = CursorlogEventStore(cursorlog.address, on_evicted="error")
    try:
        store = Bound(strict)
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
        assert "evicted" in error.error.message and "re-issue" in error.error.message
    finally:
        await strict.aclose()


async def test_cursor_ahead_unknown_and_malformed_cursors_fail_explicitly(root: CursorlogEventStore) -> None:
    store = Bound(root)
    start = await store.store_event("4", None)
    epoch, stream, _ = start.split("-")
    cases = {
        f"{epoch}-{stream}-7": ("CURSOR_AHEAD", "cursor_ahead", 4),
        f"{epoch}-999999999-1": ("UNKNOWN_CURSOR", "unknown_cursor", None),
        "not-a-cursor": ("MALFORMED_CURSOR", "malformed_cursor", None),
    }
    for cursor, (verdict, reason, request_id) in cases.items():
        seen, returned = await replay(store, cursor)
        assert returned is None
        error = seen.only_error()
        assert (error.error.data["verdict"], error.error.data["reason"], error.id) == (verdict, reason, request_id)


async def test_epoch_mismatch_ends_cleanly(root: CursorlogEventStore, client: CursorlogClient) -> None:
    store = Bound(root)
    await store.store_event("2", None)
    e1 = await store.store_event("2", progress(2, 1))
    await client.advance_epoch(store.session_id)
    seen, returned = await replay(store, e1)
    assert (seen.events, returned) == ([], None)


async def test_producer_lease_expiry_ends_a_followed_call_with_the_aborted_error(cursorlog: CursorlogServer) -> None:
    # This "replica" writes with a 300 ms lease and then stops renewing it (as if it had died).
    dead = CursorlogEventStore(cursorlog.address, lease_ms=300)
    reader = CursorlogEventStore(cursorlog.address, lease_ms=300)
    try:
        producer = Bound(dead)
        await producer.store_event("8", None)
        e1 = await producer.store_event("8", progress(8, 1))
        e2 = await producer.store_event("8", progress(8, 2))
        maintainer = dead._maintainer  # noqa: SLF001 - the test kills the renewals, as a crash would
        assert maintainer is not None
        maintainer.cancel()
        seen, returned = await replay(producer.on(reader), e1, timeout_s=5)
        assert returned is None
        assert seen.ids[0] == e2
        error = seen.messages[1]
        assert isinstance(error, JSONRPCError) and len(seen.events) == 2
        assert error.id == 8
        assert error.error.data["reason"] == "producer_aborted"
        assert error.error.data["state"] == "ABORTED"
        assert error.error.data["detail"] == "producer lease expired"
        # A later resume gets the same answer from the tombstone (no terminal frame to deliver).
        late, _ = await replay(producer.on(reader), e2)
        assert late.only_error().error.data["reason"] == "producer_aborted"
        assert late.only_error().error.data["verdict"] == "STREAM_TERMINATED"
        assert late.only_error().error.data["terminal_seq"] == 2
    finally:
        await dead.aclose()
        await reader.aclose()


async def test_keepalive_holds_the_lease_of_a_live_producer(
    cursorlog: CursorlogServer, client: CursorlogClient
) -> None:
    store = CursorlogEventStore(cursorlog.address, lease_ms=300)
    try:
        session = Bound(store)
        e1 = await session.store_event("1", None)
        await anyio.sleep(1.2)  # four leases long, no append
        resolution = await client.resolve(session.session_id, e1)
        assert (pb.Verdict.Name(resolution.verdict), resolution.stream_state) == ("RESUMABLE", pb.STREAM_STATE_OPEN)
        await session.store_event("1", result(1, "ok"))
    finally:
        await store.aclose()


async def test_verdicts_are_logged_and_an_ordinary_resume_is_not_a_warning(
    root: CursorlogEventStore, caplog: pytest.LogCaptureFixture
) -> None:
    store = Bound(root)
    await store.store_event("1", None)
    cursor = await store.store_event("1", progress(1, 1))
    await store.store_event("1", result(1, "x"))
    with caplog.at_level(logging.INFO, logger="cursorlog_mcp.resume"):
        await replay(store, cursor)
        ordinary = [r for r in caplog.records if r.name == "cursorlog_mcp.resume"]
        await replay(store, "garbage")
    lines = [r.getMessage() for r in caplog.records if r.name == "cursorlog_mcp.resume"]
    assert any(
        f"session={store.session_id}" in line
        and f"cursor={cursor}" in line
        and "verdict=STREAM_TERMINATED" in line
        and '"terminal_seq": 2' in line
        for line in lines
    ), lines
    assert ordinary and all(r.levelno == logging.INFO for r in ordinary), [
        (r.levelname, r.getMessage()) for r in ordinary
    ]
    bad = [r for r in caplog.records if "cursor=garbage" in r.getMessage()]
    assert bad and bad[0].levelno == logging.WARNING and "verdict=MALFORMED_CURSOR" in bad[0].getMessage()


async def test_client_without_priming_gets_a_stream_on_the_first_message(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    """Clients older than 2025-11-25 get no priming event: the stream opens lazily."""
    store = Bound(root)
    e1 = await store.store_event("11", progress(11, 1))
    assert e1.endswith("-1")
    done = await store.store_event("11", result(11, "ok"))
    assert stream_of(done) == stream_of(e1)
    outcome = await client.get_outcome(store.session_id, correlation="11")
    assert outcome.found and outcome.outcome.state == pb.STREAM_STATE_COMPLETED
    assert outcome.outcome.terminal_event_id == done


async def test_reused_request_id_gets_a_new_stream_and_ends_the_old_one(root: CursorlogEventStore) -> None:
    store = Bound(root)
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


async def test_standalone_stream_gap_is_marked_then_followed(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    """The GET stream has no pending call: a warning notification marks the evicted messages,
    then the retained rest and live messages follow."""
    store = Bound(root)
    g1 = await store.store_event(GET_STREAM_KEY, progress("g", 1))
    for n in (2, 3, 4):
        await store.store_event(GET_STREAM_KEY, progress("g", n))
    await client.trim(store.session_id, stream_of(g1), 3)
    seen = Collector()
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.replay_events_after, g1, seen)
        with anyio.fail_after(5):
            while len(seen.events) < 2:
                await anyio.sleep(0.01)
        live = await store.store_event(GET_STREAM_KEY, progress("g", 5))
        with anyio.fail_after(5):
            while len(seen.events) < 3:
                await anyio.sleep(0.01)
        await client.expire_session(store.session_id)  # ends the standalone stream (ABORTED)
    notice = seen.messages[0]
    assert isinstance(notice, JSONRPCNotification) and notice.method == "notifications/message"
    assert notice.params is not None and notice.params["data"]["lostSeqs"] == [2, 3]
    assert seen.ids[1:] == [f"{g1.rsplit('-', 1)[0]}-4", live]


async def test_aborted_stream_with_a_terminal_frame_delivers_it_once(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    store = Bound(root)
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


async def test_evicted_cursor_of_a_local_stream_is_marked_then_handed_back(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    """Resumed where it is produced: the gap marker and the retained rest, then the SDK takes
    the connection over for the live tail (its priming cursor is the head)."""
    store = Bound(root)
    await store.store_event("4", None)
    e1 = await store.store_event("4", progress(4, 1))
    for n in (2, 3, 4):
        last = await store.store_event("4", progress(4, n))
    await client.trim(store.session_id, stream_of(e1), 3)
    seen, returned = await replay(store, e1)
    assert returned == "4"
    assert isinstance(seen.messages[0], JSONRPCNotification)
    assert seen.messages[0].params["data"]["lostSeqs"] == [2, 3]  # type: ignore[index]
    assert seen.ids[1:] == [last]
    assert await store.store_event("4", None) == last  # the SDK's priming call: the head
    done = await store.store_event("4", result(4, "ok"))
    assert done.endswith("-5")


async def test_a_keepalive_whose_connection_broke_mid_call_is_resent(cursorlog: CursorlogServer) -> None:
    """A renewal is idempotent: one that fails UNAVAILABLE with no cursorlog headers (the
    connection broke under it, e.g. the leader died mid-call) is resent on the next member, so a
    producer does not lose that renewal (issue 30 item 2)."""
    client = CursorlogClient([cursorlog.address, "127.0.0.1:1"], timeout_s=10)
    broken: list[str] = []
    stub_at = client._stub_at

    class Breaking:
        def __init__(self, stub: Any) -> None:
            self._stub = stub

        def __getattr__(self, name: str) -> Any:
            method = getattr(self._stub, name)
            if name != "KeepAlive" or broken:
                return method

            async def fail(*args: Any, **kwargs: Any) -> Any:
                broken.append(name)
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="Socket closed"
                )

            return fail

    client._stub_at = lambda address: Breaking(stub_at(address))  # type: ignore[method-assign]
    try:
        session = f"ka-{uuid.uuid4().hex}"
        await client.open_session(session)
        await client.keep_alive(session)
        assert broken == ["KeepAlive"], "the first renewal broke, the resend went through"
    finally:
        await client.close()
