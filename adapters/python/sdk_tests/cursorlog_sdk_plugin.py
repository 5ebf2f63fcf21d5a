"""A pytest plugin that runs the ``mcp`` SDK's own streamable-HTTP resumption tests with the
cursorlog store swapped in (see ``run.sh``).

The SDK's tests use two stores, ``SimpleEventStore`` (``tests/shared/test_streamable_http.py``)
and ``SequencedEventStore`` (``tests/interaction``). This plugin replaces each with a
``CursorlogEventStore`` on a real cursorlog server (a spy subclass that also keeps the list
those tests inspect) and wires the app the way a user does: ``CursorlogMiddleware`` around the
app of the SDK's own builder (``mounted_app``, ``connect_over_streamable_http``) or around the
hand-built manager of ``running_app``. Nothing else in the tests changes.

Only tests that use an event store are collected. The tests listed in ``EXCEPTIONS`` depend on
the exact event-id format or on the SDK's silent handling of an unknown cursor; they are run as
strict xfails, so CI fails if one starts passing (update the list) or fails for another reason
in a way that makes it pass. Each has its reason.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from cursorlog_mcp import CursorlogEventStore, CursorlogMiddleware

FILES = (
    "tests/shared/test_streamable_http.py",
    "tests/interaction/transports/test_hosting_resume.py",
    "tests/interaction/transports/test_client_transport_http.py",
)

EXCEPTIONS: dict[str, str] = {
    "test_a_post_sse_stream_begins_with_a_priming_event_and_stamps_every_event": (
        "pins the exact event ids (snapshot of the store's sequential '1', '2', ...); cursorlog ids are "
        "'{epoch}-{stream}-{seq}'"
    ),
    "test_get_with_last_event_id_replays_only_that_streams_missed_events": (
        "pins the exact event ids of the replay (snapshot of sequential ids)"
    ),
    "test_a_pre_2025_11_25_reconnect_replays_without_minting_a_priming_event": (
        "pins the exact event ids of the replay (snapshot of sequential ids)"
    ),
    "test_an_unknown_last_event_id_yields_an_empty_replay_stream": (
        "pins the SDK's silent empty stream for an unknown cursor; cursorlog answers it with an explicit "
        "-32011 error (UNKNOWN_CURSOR)"
    ),
    "test_a_captured_resumption_token_replays_missed_messages_on_a_new_connection": (
        "pins the exact event ids (snapshot ['3', '4']) and reads the SDK-local session id from "
        "manager._server_instances, which is not the client-facing id cursorlog-mcp issues"
    ),
}

_STORES: list[CursorlogEventStore] = []


# -- a real cursorlog for the run ---------------------------------------------------------------------
class _Cursorlog:
    def __init__(self) -> None:
        binary = os.environ.get("CURSORLOG_BIN")
        if not binary or not Path(binary).is_file():
            raise RuntimeError(f"CURSORLOG_BIN must name the cursorlog binary (got {binary!r})")
        self.dir = Path(tempfile.mkdtemp(prefix="cursorlog-sdk-tests-"))
        self.log = (self.dir / "cursorlog.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(self.dir / "data")],
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        self.address = ""
        while time.monotonic() < deadline and not self.address:
            line = self.proc.stdout.readline().decode()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"cursorlog exited with {self.proc.returncode}")
            if match := re.search(r"(127\.0\.0\.1:\d+)", line):
                self.address = match.group(1)
        if not self.address:
            raise RuntimeError("cursorlog did not print its address")

    def stop(self) -> None:
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_SERVER: _Cursorlog | None = None


def _address() -> str:
    global _SERVER
    if _SERVER is None:
        _SERVER = _Cursorlog()
    return _SERVER.address


# -- the stores the SDK's tests construct ---------------------------------------------------------------------
class CursorlogSimpleEventStore(CursorlogEventStore):
    """Stands in for ``SimpleEventStore``: cursorlog behind, ``_events`` kept as the tests read it."""

    def __init__(self) -> None:
        super().__init__(_address())
        self._events: list[tuple[str, str, Any]] = []
        _STORES.append(self)

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = await super().store_event(stream_id, message)
        self._events.append((stream_id, event_id, message))
        return event_id


class CursorlogSequencedEventStore(CursorlogEventStore):
    """Stands in for ``SequencedEventStore`` (``_events`` and ``wait_until_stored`` as there)."""

    def __init__(self) -> None:
        super().__init__(_address())
        self._events: list[tuple[str, Any]] = []
        self._milestones: dict[int, anyio.Event] = {}
        _STORES.append(self)

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = await super().store_event(stream_id, message)
        self._events.append((stream_id, message))
        milestone = self._milestones.pop(len(self._events), None)
        if milestone is not None:
            milestone.set()
        return event_id

    async def wait_until_stored(self, count: int) -> None:
        if len(self._events) >= count:
            return
        await self._milestones.setdefault(count, anyio.Event()).wait()


# -- the app helpers, wired as a user wires cursorlog ---------------------------------------------------------
def _patched_running_app(module: Any) -> Any:
    @asynccontextmanager
    async def running_app(
        is_json_response_enabled: bool = False,
        event_store: Any = None,
        retry_interval: int | None = None,
        server: Any = None,
    ) -> AsyncIterator[Any]:
        session_manager = module.StreamableHTTPSessionManager(
            app=server if server is not None else module._create_server(),
            event_store=event_store,
            json_response=is_json_response_enabled,
            security_settings=module.TransportSecuritySettings(enable_dns_rebinding_protection=False),
            retry_interval=retry_interval,
        )
        app: Any = module.Starlette(routes=[module.Mount("/mcp", app=session_manager.handle_request)])
        if isinstance(event_store, CursorlogEventStore):
            app = CursorlogMiddleware(app, store=event_store, session_manager=session_manager)
        async with session_manager.run():
            yield app

    return running_app


def _wire_builder() -> None:
    """Every app the SDK's builder returns for a cursorlog store gets the middleware, exactly as
    a user adds it after calling ``streamable_http_app(event_store=store)`` (the SDK's helpers
    ``mounted_app`` and ``connect_over_streamable_http`` call that builder)."""
    from mcp.server.lowlevel.server import Server

    build = Server.streamable_http_app
    if getattr(build, "_cursorlog_wired", False):
        return

    def streamable_http_app(self: Any, **kwargs: Any) -> Any:
        app = build(self, **kwargs)
        store = kwargs.get("event_store")
        if isinstance(store, CursorlogEventStore):
            app.add_middleware(CursorlogMiddleware, store=store, server=self)
        return app

    streamable_http_app._cursorlog_wired = True  # type: ignore[attr-defined]
    Server.streamable_http_app = streamable_http_app  # type: ignore[method-assign]


def _swap_in(module: Any) -> None:
    name = module.__name__
    if name.endswith("test_streamable_http") and hasattr(module, "SimpleEventStore"):
        module.SimpleEventStore = CursorlogSimpleEventStore
        module.running_app = _patched_running_app(module)
    if hasattr(module, "SequencedEventStore"):
        module.SequencedEventStore = CursorlogSequencedEventStore


def _uses_a_store(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    if function is None:
        return False
    source = inspect.getsource(function)
    fixtures = getattr(item, "fixturenames", ())
    return "event_app" in fixtures or "event_store" in fixtures or re.search(r"EventStore\(|event_store=", source)


# -- hooks ----------------------------------------------------------------------------------------------------------
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    _wire_builder()
    for module in {item.module for item in items if getattr(item, "module", None) is not None}:  # type: ignore[attr-defined]
        _swap_in(module)
    selected, deselected = [], []
    for item in items:
        (selected if _uses_a_store(item) else deselected).append(item)
    for item in selected:
        name = getattr(item, "originalname", item.name)
        if name in EXCEPTIONS:
            item.add_marker(pytest.mark.xfail(strict=True, reason=EXCEPTIONS[name]))
    missing = set(EXCEPTIONS) - {getattr(i, "originalname", i.name) for i in selected}
    if missing:
        raise pytest.UsageError(f"listed exceptions not found among the SDK's tests: {sorted(missing)}")
    config.hook.pytest_deselected(items=deselected)
    items[:] = selected


def pytest_sessionstart(session: pytest.Session) -> None:
    _address()  # started before any event loop runs (the SDK's suite flags blocking calls in loops)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SERVER is not None:
        _SERVER.stop()


@pytest.fixture(autouse=True)
def _cursorlog_stores() -> Iterator[None]:
    yield
    _STORES.clear()
