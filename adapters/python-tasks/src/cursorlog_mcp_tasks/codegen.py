"""Generate (or check) the committed gRPC stubs in ``cursorlog_mcp_tasks/_proto``.

The stubs are committed so that installing ``cursorlog-mcp-tasks`` needs neither ``grpcio-tools``
nor the repository's ``proto/`` tree. ``ci.sh`` (``--check``) regenerates them into a
temporary directory and fails when they differ from the committed files, so a change to
``proto/proto/cursorlog/v1/tasks.proto`` cannot go unnoticed.

    python -m cursorlog_mcp_tasks.codegen --write   # regenerate after a proto change
    python -m cursorlog_mcp_tasks.codegen --check   # exit 1 when the committed stubs are stale

Needs ``grpcio-tools`` (the ``test`` extra pins the version the committed stubs were made with).
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

PROTO_FILE = "cursorlog/v1/tasks.proto"
"""The proto, relative to the proto root (``<repo>/proto/proto``)."""

GENERATED = ("tasks_pb2.py", "tasks_pb2.pyi", "tasks_pb2_grpc.py")

_ABSOLUTE_IMPORT = "from cursorlog.v1 import tasks_pb2 as cursorlog_dot_v1_dot_tasks__pb2"
_RELATIVE_IMPORT = "from . import tasks_pb2 as cursorlog_dot_v1_dot_tasks__pb2"


class CodegenError(RuntimeError):
    """protoc failed, or its output does not have the expected shape."""


def package_dir() -> Path:
    """Where the committed stubs live."""
    return Path(__file__).resolve().parent / "_proto"


def default_proto_root() -> Path:
    """``<repo>/proto/proto``, found from this file in a source checkout."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "proto" / "proto" / PROTO_FILE
        if candidate.is_file():
            return candidate.parent.parent.parent
    raise CodegenError(
        f"cannot find proto/proto/{PROTO_FILE} above {here}; pass --proto-root (this only works "
        "from a source checkout of the cursorlog repository)"
    )


def generate(out_dir: Path, proto_root: Path | None = None) -> list[Path]:
    """Runs protoc (grpcio-tools) for the tasks proto into ``out_dir``; returns the files.

    The grpc module's absolute import of ``cursorlog.v1.tasks_pb2`` is rewritten to a
    relative one so the stubs live inside ``cursorlog_mcp_tasks._proto`` without a top-level
    ``cursorlog`` package.
    """
    try:
        from grpc_tools import protoc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise CodegenError("grpcio-tools is not installed (pip install 'cursorlog-mcp-tasks[test]')") from e
    import importlib.resources

    root = proto_root if proto_root is not None else default_proto_root()
    if not (root / PROTO_FILE).is_file():
        raise CodegenError(f"{root / PROTO_FILE} does not exist")
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as raw:
        tmp = Path(raw)
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{root}",
                f"-I{well_known}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}",
                str(root / PROTO_FILE),
            ]
        )
        if code != 0:
            raise CodegenError(f"protoc exited with {code} for {root / PROTO_FILE}")
        produced = tmp / "cursorlog" / "v1"
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in GENERATED:
            text = (produced / name).read_text(encoding="utf-8")
            if name == "tasks_pb2_grpc.py":
                if _ABSOLUTE_IMPORT not in text:
                    raise CodegenError(f"{name}: expected the line {_ABSOLUTE_IMPORT!r}; protoc output changed")
                text = text.replace(_ABSOLUTE_IMPORT, _RELATIVE_IMPORT)
            target = out_dir / name
            target.write_text(text, encoding="utf-8")
            written.append(target)
        return written


def stale_files(proto_root: Path | None = None, committed: Path | None = None) -> dict[str, str]:
    """Regenerates into a temporary directory; returns ``{file: unified diff}`` for every
    committed stub that differs (empty when all are current)."""
    committed_dir = committed if committed is not None else package_dir()
    with tempfile.TemporaryDirectory() as raw:
        fresh_dir = Path(raw)
        generate(fresh_dir, proto_root)
        diffs: dict[str, str] = {}
        for name in GENERATED:
            fresh = (fresh_dir / name).read_text(encoding="utf-8")
            path = committed_dir / name
            old = path.read_text(encoding="utf-8") if path.is_file() else ""
            if old != fresh:
                diffs[name] = "".join(
                    difflib.unified_diff(
                        old.splitlines(keepends=True),
                        fresh.splitlines(keepends=True),
                        fromfile=f"committed/{name}",
                        tofile=f"regenerated/{name}",
                        n=1,
                    )
                )
        return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the committed stubs")
    mode.add_argument("--check", action="store_true", help="exit 1 if the committed stubs are stale")
    parser.add_argument("--proto-root", type=Path, default=None, help="directory holding cursorlog/v1/tasks.proto")
    args = parser.parse_args(argv)
    if args.write:
        for path in generate(package_dir(), args.proto_root):
            print(f"wrote {path}")
        return 0
    diffs = stale_files(args.proto_root)
    if diffs:
        for name, diff in diffs.items():
            print(f"stale stub {name}:\n{diff[:4000]}", file=sys.stderr)
        print("regenerate with: python -m cursorlog_mcp_tasks.codegen --write", file=sys.stderr)
        return 1
    print("gRPC stubs are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
