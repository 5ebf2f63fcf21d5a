"""Typed errors of cursorlog-mcp, and the JSON-RPC error code a failed resume carries."""

from __future__ import annotations

import grpc

RESUME_DISCONTINUITY = -32011
"""JSON-RPC error code of the error response that ends a resumed call whose cursor cannot be
continued (evicted, ahead, unknown or foreign, malformed, session gone): re-issue the request.
``error.data.verdict`` names the cursorlog verdict and ``error.data.reason`` the discontinuity.
The same code as the rmcp adapter's."""

PRODUCER_ABORTED = -32012
"""JSON-RPC error code of the error response that ends a resumed call whose producer stopped
before answering (stream ABORTED, e.g. its lease expired, or SUPERSEDED): no result will come.
The same code as the rmcp adapter's."""


class CursorlogMcpError(Exception):
    """Base class of every error raised by cursorlog-mcp."""


class SessionBindingError(CursorlogMcpError):
    """The event store was called outside a request that ``CursorlogMiddleware`` bound to an
    MCP session.

    The SDK hands one store instance to every session's transport and never tells it the
    session id; the middleware names the session for every call (a context variable set per
    HTTP request). A call without it would have to guess a session, so it is refused.
    """


class SessionRecordError(CursorlogMcpError):
    """A session's stored state (its initialize record) is missing fields or is not valid JSON."""


class CursorlogError(CursorlogMcpError):
    """A cursorlog RPC failed. ``code`` is the gRPC status code, ``rpc`` the method name."""

    def __init__(self, rpc: str, code: grpc.StatusCode, details: str) -> None:
        self.rpc = rpc
        self.code = code
        self.details = details
        super().__init__(f"cursorlog {rpc} failed: {code.name}: {details}")


class CursorlogNotFound(CursorlogError):
    """NOT_FOUND: unknown session or stream."""


class CursorlogFailedPrecondition(CursorlogError):
    """FAILED_PRECONDITION: stale epoch, terminated stream or expired session."""


class CursorlogConflict(CursorlogError):
    """ABORTED: an expected-seq conflict (the batch does not fit the stream's head)."""


class CursorlogUnavailable(CursorlogError):
    """UNAVAILABLE or DEADLINE_EXCEEDED: the server is unreachable, shutting down or refusing writes."""


_BY_CODE: dict[grpc.StatusCode, type[CursorlogError]] = {
    grpc.StatusCode.NOT_FOUND: CursorlogNotFound,
    grpc.StatusCode.FAILED_PRECONDITION: CursorlogFailedPrecondition,
    grpc.StatusCode.ABORTED: CursorlogConflict,
    grpc.StatusCode.UNAVAILABLE: CursorlogUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: CursorlogUnavailable,
}


def from_rpc_error(rpc: str, error: grpc.aio.AioRpcError) -> CursorlogError:
    """The typed error for a failed gRPC call."""
    code = error.code()
    return _BY_CODE.get(code, CursorlogError)(rpc, code, error.details() or "")


_BY_VALUE: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def from_failure(rpc: str, code: int, message: str) -> CursorlogError:
    """The typed error for one failed item of a batched call (``Failure``: a status code and
    message, as the unary call would have failed)."""
    status = _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(status, CursorlogError)(rpc, status, message)
