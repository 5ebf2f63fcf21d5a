from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from cursorlog_mcp import CursorlogClient, CursorlogEventStore

from .harness import CursorlogServer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def cursorlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CursorlogServer]:
    """One real cursorlog server for the whole run (every test uses its own sessions)."""
    workdir = tmp_path_factory.mktemp("cursorlog")
    server = CursorlogServer(workdir / "data", workdir / "cursorlog.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def client(cursorlog: CursorlogServer) -> AsyncIterator[CursorlogClient]:
    c = CursorlogClient(cursorlog.address)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def root(cursorlog: CursorlogServer) -> AsyncIterator[CursorlogEventStore]:
    store = CursorlogEventStore(cursorlog.address, lease_ms=5_000)
    try:
        yield store
    finally:
        await store.aclose()


@pytest.fixture
def session_id() -> Iterator[str]:
    yield f"test-{uuid.uuid4().hex}"
