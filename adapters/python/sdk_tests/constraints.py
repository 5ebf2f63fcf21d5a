"""Pins from the SDK's ``uv.lock`` as a pip constraints file, so the SDK's tests run next to the
SDK's own locked dependencies (and ``pip check`` proves cursorlog-mcp fits among them).

    python constraints.py <sdk-source-dir>/uv.lock > constraints.txt

Packages locked at more than one version (per-platform or per-Python forks) and the SDK's own
workspace packages are left out.
"""

from __future__ import annotations

import sys
import tomllib
from collections import defaultdict
from pathlib import Path


def constraints(lock: Path) -> list[str]:
    data = tomllib.loads(lock.read_text(encoding="utf-8"))
    versions: dict[str, set[str]] = defaultdict(set)
    for package in data.get("package", []):
        source = package.get("source", {})
        if "registry" not in source:
            continue  # the SDK itself and its workspace members
        versions[package["name"]].add(package["version"])
    return [f"{name}=={next(iter(v))}" for name, v in sorted(versions.items()) if len(v) == 1]


if __name__ == "__main__":
    print("\n".join(constraints(Path(sys.argv[1]))))
