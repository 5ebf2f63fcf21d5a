#!/usr/bin/env bash
# CI for the Python adapter (cursorlog-mcp). Idempotent; needs python3 >= 3.11 with venv, PyPI
# access, and the cursorlog binary (cargo build -p cursorlog-server --bins).
#
#   bash adapters/python/ci.sh
#
# Environment: CARGO_TARGET_DIR (default <repo>/target) locates the binary and holds the venv
# (<target>/py-venv); CURSORLOG_BIN overrides the binary; PYTEST_ARGS adds pytest arguments.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
venv="$target/py-venv"
export CURSORLOG_BIN="${CURSORLOG_BIN:-$target/debug/cursorlog}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

if [[ ! -x "$CURSORLOG_BIN" ]]; then
    echo "ci.sh: cursorlog binary not found at $CURSORLOG_BIN (run: cargo build -p cursorlog-server --bins)" >&2
    exit 1
fi

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    echo "ci.sh: $python is $("$python" --version 2>&1); cursorlog-mcp needs Python >= 3.11" >&2
    exit 1
fi
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi

SDK_VERSION=2.3.0   # the SDK whose own tests are run below; keep in step with pyproject.toml
sdk_cache="$target/mcp-sdk-$SDK_VERSION"
echo "--- fetching the mcp $SDK_VERSION source distribution (its tests and uv.lock)"
bash "$here/sdk_tests/fetch.sh" "$venv/bin/python" "$sdk_cache" "$SDK_VERSION"

# Everything is installed at the versions the SDK's uv.lock pins, so `pip check` proves that
# cursorlog-mcp fits next to the SDK's locked dependencies (protobuf 6.x for opentelemetry-proto).
echo "--- installing cursorlog-mcp[test] and the SDK's test dependencies into $venv (SDK lock as constraints)"
"$venv/bin/python" -m pip install --quiet -c "$sdk_cache/constraints.txt" --editable "$here[test]" \
    "mcp==$SDK_VERSION" pytest-examples logfire blockbuster inline-snapshot dirty-equals opentelemetry-sdk

echo "--- pip check"
"$venv/bin/python" -m pip check

echo "--- checking the committed gRPC stubs against proto/"
"$venv/bin/python" -m cursorlog_mcp.codegen --check --proto-root "$repo/proto/proto"

echo "--- ruff (undefined names, unused imports, syntax)"
"$venv/bin/ruff" check --quiet --select F,E9 "$here/src" "$here/tests" "$here/examples" "$here/sdk_tests" "$here/bench"

echo "--- mypy --strict (the package is typed: py.typed)"
(cd "$here" && "$venv/bin/mypy" src/cursorlog_mcp)

status=0
echo "--- pytest (cursorlog binary: $CURSORLOG_BIN)"
cd "$here"
# shellcheck disable=SC2086  # PYTEST_ARGS is a word list on purpose
"$venv/bin/python" -m pytest -p no:cacheprovider ${PYTEST_ARGS:-} || status=$?

echo "--- the mcp SDK's own resumption tests, cursorlog store swapped in (sdk_tests/)"
bash "$here/sdk_tests/run.sh" "$venv/bin/python" || status=$?
exit "$status"
