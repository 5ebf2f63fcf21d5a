#!/usr/bin/env bash
# The mcp 1.x SDK's own experimental-task tests (tests/experimental/tasks), with every
# InMemoryTaskStore replaced by a CursorlogTaskStore on a real cursorlog.
#
#   bash adapters/python-tasks/sdk_tests/run.sh <python of a venv that has cursorlog-mcp-tasks installed>
#
# Fetches the SDK's source distribution (its tests) once into
# ${CARGO_TARGET_DIR:-<repo>/target}/mcp-sdk-<version>, and runs the tests through
# cursorlog_tasks_plugin.py (which lists the exceptions and why). Needs CURSORLOG_BIN.
set -euo pipefail

SDK_VERSION="${SDK_VERSION:-1.30.0}"   # keep in step with the pin in ../ci.sh

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
python="$(cd "$(dirname "${1:?usage: run.sh <venv python>}")" && pwd)/$(basename "$1")"
cache="$target/mcp-sdk-$SDK_VERSION"
src="$cache/mcp-$SDK_VERSION"

if [[ ! -d "$src/tests/experimental/tasks" ]]; then
    mkdir -p "$cache"
    "$python" -m pip download --quiet --no-deps --no-binary :all: "mcp==$SDK_VERSION" -d "$cache"
    tar -xzf "$cache/mcp-$SDK_VERSION.tar.gz" -C "$cache"
fi

cd "$src"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
# The SDK's addopts ask for pytest-xdist (--numprocesses auto); one process shares one cursorlog.
exec "$python" -m pytest -p cursorlog_tasks_plugin -p no:cacheprovider -o addopts= -o log_cli=false -rfEx --color=no \
    tests/experimental/tasks
