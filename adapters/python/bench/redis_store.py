"""A Redis Streams ``EventStore`` of the kind MCP users write today (the benchmark's baseline).

Modelled on the stores people ship for the SDK (python-sdk PR #2685, fastmcp's key-value
store): one Redis stream per SDK stream id, one ``XADD`` per event (the priming event too, so
its id is a real position), ``XRANGE`` replay after the cursor, and event ids that carry their
stream (``{stream key}|{entry id}``), so ``replay_events_after`` finds the stream without a
second lookup. Run Redis with ``appendonly yes`` and ``appendfsync always`` for the same
durability as cursorlog's ``--sync always``: an ``XADD`` is answered after its fsync.

Like those stores it keys streams by the SDK's stream id plus a per-process prefix; the SDK
reuses stream ids across sessions (request ids ``1``, ``2``, ...), so a real deployment needs a
session-scoped prefix, which costs no extra round trip. The benchmark gives each session
distinct request ids, so no two sessions share a key.
"""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage, jsonrpc_message_adapter


class RedisEventStore(EventStore):
    """``XADD`` per event, ``XRANGE`` replay; ids ``{key}|{entry id}``."""

    def __init__(self, url: str, *, prefix: str | None = None, maxlen: int | None = 10_000) -> None:
        # Sized for the concurrency it serves, as a deployment would (the default pool refuses more).
        self.redis = aioredis.Redis.from_url(url, decode_responses=False, max_connections=4096)
        self.prefix = prefix or f"mcp:{uuid.uuid4().hex[:8]}"
        self.maxlen = maxlen

    def _key(self, stream_id: StreamId) -> str:
        return f"{self.prefix}:{stream_id}"

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        key = self._key(stream_id)
        data = b"" if message is None else message.model_dump_json(by_alias=True, exclude_unset=True).encode()
        entry = await self.redis.xadd(key, {b"d": data}, maxlen=self.maxlen, approximate=True)
        return f"{key}|{entry.decode()}"

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        key, sep, entry = last_event_id.rpartition("|")
        if not sep or not key.startswith(self.prefix + ":"):
            return None
        rows = await self.redis.xrange(key, min=f"({entry}", max="+")
        for entry_id, fields in rows:
            data = fields.get(b"d", b"")
            if data:  # priming rows carry no message
                message = jsonrpc_message_adapter.validate_json(data, by_name=False)
                await send_callback(EventMessage(message, f"{key}|{entry_id.decode()}"))
        return key[len(self.prefix) + 1 :]

    async def aclose(self) -> None:
        await self.redis.aclose()
