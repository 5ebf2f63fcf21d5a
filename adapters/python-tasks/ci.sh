#!/usr/bin/env bash
# CI for cursorlog-mcp-tasks (the mcp 1.x TaskStore). Idempotent; needs python3 >= 3.10 with
# venv, PyPI access, and the cursorlog binary (cargo build -p cursorlog-server --bins).
#
#   bash adapters/python-tasks/ci.sh
#
# Environment: CARGO_TARGET_DIR (default <repo>/target) locates the binary and holds the venv
# (<target>/py-tasks-venv); CURSORLOG_BIN overrides the binary; CURSORLOG_PROTO_ROOT the proto root
# the stubs are checked against (default <repo>/proto/proto); PYTEST_ARGS adds pytest arguments.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
venv="$target/py-tasks-venv"
export CURSORLOG_BIN="${CURSORLOG_BIN:-$target/debug/cursorlog}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

if [[ ! -x "$CURSORLOG_BIN" ]]; then
    echo "ci.sh: cursorlog binary not found at $CURSORLOG_BIN (run: cargo build -p cursorlog-server --bins)" >&2
    exit 1
fi

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)'; then
    echo "ci.sh: $python is $("$python" --version 2>&1); cursorlog-mcp-tasks needs Python >= 3.10" >&2
    exit 1
fi
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi

# The SDK whose TaskStore this implements and whose own task tests run below (the last 1.x
# with the task runtime; pyproject.toml allows mcp>=1.30,<2).
export SDK_VERSION=1.30.0

echo "--- installing cursorlog-mcp-tasks[test] with mcp==$SDK_VERSION into $venv"
"$venv/bin/python" -m pip install --quiet --editable "$here[test]" "mcp==$SDK_VERSION"

echo "--- pip check"
"$venv/bin/python" -m pip check

echo "--- checking the committed gRPC stubs against proto/"
"$venv/bin/python" -m cursorlog_mcp_tasks.codegen --check --proto-root "${CURSORLOG_PROTO_ROOT:-$repo/proto/proto}"

echo "--- ruff (undefined names, unused imports, syntax)"
"$venv/bin/ruff" check --quiet --select F,E9 "$here/src" "$here/tests" "$here/sdk_tests"

echo "--- mypy --strict (the package is typed: py.typed)"
(cd "$here" && "$venv/bin/mypy" src/cursorlog_mcp_tasks sdk_tests/cursorlog_tasks_plugin.py)

status=0
echo "--- pytest (cursorlog binary: $CURSORLOG_BIN)"
cd "$here"
# shellcheck disable=SC2086  # PYTEST_ARGS is a word list on purpose
"$venv/bin/python" -m pytest -p no:cacheprovider --color=no ${PYTEST_ARGS:-} || status=$?

echo "--- the mcp $SDK_VERSION SDK's own task tests, cursorlog store swapped in (sdk_tests/)"
bash "$here/sdk_tests/run.sh" "$venv/bin/python" || status=$?
exit "$status"
