"""Which MCP session a store call is for.

The SDK gives one ``EventStore`` to every session's transport and never names the session in
``store_event``/``replay_events_after``. ``CursorlogMiddleware`` sets a ``Binding`` in a context
variable for every HTTP request; every store call the SDK makes for that request (priming,
replay) runs in the request's task, and every call its session's message router makes runs in
a task created while the session's opening request was served, so both see the binding.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from starlette.types import Scope

from .errors import SessionBindingError


@dataclass
class Binding:
    """The MCP session (as the client knows it: the cursorlog session id) of one HTTP request."""

    session: str
    scope: Scope
    """The request's ASGI scope. Authentication middleware inside ours sets ``scope["user"]``
    in place, so the owner can be read once the SDK acts."""
    opening: bool = False
    """The request opens the session (an ``initialize`` without ``Mcp-Session-Id``)."""
    protocol_version: str | None = None
    """The request's ``MCP-Protocol-Version`` header."""
    body: bytearray = field(default_factory=bytearray)
    """The opening request's body, teed off ``receive`` (the client's ``initialize`` params)."""
    synthetic_streams: frozenset[str] = frozenset()
    """SDK stream ids of the adapter's own restore handshake, which are not recorded."""

    def owner(self) -> dict[str, Any] | None:
        """The SDK's ``AuthorizationContext`` of the request's credential, if authenticated."""
        user = self.scope.get("user")
        if isinstance(user, AuthenticatedUser):
            return dict(authorization_context(user))
        return None


_BINDING: contextvars.ContextVar[Binding | None] = contextvars.ContextVar("cursorlog_mcp_binding", default=None)


def current_binding(call: str) -> Binding:
    """The binding of the running request, or ``SessionBindingError`` naming ``call``."""
    binding = _BINDING.get()
    if binding is None:
        raise SessionBindingError(
            f"CursorlogEventStore.{call} was called outside a request bound by CursorlogMiddleware, so "
            "the MCP session is unknown. Wrap the SDK's app: app.add_middleware(CursorlogMiddleware, "
            "store=store, server=mcp) (see the cursorlog-mcp README)."
        )
    return binding


def client_session_id() -> str | None:
    """The client-facing ``Mcp-Session-Id`` of the MCP session being served, or None outside
    one (no ``CursorlogMiddleware`` binding).

    Call it from a tool or any handler. The SDK's own view of the session id (its
    ``Context.headers["mcp-session-id"]``) is the id this replica's SDK minted for its
    in-process copy, which the middleware swaps in; this is the id the client sent, the same on
    every replica and the one cursorlog keys the session by.
    """
    binding = _BINDING.get()
    return binding.session if binding is not None else None


def bind(binding: Binding) -> contextvars.Token[Binding | None]:
    """Sets the binding for the running task (and every task it creates from now on)."""
    return _BINDING.set(binding)


def unbind(token: contextvars.Token[Binding | None]) -> None:
    _BINDING.reset(token)
