"""The SDK behaviours cursorlog-mcp relies on, checked against the installed ``mcp``.

cursorlog-mcp uses no private SDK hook, but it does rely on how the SDK calls its store. If a
new SDK changes any of these, this file fails and names the assumption (the SDK's own
resumption tests, ``sdk_tests/``, then show the consequences):

1. every ``store_event`` call of a session runs with the context of the request that opened
   the session (the message router is a task created while that request is served), and a
   priming ``store_event`` runs in the context of its own request;
2. the session id the SDK assigns is in the ``mcp-session-id`` response header, and requests
   name it in the same header;
3. a resumed GET's ``replay_events_after`` runs in that request's context, and a returned
   stream id gets a priming ``store_event(stream_id, None)`` in the same task;
4. the public names used exist with the expected signatures.
"""

from __future__ import annotations

import contextvars
import inspect
from importlib.metadata import version
from typing import Any

import anyio
import httpx
import pytest
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import JSONRPCMessage
from starlette.types import Receive, Scope, Send

pytestmark = pytest.mark.anyio

TAG: contextvars.ContextVar[str | None] = contextvars.ContextVar("tag", default=None)
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def test_installed_sdk_is_in_the_supported_range() -> None:
    major, minor, *_ = (int(p) for p in version("mcp").split(".")[:2])
    assert (major, minor) == (2, 3), f"mcp {version('mcp')} is outside the supported range (>=2.3.0,<2.4)"


def test_public_surfaces_used_exist() -> None:
    assert list(inspect.signature(EventStore.store_event).parameters) == ["self", "stream_id", "message"]
    assert list(inspect.signature(EventStore.replay_events_after).parameters) == [
        "self",
        "last_event_id",
        "send_callback",
    ]
    assert list(inspect.signature(StreamableHTTPSessionManager.handle_request).parameters) == [
        "self",
        "scope",
        "receive",
        "send",
    ]
    assert isinstance(inspect.getattr_static(Server, "session_manager"), property)
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context  # noqa: F401


class Recorder(EventStore):
    def __init__(self) -> None:
        self.stored: list[tuple[StreamId, bool, str | None]] = []
        self.replayed: list[str | None] = []

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        self.stored.append((stream_id, message is None, TAG.get()))
        return f"id-{len(self.stored)}"

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        self.replayed.append(TAG.get())
        await send_callback(EventMessage(message_for_replay(), "id-replayed"))
        return "resumed-stream"


def message_for_replay() -> JSONRPCMessage:
    from mcp_types import JSONRPCNotification

    return JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"level": "info", "data": "r"})


async def test_store_calls_run_in_the_context_of_the_request_that_caused_them() -> None:
    store = Recorder()
    manager = StreamableHTTPSessionManager(
        Server("contract"),
        event_store=store,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    async def tagged(scope: Scope, receive: Receive, send: Send) -> None:
        token = TAG.set(dict(scope["headers"]).get(b"x-tag", b"").decode() or None)
        try:
            await manager.handle_request(scope, receive, send)
        finally:
            TAG.reset(token)

    init: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": "init",
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}},
    }
    async with (
        manager.run(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=tagged), base_url="http://t") as http,
    ):
        opened = await http.post("/mcp", json=init, headers={**ACCEPT, "x-tag": "opening"})
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]  # (2)
        headers = {**ACCEPT, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        await http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        listed = await http.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers={**headers, "x-tag": "second"}
        )
        assert listed.status_code == 200, listed.text
        # A resumed GET never ends by itself (the SDK then forwards live events): speak ASGI
        # directly and disconnect once the replayed event and the new priming event arrived.
        get_headers = {**headers, "x-tag": "resume", "last-event-id": "id-1", "accept": "text/event-stream"}
        body = bytearray()
        seen_all = anyio.Event()

        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await seen_all.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if b"id-replayed" in body and body.count(b"id: id-") >= 2:
                    seen_all.set()

        scope = {
            "type": "http",
            "method": "GET",
            "path": "/mcp",
            "raw_path": b"/mcp",
            "query_string": b"",
            "headers": [(k.lower().encode(), v.encode()) for k, v in get_headers.items()],
        }
        with anyio.move_on_after(10):
            await tagged(scope, receive, send)  # type: ignore[arg-type]
        assert seen_all.is_set(), bytes(body)
    # (1): priming in its own request's context; router stores in the opening request's.
    assert ("init", True, "opening") in store.stored
    assert ("init", False, "opening") in store.stored
    assert ("2", True, "second") in store.stored
    assert ("2", False, "opening") in store.stored, store.stored
    # (3): the replay and the priming of the returned stream run in the resuming request's context.
    assert store.replayed == ["resume"]
    assert ("resumed-stream", True, "resume") in store.stored, store.stored
