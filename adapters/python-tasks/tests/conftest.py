"""One real cursorlog per test session; every test uses fresh owners, so tests never see each
other's tasks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import CursorlogServer


@pytest.fixture(scope="session")
def cursorlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir: Path = tmp_path_factory.mktemp("cursorlog")
    server = CursorlogServer(workdir / "data", workdir / "cursorlog.log")
    try:
        yield server.address
    finally:
        server.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def owner() -> str:
    return f"test:{uuid.uuid4().hex}"
