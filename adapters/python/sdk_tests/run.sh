#!/usr/bin/env bash
# The mcp SDK's own streamable-HTTP resumption tests, with the cursorlog store swapped in.
#
#   bash adapters/python/sdk_tests/run.sh <python of a venv that has cursorlog-mcp installed>
#
# Fetches the SDK's source distribution (its tests and uv.lock) once into
# ${CARGO_TARGET_DIR:-<repo>/target}/mcp-sdk-<version>, installs the SDK's test dependencies at
# the versions its uv.lock pins, and runs the resumption tests through cursorlog_sdk_plugin.py
# (which lists the exceptions and why). Needs CURSORLOG_BIN.
set -euo pipefail

SDK_VERSION=2.3.0   # keep in step with the mcp pin in ../pyproject.toml

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
python="$(cd "$(dirname "${1:?usage: run.sh <venv python>}")" && pwd)/$(basename "$1")"
cache="$target/mcp-sdk-$SDK_VERSION"
src="$cache/mcp-$SDK_VERSION"

bash "$here/fetch.sh" "$python" "$cache" "$SDK_VERSION"

cd "$src"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m pytest -p cursorlog_sdk_plugin -p no:cacheprovider -q --color=no \
    tests/shared/test_streamable_http.py \
    tests/interaction/transports/test_hosting_resume.py \
    tests/interaction/transports/test_client_transport_http.py
