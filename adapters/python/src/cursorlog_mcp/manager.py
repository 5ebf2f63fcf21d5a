"""``CursorlogSessionManager``: the SDK's session manager, made session-isolated and
replica-independent by cursorlog.

What it changes in ``StreamableHTTPSessionManager`` (mcp 2.3):

* every session's transport gets its own ``SessionEventStore`` bound to the real
  ``Mcp-Session-Id`` (the SDK would give all sessions one store and no session id);
* a session that is unknown in this process but alive in cursorlog (initialized on another
  replica) is restored here from its initialize record, instead of answering 404;
* a request for a session that was deleted on another replica answers 404 here too;
* DELETE expires the session in cursorlog;
* a GET without ``Last-Event-ID`` follows the session's standalone stream in cursorlog, so it
  carries server messages produced by any replica.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any
from uuid import uuid4

import anyio
from anyio.abc import TaskStatus
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import LAST_EVENT_ID_HEADER, MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.transport_context import TransportContext
from mcp_types import InitializeRequestParams
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from .errors import CursorlogError, SdkCompatibilityError
from .record import InitCapture, SessionRecord
from .store import CursorlogEventStore, SessionEventStore

logger = logging.getLogger("cursorlog_mcp")

_OPENING_CAPTURE: contextvars.ContextVar[InitCapture | None] = contextvars.ContextVar(
    "cursorlog_mcp_opening_capture", default=None
)

# The private parts of StreamableHTTPSessionManager (mcp 2.3.0) this class builds on. Checked
# at construction so that an SDK that changed them fails loudly instead of silently mixing
# sessions (see README, "SDK hooks").
_REQUIRED_HOOKS: dict[str, tuple[str, ...]] = {
    "_admit_session": ("self", "requestor"),
    "_handle_stateful_request": ("self", "scope", "receive", "send"),
    "_discard_session": ("self", "session_id", "transport"),
    "_serve_opening_request": ("self", "http_transport", "scope", "receive", "send"),
}
_REQUIRED_ATTRIBUTES = ("_server_instances", "_session_owners", "_task_group", "_lifespan_state")


def check_sdk_compatibility() -> None:
    """Raises SdkCompatibilityError if the installed SDK lacks a hook this adapter overrides."""
    for name, params in _REQUIRED_HOOKS.items():
        hook = getattr(StreamableHTTPSessionManager, name, None)
        if hook is None:
            raise SdkCompatibilityError(f"mcp.StreamableHTTPSessionManager.{name} is missing; this SDK is unsupported")
        actual = tuple(inspect.signature(hook).parameters)
        if actual != params:
            raise SdkCompatibilityError(
                f"mcp.StreamableHTTPSessionManager.{name}{actual} changed (expected {params}); this SDK is unsupported"
            )


class CursorlogSessionManager(StreamableHTTPSessionManager):
    """Drop-in ``StreamableHTTPSessionManager`` over a ``CursorlogEventStore``.

    Extra arguments: ``store`` (replaces ``event_store``), and ``verify_sessions``: check with
    cursorlog on each request that a session served here was not deleted through another
    replica (one cheap ``Resolve`` per HTTP request).
    """

    def __init__(self, app: Any, store: CursorlogEventStore, *, verify_sessions: bool = True, **kwargs: Any) -> None:
        check_sdk_compatibility()
        if kwargs.get("stateless"):
            raise ValueError("CursorlogSessionManager serves stateful sessions; stateless mode has nothing to resume")
        if "event_store" in kwargs:
            raise TypeError("pass the CursorlogEventStore as `store`, not `event_store`")
        if not isinstance(store, CursorlogEventStore):
            raise TypeError(f"store must be a CursorlogEventStore, not {type(store).__name__}")
        super().__init__(app, event_store=store, **kwargs)
        for attribute in _REQUIRED_ATTRIBUTES:
            if not hasattr(self, attribute):
                raise SdkCompatibilityError(
                    f"StreamableHTTPSessionManager has no attribute {attribute}; unsupported SDK"
                )
        self.store = store
        self.verify_sessions = verify_sessions
        self._session_stores: dict[str, SessionEventStore] = {}
        self._restore_locks: dict[str, anyio.Lock] = {}

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        async with self.store.running(), super().run():
            yield

    def session_store(self, session_id: str) -> SessionEventStore | None:
        """The event store bound to a session served in this process."""
        return self._session_stores.get(session_id)

    # -- per-session stores ----------------------------------------------------------------------
    def _new_transport(self, session_id: str, store: SessionEventStore) -> StreamableHTTPServerTransport:
        transport = StreamableHTTPServerTransport(
            mcp_session_id=session_id,
            is_json_response_enabled=self.json_response,
            event_store=store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        self._session_stores[session_id] = store
        return transport

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        # Same contract as the SDK's (limit, registration, owner), but the transport gets a
        # store bound to its own session id instead of the shared one.
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        session_id = uuid4().hex
        capture = _OPENING_CAPTURE.get()
        if capture is not None:
            capture.owner = dict(requestor) if requestor is not None else None
        transport = self._new_transport(session_id, self.store.for_session(session_id, init_capture=capture))
        if requestor is not None:
            self._session_owners[session_id] = requestor
        self._server_instances[session_id] = transport
        logger.info("created session %s", session_id)
        return transport

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        await super()._discard_session(session_id, transport)
        store = self._session_stores.get(session_id)
        if store is not None and self._server_instances.get(session_id) is None:
            del self._session_stores[session_id]
            with anyio.CancelScope(shield=True):
                await store.close()

    # -- requests --------------------------------------------------------------------------------
    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = _header(scope, MCP_SESSION_ID_HEADER)
        method = scope.get("method", "")
        if session_id is None:
            capture = InitCapture()
            token = _OPENING_CAPTURE.set(capture)
            try:
                await super()._handle_stateful_request(scope, _tee(receive, capture), send)
            finally:
                _OPENING_CAPTURE.reset(token)
            return

        if session_id in self._server_instances:
            if self.verify_sessions and not await self._still_alive(session_id):
                await self._discard_session(session_id, self._server_instances[session_id])
        elif not await self._restore(session_id, scope, receive, send):
            return  # _restore answered (503), or the session is unknown: the SDK answers 404 below

        transport = self._server_instances.get(session_id)
        if transport is not None and method == "GET" and _header(scope, LAST_EVENT_ID_HEADER) is None:
            scope = await self._follow_standalone(session_id, scope)
        await super()._handle_stateful_request(scope, receive, send)
        if method == "DELETE" and transport is not None and transport.is_terminated:
            await self.store.expire_session(session_id)

    async def _still_alive(self, session_id: str) -> bool:
        try:
            return await self.store.session_epoch(session_id) is not None
        except CursorlogError as e:
            logger.warning("could not verify session %s with cursorlog (serving it anyway): %s", session_id, e)
            return True

    async def _follow_standalone(self, session_id: str, scope: Scope) -> Scope:
        """Turns a plain GET into a resume from the head of the session's standalone stream,
        so the response follows that stream in cursorlog (messages from every replica)."""
        store = self._session_stores.get(session_id)
        if store is None or store.get_stream is None:
            return scope
        try:
            epoch = await self.store.session_epoch(session_id)
            if epoch is None:
                return scope
            head = (await self.store.client.resolve(session_id, f"{epoch}-{store.get_stream}-0")).head
        except CursorlogError as e:
            logger.warning("session %s: standalone stream served from this replica only: %s", session_id, e)
            return scope
        cursor = f"{epoch}-{store.get_stream}-{head}"
        headers = [*scope["headers"], (LAST_EVENT_ID_HEADER.encode(), cursor.encode())]
        return {**scope, "headers": headers}

    async def _restore(self, session_id: str, scope: Scope, receive: Receive, send: Send) -> bool:
        """Takes over a session initialized on another replica, if cursorlog knows it.

        True: go on (restored, already here, or unknown, which the SDK then answers with 404).
        False: this method already answered the request (503)."""
        lock = self._restore_locks.setdefault(session_id, anyio.Lock())
        try:
            async with lock:
                if session_id in self._server_instances:
                    return True
                try:
                    record = await self.store.load_session_record(session_id)
                except CursorlogError as e:
                    logger.error("cannot restore session %s: cursorlog failed: %s", session_id, e)
                    await JSONResponse(
                        {
                            "jsonrpc": "2.0",
                            "id": None,
                            "error": {"code": -32603, "message": "Session store unavailable"},
                        },
                        status_code=503,
                    )(scope, receive, send)
                    return False
                if record is None:
                    return True  # unknown or expired: fall through to the SDK's 404
                if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
                    await JSONResponse(
                        {"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": "Too many open sessions"}},
                        status_code=503,
                    )(scope, receive, send)
                    return False
                await self._start_restored(record)
                return True
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._restore_locks.pop(session_id, None)

    async def _start_restored(self, record: SessionRecord) -> None:
        session_id = record.session_id
        transport = self._new_transport(session_id, self.store.for_session(session_id, record=record))
        if record.owner is not None:
            self._session_owners[session_id] = AuthorizationContext(**record.owner)  # type: ignore[typeddict-item]
        self._server_instances[session_id] = transport

        async def run_restored(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with transport.connect() as (read_stream, write_stream):
                task_status.started()
                try:
                    idle_scope = transport.idle_scope if transport.idle_scope is not None else anyio.CancelScope()
                    with idle_scope:
                        # serve_loop() without the handshake: the connection is born initialized
                        # with the client's recorded initialize params.
                        dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                            read_stream, write_stream, inline_methods=frozenset({"initialize"})
                        )
                        connection = Connection.for_loop(
                            dispatcher, session_id=session_id, protocol_version_hint=record.protocol_version
                        )
                        connection.client_params = InitializeRequestParams.model_validate(
                            record.initialize_params, by_name=False
                        )
                        connection.protocol_version = record.protocol_version
                        connection.initialized.set()
                        await serve_connection(
                            self.app, dispatcher, connection=connection, lifespan_state=self._lifespan_state
                        )
                    if idle_scope.cancelled_caught:
                        logger.info("restored session %s idle timeout", session_id)
                except Exception:
                    logger.exception("restored session %s crashed", session_id)
                finally:
                    await self._discard_session(session_id, transport)

        assert self._task_group is not None
        try:
            await self._task_group.start(run_restored)
        except BaseException:
            await self._discard_session(session_id, transport)
            raise
        logger.info("restored session %s from cursorlog (protocol %s)", session_id, record.protocol_version)


def _header(scope: Scope, name: str) -> str | None:
    key = name.lower().encode()
    for k, v in scope.get("headers", ()):
        if k.lower() == key:
            return str(v.decode("latin-1"))
    return None


def _tee(receive: Receive, capture: InitCapture) -> Receive:
    async def tee() -> Message:
        message = await receive()
        if message["type"] == "http.request":
            capture.feed(message.get("body", b""))
        return message

    return tee


def _lowlevel_server(server: Any) -> Any:
    """The lowlevel ``mcp.server.lowlevel.Server`` of an ``MCPServer`` (or the server itself)."""
    from mcp.server.lowlevel.server import Server

    if isinstance(server, Server):
        return server
    inner = getattr(server, "_lowlevel_server", None)
    if isinstance(inner, Server):
        return inner
    raise TypeError(f"expected an mcp Server or MCPServer, got {type(server).__name__}")


def streamable_http_app(
    server: Any,
    store: CursorlogEventStore,
    *,
    path: str = "/mcp",
    json_response: bool = False,
    retry_interval: int | None = None,
    session_idle_timeout: float | None = 30 * 60,
    max_sessions: int | None = 10_000,
    security_settings: TransportSecuritySettings | None = None,
    verify_sessions: bool = True,
    routes: Sequence[BaseRoute] = (),
    middleware: Sequence[Middleware] = (),
    debug: bool = False,
) -> Starlette:
    """A Starlette app serving ``server`` (an ``MCPServer`` or lowlevel ``Server``) over
    Streamable HTTP at ``path`` with a ``CursorlogSessionManager``.

    For auth or anything else this builder does not cover, build the app yourself around
    ``CursorlogSessionManager`` (it honours ``scope["user"]`` like the SDK's manager).
    """
    manager = CursorlogSessionManager(
        _lowlevel_server(server),
        store,
        json_response=json_response,
        retry_interval=retry_interval,
        session_idle_timeout=session_idle_timeout,
        max_sessions=max_sessions,
        security_settings=security_settings,
        verify_sessions=verify_sessions,
    )
    app = Starlette(
        debug=debug,
        routes=[Route(path, endpoint=StreamableHTTPASGIApp(manager)), *routes],
        middleware=list(middleware),
        lifespan=lambda _app: manager.run(),
    )
    app.state.cursorlog_session_manager = manager
    return app


__all__ = ["CursorlogSessionManager", "check_sdk_compatibility", "streamable_http_app"]
