"""The committed gRPC stubs match the repository's proto (regenerated into a temp dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cursorlog_mcp import codegen

from .harness import REPO


def test_committed_stubs_match_the_proto() -> None:
    proto_root = REPO / "proto" / "proto"
    assert (proto_root / codegen.PROTO_FILE).is_file(), proto_root
    stale = codegen.stale_files(proto_root)
    assert not stale, (
        "the committed stubs in src/cursorlog_mcp/_proto differ from what "
        f"{codegen.PROTO_FILE} generates; run `python -m cursorlog_mcp.codegen --write`:\n"
        + "\n".join(diff[:2000] for diff in stale.values())
    )


def test_the_check_notices_a_changed_proto(tmp_path: Path) -> None:
    source = (REPO / "proto" / "proto" / codegen.PROTO_FILE).read_text()
    changed = tmp_path / codegen.PROTO_FILE
    changed.parent.mkdir(parents=True)
    changed.write_text(source.replace("message StatsRequest {}", "message StatsRequest { bool verbose = 1; }"))
    assert set(codegen.stale_files(tmp_path)) == {"cursorlog_pb2.py", "cursorlog_pb2.pyi"}


def test_middleware_refuses_what_it_cannot_bind() -> None:
    from cursorlog_mcp import CursorlogEventStore, CursorlogMiddleware

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="CursorlogEventStore"):
        CursorlogMiddleware(app, store=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease_ms"):
        CursorlogEventStore("127.0.0.1:1", lease_ms=0)
    with pytest.raises(ValueError, match="gap"):
        CursorlogEventStore("127.0.0.1:1", on_evicted="drop")
