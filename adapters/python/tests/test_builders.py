"""cursorlog wired into the SDK's own app builder keeps the builder's protections.

``examples/replica.py`` builds its app with ``MCPServer.streamable_http_app(event_store=store,
host="127.0.0.1")`` (which turns on the SDK's DNS-rebinding protection for localhost) and, with
``--tokens``, the SDK's bearer auth; ``CursorlogMiddleware`` is added on top. These tests speak
raw HTTP to two such replicas, so both paths are covered: a session served where it was
created, and one a replica restores from cursorlog.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .harness import CursorlogServer, Replica

pytestmark = pytest.mark.anyio

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("builders")


@pytest.fixture(scope="module")
def authed(cursorlog: CursorlogServer, workdir: Path) -> Iterator[dict[str, Replica]]:
    """Two replicas of one server that require bearer tokens (alice, bob)."""
    started: dict[str, Replica] = {}
    try:
        for name in ("A", "B"):
            started[name] = Replica(
                name,
                cursorlog.address,
                workdir,
                exec_log=workdir / "exec.log",
                extra_args=("--tokens", "tok-alice=alice,tok-bob=bob"),
            )
        yield started
    finally:
        for replica in started.values():
            replica.stop()


def data_of(response: httpx.Response) -> list[dict[str, Any]]:
    out = []
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            out.append(json.loads(line[5:]))
    return out


async def initialize(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> tuple[str, str]:
    response = await http.post(url, json=INIT, headers={**ACCEPT, **headers})
    assert response.status_code == 200, response.text
    session = response.headers["mcp-session-id"]
    version = data_of(response)[0]["result"]["protocolVersion"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    sent = await http.post(
        url, json=note, headers={**ACCEPT, **headers, "mcp-session-id": session, "mcp-protocol-version": version}
    )
    assert sent.status_code == 202, sent.text
    return session, version


async def call_whoami(http: httpx.AsyncClient, url: str, headers: dict[str, str], session: str, version: str) -> Any:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "whoami", "arguments": {}}}
    return await http.post(
        url, json=body, headers={**ACCEPT, **headers, "mcp-session-id": session, "mcp-protocol-version": version}
    )


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_dns_rebinding_protection_holds_on_the_creating_and_the_restoring_replica(
    authed: dict[str, Replica],
) -> None:
    a, b = authed["A"], authed["B"]
    evil = {"host": "evil.example", **bearer("tok-alice")}
    async with httpx.AsyncClient(timeout=20) as http:
        refused = await http.post(a.url, json=INIT, headers={**ACCEPT, **evil})
        assert refused.status_code == 421, refused.text
        assert "mcp-session-id" not in refused.headers

        session, version = await initialize(http, a.url, bearer("tok-alice"))
        # On A the SDK holds the session; on B the middleware would restore it first. Both
        # answer a forged Host with the SDK's 421, and B restores nothing for it.
        for replica in (a, b):
            forged = await call_whoami(http, replica.url, evil, session, version)
            assert forged.status_code == 421, (replica.name, forged.status_code, forged.text)
        assert f"session {session}: restored" not in b.log_text()
        served = await call_whoami(http, b.url, bearer("tok-alice"), session, version)
        assert served.status_code == 200, served.text
        assert data_of(served)[-1]["result"]["content"][0]["text"] == "B"
        assert f"session {session}: restored from cursorlog" in b.log_text()


async def test_bearer_auth_and_session_ownership_hold_on_every_replica(authed: dict[str, Replica]) -> None:
    a, b = authed["A"], authed["B"]
    async with httpx.AsyncClient(timeout=20) as http:
        unauthenticated = await http.post(a.url, json=INIT, headers=ACCEPT)
        assert unauthenticated.status_code == 401, unauthenticated.text
        wrong = await http.post(a.url, json=INIT, headers={**ACCEPT, **bearer("tok-mallory")})
        assert wrong.status_code == 401, wrong.text

        session, version = await initialize(http, a.url, bearer("tok-alice"))
        # Another credential presenting alice's session: the SDK's 404 on A (it holds the
        # session), and the same 404 on B, where the restore is refused for bob.
        for replica in (a, b):
            stolen = await call_whoami(http, replica.url, bearer("tok-bob"), session, version)
            assert stolen.status_code == 404, (replica.name, stolen.status_code, stolen.text)
            missing = await call_whoami(http, replica.url, {}, session, version)
            assert missing.status_code == 401, (replica.name, missing.status_code, missing.text)
        assert "another credential than its creator's" in b.log_text()
        # alice is still served on both replicas (bob's attempt did not take the session over).
        for replica in (a, b):
            mine = await call_whoami(http, replica.url, bearer("tok-alice"), session, version)
            assert mine.status_code == 200, (replica.name, mine.text)
            assert data_of(mine)[-1]["result"]["content"][0]["text"] == replica.name
