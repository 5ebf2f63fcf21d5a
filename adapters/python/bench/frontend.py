"""The benchmark's MCP front-end replica: the real SDK server (``MCPServer`` and its own app
builder under uvicorn) with either event store.

    python frontend.py --port 8001 --store cursorlog --cursorlog 127.0.0.1:50051
    python frontend.py --port 8002 --store redis --redis redis://127.0.0.1:6379/0

Its one tool, ``work(n)``, reports ``n`` progress notifications and returns; each message
carries its emission time (``time.time()``), so the load generator can measure per-event
latency from emission to arrival (both run on one machine, one clock).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventStore

sys.path.insert(0, str(Path(__file__).resolve().parent))

from redis_store import RedisEventStore  # noqa: E402

from cursorlog_mcp import CursorlogEventStore, CursorlogMiddleware  # noqa: E402


class MemoryEventStore(EventStore):
    """Not durable, not shareable: the floor, what the SDK itself costs per event."""

    def __init__(self) -> None:
        self.count = 0

    async def store_event(self, stream_id: str, message: Any) -> str:
        self.count += 1
        return f"{stream_id}|{self.count}"

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> None:
        return None


def build(store_kind: str, args: argparse.Namespace) -> Any:
    mcp = MCPServer("bench")

    @mcp.tool()
    async def work(ctx: Context, n: int = 20, pause_ms: float = 0.0) -> str:
        """Reports ``n`` progress notifications (each stamped with its emission time), then returns."""
        for i in range(1, n + 1):
            await ctx.report_progress(i, n, f"{time.time():.6f}")
            if pause_ms:
                await asyncio.sleep(pause_ms / 1000)
        return f"{time.time():.6f}"

    if store_kind == "cursorlog":
        store: Any = CursorlogEventStore(args.cursorlog, max_in_flight=args.max_in_flight)
        app = mcp.streamable_http_app(event_store=store, host=args.host)
        app.add_middleware(CursorlogMiddleware, store=store, server=mcp, verify_sessions=not args.no_verify)

        def report() -> None:
            last = 0
            while True:
                time.sleep(5)
                batcher = store._batcher  # noqa: SLF001 - benchmark statistics
                if batcher is not None and batcher.stats.rpcs != last:
                    s = batcher.stats
                    last = s.rpcs
                    print(
                        f"cursorlog batcher: {s.items} items in {s.rpcs} AppendBatch calls "
                        f"(mean {s.items / s.rpcs:.1f}, max {max(s.batch_sizes)})",
                        flush=True,
                    )

        threading.Thread(target=report, daemon=True).start()
    elif store_kind == "memory":
        store = MemoryEventStore()
        app = mcp.streamable_http_app(event_store=store, host=args.host)
    elif store_kind == "redis":
        store = RedisEventStore(args.redis)
        app = mcp.streamable_http_app(event_store=store, host=args.host)
    else:
        raise SystemExit(f"unknown store {store_kind!r}")
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", choices=("cursorlog", "redis", "memory"), required=True)
    parser.add_argument("--cursorlog", default="127.0.0.1:50051")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--max-in-flight", type=int, default=1, help="cursorlog: AppendBatch calls on the wire")
    parser.add_argument("--no-verify", action="store_true", help="cursorlog: skip the per-request GetSession")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    app = build(args.store, args)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        loop=args.loop,
        access_log=False,
        timeout_keep_alive=120,
    )


if __name__ == "__main__":
    main()
