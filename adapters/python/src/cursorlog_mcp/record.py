"""A session's initialize record: what another replica needs to take the session over.

``SessionRecord`` is stored in cursorlog as the terminal frame of a stream with correlation
``mcp:session-init`` in the session; ``InitCapture`` tees the opening request's body off the
ASGI ``receive`` so the client's ``initialize`` params can be recorded (the SDK never shows
them to a store).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import SessionRecordError


@dataclass(frozen=True)
class SessionRecord:
    """What a replica needs to take over a session initialized elsewhere."""

    session_id: str
    initialize_params: dict[str, Any]
    """The client's ``initialize`` params, as sent."""
    protocol_version: str
    """The negotiated version (the server's InitializeResult)."""
    get_stream: int
    """The session's standalone (GET) cursorlog stream."""
    owner: dict[str, Any] | None
    """The SDK's AuthorizationContext of the credential that created the session, if any."""
    epoch: int
    """The session's current epoch when the record was loaded or written."""

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "v": 1,
                "initialize": self.initialize_params,
                "protocolVersion": self.protocol_version,
                "getStream": self.get_stream,
                "owner": self.owner,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, session_id: str, payload: bytes, epoch: int) -> SessionRecord:
        try:
            raw = json.loads(payload)
            if raw.get("v") != 1:
                raise SessionRecordError(f"session {session_id}: unsupported record version {raw.get('v')!r}")
            return cls(
                session_id=session_id,
                initialize_params=dict(raw["initialize"]),
                protocol_version=str(raw["protocolVersion"]),
                get_stream=int(raw["getStream"]),
                owner=raw.get("owner"),
                epoch=epoch,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SessionRecordError(f"session {session_id}: unreadable initialize record: {e}") from e


class InitCapture:
    """The body of a session's opening request, teed off the ASGI ``receive`` by the manager,
    so the store can record the client's ``initialize`` params once the server accepted them."""

    def __init__(self, owner: dict[str, Any] | None = None) -> None:
        self.owner = owner
        self._body = bytearray()
        self._parsed: tuple[str, dict[str, Any]] | None = None
        self._parse_failed = False

    def feed(self, chunk: bytes) -> None:
        self._body.extend(chunk)

    def initialize_request(self) -> tuple[str, dict[str, Any]] | None:
        """``(str(request id), params)`` of the captured initialize request, if it is one."""
        if self._parsed is None and not self._parse_failed:
            try:
                raw = json.loads(bytes(self._body))
            except ValueError:
                self._parse_failed = True
                return None
            if isinstance(raw, dict) and raw.get("method") == "initialize" and "id" in raw:
                params = raw.get("params")
                self._parsed = (str(raw["id"]), params if isinstance(params, dict) else {})
            else:
                self._parse_failed = True
        return self._parsed
