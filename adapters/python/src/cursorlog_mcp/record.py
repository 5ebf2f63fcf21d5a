"""A session's durable state: what another replica needs to take the session over.

``SessionState`` is the opaque ``state`` cursorlog keeps with the session (``OpenSession``,
``GetSession``), so it lives exactly as long as the session does: the client's ``initialize``
params (a replica restores the session by replaying that handshake through the SDK), the
credential that created it, and the session's standalone (GET) stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import SessionRecordError

STATE_VERSION = 2
STATE_BYTES_MAX = 64 * 1024
"""cursorlog's limit on a session's state."""


@dataclass(frozen=True)
class SessionState:
    """What a replica needs to take over a session created elsewhere."""

    initialize_params: dict[str, Any]
    """The client's ``initialize`` params, as sent."""
    owner: dict[str, Any] | None
    """The SDK's ``AuthorizationContext`` of the credential that created the session, if any."""
    get_stream: int | None = None
    """The session's standalone (GET) cursorlog stream, once opened."""

    def to_json(self) -> bytes:
        raw = json.dumps(
            {
                "v": STATE_VERSION,
                "initialize": self.initialize_params,
                "owner": self.owner,
                "getStream": self.get_stream,
            },
            separators=(",", ":"),
        ).encode()
        if len(raw) > STATE_BYTES_MAX:
            raise SessionRecordError(
                f"the session's initialize record is {len(raw)} bytes; cursorlog keeps at most {STATE_BYTES_MAX}"
            )
        return raw

    @classmethod
    def from_json(cls, session_id: str, payload: bytes) -> SessionState:
        try:
            raw = json.loads(payload)
            if not isinstance(raw, dict) or raw.get("v") != STATE_VERSION:
                version = raw.get("v") if isinstance(raw, dict) else None
                raise SessionRecordError(f"session {session_id}: unsupported state version {version!r}")
            initialize = raw["initialize"]
            if not isinstance(initialize, dict):
                raise TypeError("initialize is not an object")
            owner = raw.get("owner")
            if owner is not None and not isinstance(owner, dict):
                raise TypeError("owner is not an object")
            get_stream = raw.get("getStream")
            return cls(
                initialize_params=initialize,
                owner=owner,
                get_stream=int(get_stream) if get_stream is not None else None,
            )
        except SessionRecordError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise SessionRecordError(f"session {session_id}: unreadable state: {e}") from e


def initialize_params(body: bytes) -> dict[str, Any] | None:
    """The params of an ``initialize`` request body, or None when the body is not one."""
    try:
        raw = json.loads(body)
    except ValueError:
        return None
    if isinstance(raw, dict) and raw.get("method") == "initialize" and "id" in raw:
        params = raw.get("params")
        return params if isinstance(params, dict) else {}
    return None
