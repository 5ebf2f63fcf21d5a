"""Loud storage failures and session renewal, against the real cursorlog binary."""

from __future__ import annotations

import anyio
import pytest
from mcp_types import JSONRPCNotification

from cursorlog_mcp import CursorlogClient, CursorlogEventStore
from cursorlog_mcp._proto import cursorlog_pb2 as pb
from cursorlog_mcp.errors import CursorlogError

from .harness import CursorlogServer
from .test_store import Bound, progress, replay, result

pytestmark = pytest.mark.anyio


# -- a store that cannot store fails loudly --------------------------------------------------------------


async def test_a_failed_store_raises_aborts_the_stream_and_tells_the_listener(
    root: CursorlogEventStore, client: CursorlogClient
) -> None:
    store = Bound(root)
    failures: list[tuple[str, CursorlogError]] = []
    root.add_failure_listener(lambda session, error: failures.append((session, error)))
    await store.store_event("2", None)
    e1 = await store.store_event("2", progress(2, 1))
    huge = JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"data": "x" * (2 << 20)})
    with pytest.raises(CursorlogError) as raised:
        await store.store_event("2", huge)  # over cursorlog's 1 MiB payload limit
    assert raised.value.code.name in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"), raised.value
    assert [s for s, _ in failures] == [store.session_id]
    # The stream is aborted with the reason, so a resuming client gets an explicit answer.
    resolution = await client.resolve(store.session_id, e1)
    assert resolution.stream_state == pb.STREAM_STATE_ABORTED
    assert "could not store an event" in resolution.detail
    seen, _ = await replay(store, e1)
    assert seen.only_error().error.data["reason"] == "producer_aborted"


async def test_an_unreachable_cursorlog_raises_instead_of_returning_an_empty_id(cursorlog: CursorlogServer) -> None:
    from .harness import free_port

    nowhere = CursorlogEventStore(f"127.0.0.1:{free_port()}")
    nowhere.client._timeout_s = 0.5  # noqa: SLF001 - fail fast
    try:
        with pytest.raises(CursorlogError):
            await Bound(nowhere).store_event("1", None)
    finally:
        await nowhere.aclose()


class CountingClient(CursorlogClient):
    """Records the KeepAlive calls the store makes."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.renewed: list[tuple[str, int]] = []
        self.session_renewed = anyio.Event()

    async def keep_alive(self, session: str, stream: int = 0) -> None:
        await super().keep_alive(session, stream)
        self.renewed.append((session, stream))
        if stream == 0:
            self.session_renewed.set()


async def test_an_idle_session_held_here_is_renewed_within_the_idle_ttl(cursorlog: CursorlogServer) -> None:
    """A connected client idle between calls must not lose its session: with an idle TTL, the
    store renews each session it holds (KeepAlive without a stream) once nothing named it for a
    third of the TTL."""
    client = CountingClient(cursorlog.address)
    store = CursorlogEventStore(client, lease_ms=60_000)
    try:
        session = Bound(store)
        await session.store_event("1", None)
        await session.store_event("1", result(1, "done"))  # no open stream: only the session is left
        store.idle_ttl_ms = 600  # as GetSession reports it when the server runs with an idle TTL
        with anyio.fail_after(5):
            await client.session_renewed.wait()
        assert (session.session_id, 0) in client.renewed
        assert all(stream == 0 for _, stream in client.renewed), client.renewed
        await store.forget(session.session_id, "test over")
        assert not store.known_session(session.session_id), "a session no longer served here is not renewed"
    finally:
        await store.aclose()
        await client.close()
