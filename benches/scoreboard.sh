#!/usr/bin/env bash
# The scoreboard of issue 31: cursorlog against the setup a user would otherwise write, in one
# sitting on one machine, every pair interleaved (rounds alternate which side goes first), and
# ONE table of ratios against the issue's targets with the CPU µs per event (or per task) of
# every process. Parts (PARTS, comma-separated; default all four):
#   single      cursorlog --sync always vs Redis Streams (appendonly yes, appendfsync always):
#               AppendStream batch 1 (CLIENTS producers) vs XADD, batch 16 vs XADD pipelining
#               16, replay of a REPLAY_EVENTS-event stream (Read) vs XRANGE COUNT 1000 paging
#   replicated  a 3-member cluster vs a single node, AppendStream batch 1 and 16
#               (`cursorlog-bench replicated --parts throughput`)
#   tasks       CursorlogTaskStore vs a Redis TaskStore (appendfsync always), 1/16/64 tasks in
#               flight (adapters/typescript `bench/tasks-bench.ts`)
#   sdk         the Python, TypeScript and rmcp MCP front-ends, cursorlog adapter vs a Redis
#               Streams EventStore (SDKS selects among python,typescript,rmcp)
#
# Usage: benches/scoreboard.sh     (about 15 minutes with the defaults, after the builds)
# Knobs (environment), with defaults:
#   PARTS=single,replicated,tasks,sdk  ROUNDS=3 (rounds of every pair)  DURATION=8 (s per window)
#   CLIENTS=50  PAYLOAD=512  REPLAY_EVENTS=100000
#   TASKS=1:60,16:320,64:640 (in flight:tasks per round)  TASKS_GETS=200  TASKS_EVERYSEC= (1: add
#     Redis appendfsync everysec as a third side, shown in the table without a target)
#   SDKS=python,typescript,rmcp  SDK_ROUNDS=7  SDK_CALLS=200  PY_EVENTS=20  TS_STEPS=10  RMCP_EVENTS=50
#   SINGLE_EXTRAS= (1: also unary Append at batch 1 and 16 and the raw disk ceiling, as compare.sh)
#   DISK_SECS=3  OUT=<dir for the JSON/CSV and scoreboard.md; default a temp dir, kept>
#   CURSORLOG_BENCH_DIR (data; default target/bench-data: the repository's disk)
#   CARGO_TARGET_DIR (default target/)  SKIP_BUILD=1  LABEL=<a note printed with the commit>
# Installs what is missing: redis-server and redis-tools (apt-get), the TypeScript adapter's
# node_modules (npm ci), a Python venv with adapters/python[bench] under $CARGO_TARGET_DIR
# (py-bench-venv, pip). A part that fails is reported as such; the others still run.
set -euo pipefail
# shellcheck source=benches/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PARTS=${PARTS:-single,replicated,tasks,sdk}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
CLIENTS=${CLIENTS:-50}
PAYLOAD=${PAYLOAD:-512}
REPLAY_EVENTS=${REPLAY_EVENTS:-100000}
DISK_SECS=${DISK_SECS:-3}
TASKS=${TASKS:-1:60,16:320,64:640}
TASKS_GETS=${TASKS_GETS:-200}
SDKS=${SDKS:-python,typescript,rmcp}
SDK_ROUNDS=${SDK_ROUNDS:-7}
SDK_CALLS=${SDK_CALLS:-200}
PY_EVENTS=${PY_EVENTS:-20}
TS_STEPS=${TS_STEPS:-10}
RMCP_EVENTS=${RMCP_EVENTS:-50}
TS_DIR=$REPO/adapters/typescript

has() { [[ ",$1," == *",$2,"* ]]; }
for p in ${PARTS//,/ }; do
  case $p in single | replicated | tasks | sdk) ;; *) die "unknown part $p (single, replicated, tasks, sdk)" ;; esac
done

