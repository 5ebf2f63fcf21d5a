"""``CursorlogMiddleware``: the one piece that wires cursorlog into the SDK's own app.

An ASGI middleware around the app the SDK's builders return (``MCPServer.streamable_http_app``,
``Server.streamable_http_app``) or around a ``StreamableHTTPSessionManager`` the user mounts.
It touches no private SDK hook. What it does, per HTTP request:

* names the MCP session of every store call (``binding``);
* gives each session a client-facing id that every replica understands: the id the client
  sees (and cursorlog keys the session by) is minted here; the SDK's own, per-process session
  id is swapped in on the way in and out;
* restores a session this process does not hold (created on another replica, or ended here by
  the SDK's idle timeout) by replaying the client's recorded ``initialize`` through the SDK's
  app itself, with the request's own headers, so the SDK's auth, DNS-rebinding protection,
  session limit and owner check all apply unchanged;
* checks with cursorlog that the session is still alive (deleted through another replica, or
  expired) and expires it in cursorlog when the client deletes it; an id cursorlog does not
  know (a replica's own SDK id included) is answered 404 here and never reaches the SDK;
* turns a plain GET into a follow of the session's standalone stream in cursorlog, so server
  notifications produced on any replica reach the client's GET stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .binding import Binding, bind, unbind
from .errors import CursorlogError
from .record import SessionState
from .store import CursorlogEventStore

logger = logging.getLogger("cursorlog_mcp")

SESSION_HEADER = b"mcp-session-id"
VERSION_HEADER = b"mcp-protocol-version"
LAST_EVENT_HEADER = b"last-event-id"
_DROPPED_ON_SYNTHETIC = {
    b"content-type",
    b"content-length",
    b"accept",
    SESSION_HEADER,
    LAST_EVENT_HEADER,
    VERSION_HEADER,
    b"transfer-encoding",
    b"connection",
}
_SWEEP_INTERVAL_S = 30.0
_DEFAULT_LOCAL_IDLE_S = 30 * 60.0


@dataclass
class _Local:
    """A session this process serves: the SDK's id for it, and how to end it here."""

    local_id: str
    scope: Scope
    """A scope of the request that created the SDK session (its ``user`` set by auth)."""
    in_flight: int = 0
    done_at: float = field(default_factory=time.monotonic)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _with_header(headers: list[tuple[bytes, bytes]], name: bytes, value: str | None) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() != name]
    if value is not None:
        kept.append((name, value.encode("latin-1")))
    return kept


def _not_found() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The SDK's answer for an unknown session (``streamable_http_manager._error_response``)."""
    body = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}'
    return 404, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


def _unavailable() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    body = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Session store unavailable"}}'
    return 503, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


