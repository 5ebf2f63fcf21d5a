#!/usr/bin/env bash
# The single-node peer comparison: the `single` part of benches/scoreboard.sh with its extras,
# in one run, back to back on the same disk, ROUNDS times interleaved:
#   - cursorlog (--sync always) AppendStream, 50 producers, batch 1 and 16, against Redis
#     Streams XADD (appendonly yes, appendfsync always), 50 clients, pipelining 1 and 16
#   - replay of a 100k-event stream, single client: cursorlog Read vs Redis XRANGE COUNT 1000
#   - the extras: unary Append at batch 1 and 16, and the raw disk ceiling (one writer, 512 B
#     appends, fdatasync per 1 and per 64 appends)
# and prints the scoreboard's table for them (medians, ratios, issue 31's targets, CPU µs per
# event of every process).
#
# Usage: benches/compare.sh            (about 5 minutes with the defaults, after the build)
# Knobs: those of scoreboard.sh that apply (ROUNDS=3, DURATION=8, CLIENTS=50, PAYLOAD=512,
#   REPLAY_EVENTS=100000, DISK_SECS=3, OUT, CURSORLOG_BENCH_DIR, CARGO_TARGET_DIR, SKIP_BUILD=1,
#   LABEL). The whole scoreboard (replicated, tasks, SDK front-ends too): benches/scoreboard.sh.
set -euo pipefail
PARTS=single SINGLE_EXTRAS=1 exec "$(dirname "${BASH_SOURCE[0]}")/scoreboard.sh" "$@"
