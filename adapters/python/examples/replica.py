"""An MCP server replica that keeps its SSE events in cursorlog.

Run several of these behind any load balancer (no session affinity), all pointing at one
cursorlog server:

    cursorlog serve --listen 127.0.0.1:50051 --data-dir /tmp/cursorlog &
    python examples/replica.py --port 8001 --cursorlog 127.0.0.1:50051 &
    python examples/replica.py --port 8002 --cursorlog 127.0.0.1:50051 &

The end-to-end tests start it the same way. ``--exec-log FILE`` appends one line per tool
execution (``<replica> <tool> <call id>``), so a test can prove a tool ran exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from typing import Any

import uvicorn
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer

from cursorlog_mcp import CursorlogEventStore, CursorlogMiddleware, client_session_id


class StaticTokens:
    """A token verifier for the example: ``token -> client id`` from the command line."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens = tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        client = self._tokens.get(token)
        return AccessToken(token=token, client_id=client, scopes=[]) if client is not None else None


def build_server(replica: str, exec_log: str | None, tokens: dict[str, str] | None = None, url: str = "") -> MCPServer:
    auth: dict[str, Any] = {}
    if tokens:
        auth = {
            "auth": AuthSettings(issuer_url="http://127.0.0.1/issuer", resource_server_url=url, required_scopes=[]),
            "token_verifier": StaticTokens(tokens),
        }
    mcp = MCPServer("cursorlog-example", instructions="Counts slowly, with progress.", **auth)

    def record(tool: str, call_id: str) -> None:
        if exec_log:
            with open(exec_log, "a", encoding="utf-8") as f:
                f.write(f"{replica} {tool} {call_id}\n")
                f.flush()
                os.fsync(f.fileno())

    @mcp.tool()
    async def slow_count(ctx: Context, call_id: str, steps: int = 5, delay_s: float = 0.2) -> str:
        """Reports `steps` progress notifications, `delay_s` apart, then returns."""
        record("slow_count", call_id)
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i} of {steps}")
            await asyncio.sleep(delay_s)
        return f"{call_id}: counted to {steps} on {replica}"

    @mcp.tool()
    async def announce(ctx: Context) -> str:
        """Sends a tools/list_changed notification on the session's standalone (GET) stream."""
        await ctx.request_context.session.send_tool_list_changed()
        return f"announced by {replica}"

    @mcp.tool()
    async def session_ids(ctx: Context) -> str:
        """The session's ids as a tool sees them: the client's (the same on every replica) and
        the one this replica's SDK uses for its in-process copy (its request headers)."""
        headers = ctx.headers or {}
        return json.dumps({"client": client_session_id(), "sdk": headers.get("mcp-session-id")})

    @mcp.tool()
    async def whoami() -> str:
        """Names the replica serving the call."""
        return replica

    return mcp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cursorlog", required=True, help="cursorlog gRPC address, e.g. 127.0.0.1:50051; a replicated cursorlog: its members, comma-separated")
    parser.add_argument("--name", default=None, help="replica name reported by tools (default: the port)")
    parser.add_argument("--lease-ms", type=int, default=10_000, help="producer lease of request streams")
    parser.add_argument("--retry-ms", type=int, default=None, help="SSE retry interval suggested to clients")
    parser.add_argument("--exec-log", default=None, help="append one line per tool execution to this file")
    parser.add_argument("--on-evicted", default="gap", choices=("gap", "error"), help="what an evicted cursor gets")
    parser.add_argument("--tokens", default=None, help="require bearer tokens: token=client,token=client,...")
    args = parser.parse_args()

    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s {args.name or args.port} %(name)s %(levelname)s %(message)s"
    )
    store = CursorlogEventStore(args.cursorlog, lease_ms=args.lease_ms, on_evicted=args.on_evicted)
    tokens = dict(pair.split("=", 1) for pair in args.tokens.split(",")) if args.tokens else None
    url = f"http://{args.host}:{args.port}/mcp"
    server = build_server(args.name or str(args.port), args.exec_log, tokens, url)
    # The SDK's own builder, with all its options (DNS-rebinding protection for localhost,
    # auth when configured), plus the middleware that names sessions and restores them.
    app = server.streamable_http_app(event_store=store, retry_interval=args.retry_ms, host=args.host)
    app.add_middleware(CursorlogMiddleware, store=store, server=server)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
