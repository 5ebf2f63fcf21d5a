"""The two ids of a session: the client's ``Mcp-Session-Id`` (minted by ``CursorlogMiddleware``,
the same on every replica, the one cursorlog keys the session by) and the id each replica's SDK
uses for its in-process copy. Only the first names a session from outside: a request that
carries a replica-local id would reach the SDK without a cursorlog binding, so it is answered
as an unknown session. And a tool can read both (``examples/replica.py``'s ``session_ids``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .harness import CursorlogServer, Replica

pytestmark = pytest.mark.anyio

ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
NOT_FOUND = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}}


@pytest.fixture(scope="module")
def replicas(cursorlog: CursorlogServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Replica]]:
    workdir = tmp_path_factory.mktemp("session-ids")
    started: dict[str, Replica] = {}
    try:
        for name in ("A", "B"):
            started[name] = Replica(name, cursorlog.address, workdir, exec_log=workdir / "exec.log")
        yield started
    finally:
        for replica in started.values():
            replica.stop()


def data_of(response: httpx.Response) -> list[dict[str, Any]]:
    if response.headers.get("content-type", "").startswith("application/json"):
        return [response.json()]
    return [
        json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()
    ]


async def initialize(http: httpx.AsyncClient, url: str, protocol: str) -> str:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": protocol, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    response = await http.post(url, json=init, headers=ACCEPT)
    assert response.status_code == 200, response.text
    assert data_of(response)[0]["result"]["protocolVersion"] == protocol
    session = response.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    sent = await http.post(url, json=note, headers=headers_for(session, protocol))
    assert sent.status_code == 202, sent.text
    return session


def headers_for(session: str, protocol: str) -> dict[str, str]:
    return {**ACCEPT, "mcp-session-id": session, "mcp-protocol-version": protocol}


async def call(http: httpx.AsyncClient, url: str, session: str, protocol: str, tool: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": tool, "arguments": {}}}
    return await http.post(url, json=body, headers=headers_for(session, protocol))


def text_result(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    result = data_of(response)[-1]["result"]
    assert not result.get("isError"), result
    return str(result["content"][0]["text"])


async def session_ids(http: httpx.AsyncClient, url: str, session: str, protocol: str) -> dict[str, str]:
    ids: dict[str, str] = json.loads(text_result(await call(http, url, session, protocol, "session_ids")))
    return ids


@pytest.mark.parametrize("protocol", ["2025-11-25", "2025-06-18"])
async def test_a_request_with_a_replica_local_session_id_is_an_unknown_session(
    replicas: dict[str, Replica], protocol: str
) -> None:
    a, b = replicas["A"], replicas["B"]
    async with httpx.AsyncClient(timeout=20) as http:
        session = await initialize(http, a.url, protocol)
        local = (await session_ids(http, a.url, session, protocol))["sdk"]
        assert local and local != session
        # The SDK of replica A holds a session under `local`; presented from outside it is no
        # session at all (2025-11-25: not a 500 from an unbound priming event; 2025-06-18: not
        # served without a cursorlog binding), on the replica that minted it and on another.
        for replica in (a, b):
            for method in ("POST", "GET", "DELETE"):
                if method == "POST":
                    response = await call(http, replica.url, local, protocol, "whoami")
                else:
                    response = await http.request(method, replica.url, headers=headers_for(local, protocol))
                assert response.status_code == 404, (replica.name, method, response.status_code, response.text)
                assert response.json() == NOT_FOUND, (replica.name, method)
                assert "mcp-session-id" not in response.headers
        # ... and the session itself is untouched, under the client's id, everywhere.
        for replica in (a, b):
            assert text_result(await call(http, replica.url, session, protocol, "whoami")) == replica.name
    for replica in (a, b):
        assert "SessionBindingError" not in replica.log_text(), replica.name


async def test_a_tool_reads_the_clients_session_id_and_its_replicas_own(replicas: dict[str, Replica]) -> None:
    a, b = replicas["A"], replicas["B"]
    protocol = "2025-11-25"
    async with httpx.AsyncClient(timeout=20) as http:
        session = await initialize(http, a.url, protocol)
        on_a = await session_ids(http, a.url, session, protocol)
        on_b = await session_ids(http, b.url, session, protocol)  # restored on B from cursorlog
    # `cursorlog_mcp.client_session_id()` is the client's id on every replica; the SDK's request
    # headers (`ctx.headers`) carry each replica's own id for its in-process copy.
    assert on_a["client"] == on_b["client"] == session
    assert on_a["sdk"] != session and on_b["sdk"] != session
    assert on_a["sdk"] != on_b["sdk"]