async def _respond(send: Send, response: tuple[int, list[tuple[bytes, bytes]], bytes]) -> None:
    status, headers, body = response
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _result_of(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC result in an initialize response body (SSE or JSON)."""
    texts = [body.decode("utf-8", "replace")]
    if body.lstrip().startswith((b"event:", b"id:", b"data:", b":", b"retry:")):
        texts = [line[5:].strip() for line in texts[0].splitlines() if line.startswith("data:")]
    for text in texts:
        try:
            raw = json.loads(text)
        except ValueError:
            continue
        if isinstance(raw, dict):
            result = raw.get("result")
            if isinstance(result, dict):
                return result
    return None


class CursorlogMiddleware:
    """Makes the SDK's Streamable HTTP app resumable on any replica (see module docstring).

    ``server`` is the ``MCPServer`` or lowlevel ``Server`` whose app this wraps (its
    ``session_manager`` is used to end a session locally); a hand-built manager can be passed
    as ``session_manager`` instead. ``verify_sessions`` asks cursorlog on every request whether
    the session is still alive (one ``GetSession``, which also renews its idle TTL).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: CursorlogEventStore,
        server: Any = None,
        session_manager: Any = None,
        verify_sessions: bool = True,
    ) -> None:
        if not isinstance(store, CursorlogEventStore):
            raise TypeError(f"store must be a CursorlogEventStore, not {type(store).__name__}")
        self.app = app
        self.store = store
        self.verify_sessions = verify_sessions
        self._server = server
        self._manager = session_manager
        self._local: dict[str, _Local] = {}
        self._restoring: dict[str, asyncio.Lock] = {}
        self._swept_at = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()
        store.add_failure_listener(self._on_store_failure)

    # -- plumbing ----------------------------------------------------------------------------------
    @property
    def session_manager(self) -> Any:
        if self._manager is None and self._server is not None:
            try:
                self._manager = self._server.session_manager
            except RuntimeError:  # the app was not built yet
                return None
        return self._manager

    def local_session_id(self, session: str) -> str | None:
        """The SDK's own id of a session this process serves (what its tools see in
        ``ctx.headers["mcp-session-id"]``), or None. The reverse, in a tool:
        ``cursorlog_mcp.client_session_id()``."""
        local = self._local.get(session)
        return local.local_id if local is not None else None

    def _local_idle_s(self) -> float | None:
        manager = self.session_manager
        if manager is None:
            return _DEFAULT_LOCAL_IDLE_S
        idle = getattr(manager, "session_idle_timeout", _DEFAULT_LOCAL_IDLE_S)
        return float(idle) if idle is not None else None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep(self) -> None:
        """Forget sessions the SDK has certainly ended here by its idle timeout."""
        now = time.monotonic()
        idle = self._local_idle_s()
        if now - self._swept_at < _SWEEP_INTERVAL_S or idle is None:
            return
        self._swept_at = now
        for session, local in list(self._local.items()):
            if local.in_flight == 0 and now - local.done_at > idle + _SWEEP_INTERVAL_S:
                del self._local[session]
                await self.store.forget(session, "session ended on this replica (idle)")

    # -- ASGI ----------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self._sweep()
        session = _header(scope["headers"], SESSION_HEADER)
        if session is None:
            await self._opening(scope, receive, send)
        else:
            await self._existing(session, scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def on_send(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                for task in list(self._tasks):
                    await asyncio.gather(task, return_exceptions=True)
                await self.store.aclose()
            await send(message)

        await self.app(scope, receive, on_send)

    async def _opening(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request without a session id (an ``initialize``): the session's client-facing id
        is minted here, so every store call for it is bound from the first one on."""
        session = uuid4().hex
        binding = Binding(session, scope, opening=True, protocol_version=_header(scope["headers"], VERSION_HEADER))
        local: _Local | None = None

        async def tee() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                binding.body.extend(message.get("body", b""))
            return message

        async def on_send(message: Message) -> None:
            nonlocal local
            if message["type"] == "http.response.start":
                local_id = _header(message.get("headers", []), SESSION_HEADER)
                if local_id is not None:
                    local = _Local(local_id, scope, in_flight=1)
                    self._local[session] = local
                    message = {**message, "headers": _with_header(message["headers"], SESSION_HEADER, session)}
            await send(message)

        token = bind(binding)
        try:
            await self.app(scope, tee, on_send)
        finally:
            unbind(token)
            if local is not None:
                local.in_flight -= 1
                local.done_at = time.monotonic()

    async def _existing(self, session: str, scope: Scope, receive: Receive, send: Send) -> None:
        local = self._local.get(session)
        state: SessionState | None = None
        if self.verify_sessions or local is None:
            try:
                state = await self.store.lookup_session(session)
            except CursorlogError as e:
                logger.error("session %s: cannot check it with cursorlog: %s", session, e)
                await _respond(send, _unavailable())
                return
            if state is None:
                if local is not None:
                    await self._drop(session, "the session ended in cursorlog (deleted elsewhere or expired)")
                # Not a session, answered here: the SDK must not see the id, which may be one it
                # holds (a replica's own id for its copy, presented from outside); it would serve
                # that request with no binding (a 500 from the priming event, or an unbound call).
                logger.info("rejected a request for unknown or expired session %s", session[:64])
                await _respond(send, _not_found())
                return
        if local is None:
            assert state is not None
            local = await self._restore(session, state, scope, send)
            if local is None:
                return  # _restore answered the request
        recorded: list[Message] = []

        async def replayable() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                recorded.append(message)
            return message

        answered = await self._forward(session, local, scope, replayable, send, retry_on_404=True)
        if answered:
            return
        # The SDK no longer holds the session here (its idle timeout, or it was ended): take it
        # over again and serve the request once more.
        self._local.pop(session, None)
        state = await self.store.lookup_session(session)
        if state is None:
            await _respond(send, _not_found())
            return
        local = await self._restore(session, state, scope, send)
        if local is None:
            return
        pending = list(recorded)

        async def replay() -> Message:
            return pending.pop(0) if pending else await receive()

        await self._forward(session, local, scope, replay, send, retry_on_404=False)

    async def _forward(
        self, session: str, local: _Local, scope: Scope, receive: Receive, send: Send, *, retry_on_404: bool
    ) -> bool:
        """Serves the request with the SDK's id swapped in. False when the SDK answered 404 for
        a session it no longer holds (nothing was sent to the client then)."""
        headers = _with_header(list(scope["headers"]), SESSION_HEADER, local.local_id)
        if scope["method"] == "GET" and _header(headers, LAST_EVENT_HEADER) is None:
            try:
                cursor = await self.store.standalone_cursor(session)
            except CursorlogError as e:
                logger.warning("session %s: GET stream served from this replica only: %s", session, e)
                cursor = None
            if cursor is not None:
                headers = _with_header(headers, LAST_EVENT_HEADER, cursor)
        inner = {**scope, "headers": headers}
        binding = Binding(session, inner, protocol_version=_header(headers, VERSION_HEADER))
        held: list[Message] = []
        status: int | None = None

        async def on_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if status == 404 and retry_on_404:
                    held.append(message)
                    return
                message = {**message, "headers": _with_header(message.get("headers", []), SESSION_HEADER, session)}
            elif held:
                held.append(message)
                return
            await send(message)

        local.in_flight += 1
        token = bind(binding)
        try:
            await self.app(inner, receive, on_send)
        finally:
            unbind(token)
            local.in_flight -= 1
            local.done_at = time.monotonic()
        if held:
            if binding.owner() != self.store.session_owner(session):
                for message in held:  # another credential: the SDK's 404 stands
                    await send(message)
                return True
            return False
        if scope["method"] == "DELETE" and status is not None and status < 300:
            self._local.pop(session, None)
            await self.store.end_session(session)
        return True

    # -- restoring and ending sessions ----------------------------------------------------------
    async def _restore(self, session: str, state: SessionState, scope: Scope, send: Send) -> _Local | None:
        """Takes over a session this process does not hold by replaying the client's
        ``initialize`` (and ``notifications/initialized``) through the SDK's app with the
        request's own headers. None when the SDK refused; its answer was sent to the client."""
        lock = self._restoring.setdefault(session, asyncio.Lock())
        try:
            async with lock:
                return await self._restore_locked(session, state, scope, send)
        finally:
            if not lock.locked() and self._restoring.get(session) is lock:
                del self._restoring[session]

    async def _restore_locked(self, session: str, state: SessionState, scope: Scope, send: Send) -> _Local | None:
        known = self._local.get(session)
        if known is not None:
            return known
        request_id = f"cursorlog-restore-{uuid4().hex}"
        base = [(k, v) for k, v in scope["headers"] if k.lower() not in _DROPPED_ON_SYNTHETIC]
        init = json.dumps(
            {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": state.initialize_params}
        ).encode()
        init_scope = self._synthetic_scope(scope, "POST", base, init)
        binding = Binding(session, init_scope, synthetic_streams=frozenset({request_id}))
        token = bind(binding)
        try:
            status, headers, body = await self._call(init_scope, init)
            local_id = _header(headers, SESSION_HEADER)
            if status != 200 or local_id is None:
                logger.info("session %s: the SDK refused to restore it (HTTP %d)", session, status)
                await _respond(send, (status, headers, body))
                return None
            result = _result_of(body) or {}
            version = str(result.get("protocolVersion", ""))
            note = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
            note_headers = _with_header(_with_header(base, SESSION_HEADER, local_id), VERSION_HEADER, version)
            await self._call(self._synthetic_scope(scope, "POST", note_headers, note), note)
        finally:
            unbind(token)
        local = _Local(local_id, init_scope)
        if binding.owner() != state.owner:
            logger.warning("session %s: a request with another credential than its creator's; answered 404", session)
            await self._terminate(session, local)
            await _respond(send, _not_found())
            return None
        self._local[session] = local
        logger.info("session %s: restored from cursorlog (SDK session %s, protocol %s)", session, local_id, version)
        return local

    @staticmethod
    def _synthetic_scope(scope: Scope, method: str, headers: list[tuple[bytes, bytes]], body: bytes) -> Scope:
        hdrs = list(headers)
        if method == "POST":
            hdrs = _with_header(hdrs, b"content-type", "application/json")
            hdrs = _with_header(hdrs, b"accept", "application/json, text/event-stream")
            hdrs = _with_header(hdrs, b"content-length", str(len(body)))
        return {
            k: v for k, v in scope.items() if k not in ("user", "auth", "state", "endpoint", "path_params", "route")
        } | {"method": method, "headers": hdrs, "query_string": b""}

    async def _call(self, scope: Scope, body: bytes, app: ASGIApp | None = None) -> tuple[int, list[Any], bytes]:
        """Runs one synthetic request through ``app`` (default: the wrapped app) to completion."""
        done = asyncio.Event()
        sent = False
        status = 500
        headers: list[Any] = []
        chunks: list[bytes] = []

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def on_send(message: Message) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status, headers = message["status"], list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    done.set()

        try:
            await (app or self.app)(scope, receive, on_send)
        finally:
            done.set()
        return status, headers, b"".join(chunks)

    async def _terminate(self, session: str, local: _Local) -> None:
        """Ends the SDK's session here (a DELETE as its creator), so its connections close."""
        headers = [(k, v) for k, v in local.scope["headers"] if k.lower() in (b"host", b"origin", b"authorization")]
        headers = _with_header(headers, SESSION_HEADER, local.local_id)
        manager = self.session_manager
        scope = self._synthetic_scope(local.scope, "DELETE", headers, b"")
        app: ASGIApp | None = None
        if manager is not None:
            # Straight to the SDK's manager, as the credential that created the session (its
            # `user`), so an expired token cannot keep a broken session alive.
            scope = {**scope, "user": local.scope.get("user"), "auth": local.scope.get("auth")}
            app = manager.handle_request
        try:
            status, _, _ = await self._call(scope, b"", app)
            logger.info("session %s: ended SDK session %s here (HTTP %d)", session, local.local_id, status)
        except Exception:
            logger.exception("session %s: could not end SDK session %s", session, local.local_id)

    async def _drop(self, session: str, reason: str) -> None:
        local = self._local.pop(session, None)
        await self.store.forget(session, reason)
        if local is not None:
            await self._terminate(session, local)

    def _on_store_failure(self, session: str, error: CursorlogError) -> None:
        # The SDK stops routing a session's messages once its store raised; end the session so
        # its clients see their streams close (and get an explicit answer when they resume)
        # instead of waiting forever.
        if session in self._local:
            self._spawn(self._drop(session, f"an event could not be stored: {error.code.name}"))
