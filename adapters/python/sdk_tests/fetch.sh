#!/usr/bin/env bash
# Fetches the mcp SDK's source distribution and writes the pip constraints of its uv.lock.
#
#   bash fetch.sh <python> <cache dir> <sdk version>    -> <cache>/mcp-<version>/, <cache>/constraints.txt
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="$1" cache="$2" version="$3"
src="$cache/mcp-$version"
if [[ ! -f "$src/uv.lock" ]]; then
    mkdir -p "$cache"
    "$python" -m pip download --quiet --no-deps --no-binary :all: "mcp==$version" -d "$cache"
    tar -xzf "$cache/mcp-$version.tar.gz" -C "$cache"
fi
"$python" "$here/constraints.py" "$src/uv.lock" > "$cache/constraints.txt"