# --- builds and installs ----------------------------------------------------------------
sb_build
sb_install_redis
if has "$PARTS" sdk && has "$SDKS" rmcp && [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building the rmcp front-end benchmark (cargo bench --no-run -p cursorlog-rmcp --bench rmcp_load)"
  (cd "$REPO" && CARGO_TARGET_DIR=$TARGET_DIR cargo bench -q --no-run -p cursorlog-rmcp --bench rmcp_load)
fi
if has "$PARTS" tasks || { has "$PARTS" sdk && has "$SDKS" typescript; }; then
  command -v node >/dev/null || die "node (>= 20) is needed for the tasks and TypeScript parts"
  if [[ ! -d $TS_DIR/node_modules ]]; then
    log "installing the TypeScript adapter's dependencies (npm ci)"
    (cd "$TS_DIR" && npm ci --no-audit --no-fund --loglevel=error >&2)
  fi
  if [[ -z "${SKIP_BUILD:-}" || ! -f $TS_DIR/dist/bench/tasks-bench.js ]]; then
    log "building the TypeScript adapter and its benches (npm run build)"
    (cd "$TS_DIR" && npm run -s build >&2)
  fi
fi
PY_VENV=$TARGET_DIR/py-bench-venv
if has "$PARTS" sdk && has "$SDKS" python; then
  if [[ ! -x $PY_VENV/bin/python ]] || ! "$PY_VENV/bin/python" -c 'import cursorlog_mcp, redis, uvloop, uvicorn' 2>/dev/null; then
    log "installing cursorlog-mcp[bench] into $PY_VENV (pip)"
    rm -rf "$PY_VENV"
    python3 -m venv "$PY_VENV"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY_VENV/bin/python" -m pip install -q --editable "$REPO/adapters/python[bench]" >&2
  fi
fi

mkdir -p "$DATA_ROOT"
WORK=$(mktemp -d "$DATA_ROOT/scoreboard-XXXXXX")
OUT=${OUT:-$WORK/results}
mkdir -p "$OUT"
trap sb_cleanup EXIT
trap 'exit 130' INT TERM
fs=$(df -T "$WORK" | awk 'NR==2 {print $2" on "$1}')
log "data in $WORK ($fs); results in $OUT"
sb_record_run
printf 'PARTS=%s ROUNDS=%s DURATION=%s CLIENTS=%s PAYLOAD=%s REPLAY_EVENTS=%s TASKS=%s SDKS=%s SDK_ROUNDS=%s SDK_CALLS=%s\n' \
  "$PARTS" "$ROUNDS" "$DURATION" "$CLIENTS" "$PAYLOAD" "$REPLAY_EVENTS" "$TASKS" "$SDKS" "$SDK_ROUNDS" "$SDK_CALLS" >"$OUT/knobs"

# --- the parts ----------------------------------------------------------------------------
part_single() {
  start_redis
  local round
  for round in $(seq "$ROUNDS"); do
    # Odd rounds cursorlog first, even rounds the peer first.
    if ((round % 2)); then
      cursorlog_append 1 "$round" stream; redis_xadd 1 "$round"
      cursorlog_append 16 "$round" stream; redis_xadd 16 "$round"
      cursorlog_replay "$round"; redis_replay "$round"
    else
      redis_xadd 1 "$round"; cursorlog_append 1 "$round" stream
      redis_xadd 16 "$round"; cursorlog_append 16 "$round" stream
      redis_replay "$round"; cursorlog_replay "$round"
    fi
    if [[ -n "${SINGLE_EXTRAS:-}" ]]; then
      disk_ceiling "$round"
      cursorlog_append 1 "$round" unary
      cursorlog_append 16 "$round" unary
    fi
  done
  cursorlog_stalled
  redis-cli -p "$REDIS_PORT" info persistence | tr -d '\r' | grep -E '^aof_(enabled|rewrites|last_write_status)' >&2 || true
  stop_redis
}

part_replicated() {
  log "replicated vs single node: AppendStream, $CLIENTS producers, batch 1 and 16, $ROUNDS rounds of ${DURATION} s windows"
  CURSORLOG_BENCH_DIR=$WORK "$BIN/cursorlog-bench" --warmup 1 --duration "$DURATION" --quiet \
    --json "$OUT/replicated.json" replicated --parts throughput --rounds "$ROUNDS" \
    --producers "$CLIENTS" --payload "$PAYLOAD" --batches 1,16 >&2
}

part_tasks() {
  local sides=cursorlog,redis-always
  [[ -n "${TASKS_EVERYSEC:-}" ]] && sides+=,redis-everysec
  log "tasks: CursorlogTaskStore vs Redis TaskStore ($sides), $TASKS, $ROUNDS rounds"
  mkdir -p "$WORK/tasks"
  (cd "$TS_DIR" && node dist/bench/tasks-bench.js --cursorlog-bin "$BIN/cursorlog" --rounds "$ROUNDS" \
    --tasks "$TASKS" --gets "$TASKS_GETS" --sides "$sides" --data-root "$WORK/tasks" \
    --json "$OUT/tasks.json" >&2)
}

part_sdk() {
  local failed=0
  if has "$SDKS" python; then
    log "SDK front-ends: Python mcp, $SDK_CALLS calls x ($PY_EVENTS + 1) events, $SDK_ROUNDS rounds"
    "$PY_VENV/bin/python" "$REPO/adapters/python/bench/run_bench.py" --cursorlog-bin "$BIN/cursorlog" \
      --calls "$SDK_CALLS" --events "$PY_EVENTS" --rounds "$SDK_ROUNDS" --sides cursorlog,redis \
      --loop uvloop --workdir "$WORK" --json "$OUT/sdk-python.json" >&2 || failed=1
  fi
  if has "$SDKS" typescript; then
    log "SDK front-ends: TypeScript SDK, $SDK_CALLS calls x ($TS_STEPS + 1) events, $SDK_ROUNDS rounds"
    mkdir -p "$WORK/ts"
    (cd "$TS_DIR" && node dist/bench/bench.js --cursorlog-bin "$BIN/cursorlog" --calls "$SDK_CALLS" \
      --steps "$TS_STEPS" --rounds "$SDK_ROUNDS" --sides cursorlog,redis --data-root "$WORK/ts" \
      --json "$OUT/sdk-typescript.json" >&2) || failed=1
  fi
  if has "$SDKS" rmcp; then
    log "SDK front-ends: rmcp, $SDK_CALLS calls x ($RMCP_EVENTS + 1) events, $SDK_ROUNDS rounds"
    mkdir -p "$WORK/rmcp"
    (cd "$REPO" && TMPDIR=$WORK/rmcp CARGO_TARGET_DIR=$TARGET_DIR cargo bench -q -p cursorlog-rmcp \
      --bench rmcp_load -- --calls "$SDK_CALLS" --events "$RMCP_EVENTS" --rounds "$SDK_ROUNDS" \
      --cursorlog-bin "$BIN/cursorlog" --json "$OUT/sdk-rmcp.json" >&2) || failed=1
  fi
  return "$failed"
}

# Each part in its own subshell, run as a plain command (not in an `if` or `||`, where bash
# would switch `set -e` off inside it), which stops its own processes when it ends; a failed
# part is recorded and the next one runs.
for part in single replicated tasks sdk; do
  has "$PARTS" "$part" || continue
  started=$SECONDS
  set +e
  (
    set -e
    trap 'stop_cursorlog; stop_redis' EXIT
    trap 'exit 130' INT TERM
    "part_$part"
  )
  rc=$?
  set -e
  ((rc == 130)) && exit 130
  if ((rc == 0)); then
    echo "$((SECONDS - started))" >"$OUT/took-$part"
  else
    echo "exit $rc after $((SECONDS - started)) s" >"$OUT/failed-$part"
    log "part $part FAILED (exit $rc); going on"
  fi
done
cut -d' ' -f1-3 /proc/loadavg >"$OUT/load-after"

# --- the table ------------------------------------------------------------------------------
python3 "$REPO/benches/scoreboard.py" "$OUT"
