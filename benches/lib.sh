# Shared pieces of benches/scoreboard.sh and benches/compare.sh: sourced, not run.
#
# Sets REPO, TARGET_DIR, BIN, DATA_ROOT; defines log/die, the release build, Redis (installed
# with apt-get when missing; one redis-server with appendonly yes, appendfsync always), a
# fresh `cursorlog serve --sync always` per measurement, and one function per single-node
# measurement (each writes its JSON/CSV into $OUT). The caller sets OUT, WORK (a temporary
# directory under DATA_ROOT, deleted on exit) and the knobs (DURATION, CLIENTS, PAYLOAD,
# REPLAY_EVENTS, DISK_SECS) before calling them, and calls `sb_cleanup` on exit.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
BIN=$TARGET_DIR/release
DATA_ROOT=${CURSORLOG_BENCH_DIR:-$REPO/target/bench-data}
SB_PY=$REPO/benches/sb_cpu.py
CL_PID=""
REDIS_PID=""
REDIS_PORT=""

log() { printf '\n=== %s\n' "$*" >&2; }
die() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

# `sb_build`: the release server and bench binaries, unless SKIP_BUILD is set.
sb_build() {
  command -v python3 >/dev/null || die "python3 is needed for the summary"
  if [[ -z "${SKIP_BUILD:-}" ]]; then
    log "building release binaries (cursorlog, cursorlog-bench, disk-ceiling, redis-replay)"
    (cd "$REPO" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -q \
        -p cursorlog-server -p cursorlog-benches --bins)
  fi
  local b
  for b in cursorlog cursorlog-bench disk-ceiling redis-replay; do
    [[ -x $BIN/$b ]] || die "$BIN/$b missing (build failed or SKIP_BUILD with another target dir)"
  done
}

# `sb_install_redis`: redis-server and redis-tools from the OS packages when missing.
sb_install_redis() {
  if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
    log "installing redis-server and redis-tools from the OS packages"
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
  fi
}

# `sb_record_run`: the date, commit and load average into $OUT (printed with the results).
sb_record_run() {
  date -u '+%Y-%m-%d %H:%M:%S UTC' >"$OUT/date"
  local commit dirty
  commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
  dirty=$({ git -C "$REPO" status --porcelain -- engine server proto replication adapters 2>/dev/null || true; } | wc -l)
  echo "commit $commit ($dirty changed files under engine/ server/ proto/ replication/ adapters/)${LABEL:+; $LABEL}" >"$OUT/commit"
  cut -d' ' -f1-3 /proc/loadavg >"$OUT/load-before"
  log "$(cat "$OUT/commit"); load average $(cat "$OUT/load-before")"
}

stop_cursorlog() {
  if [[ -n $CL_PID ]] && kill -0 "$CL_PID" 2>/dev/null; then
    kill -TERM "$CL_PID" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$CL_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$CL_PID" 2>/dev/null || true
    wait "$CL_PID" 2>/dev/null || true
  fi
  CL_PID=""
}
stop_redis() {
  if [[ -n $REDIS_PID ]] && kill -0 "$REDIS_PID" 2>/dev/null; then
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || kill -TERM "$REDIS_PID" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$REDIS_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
  fi
  REDIS_PID=""
}
# `sb_cleanup`: stops what was started, keeps the results (when OUT is inside WORK, copies them
# to a temporary directory), deletes the data.
sb_cleanup() {
  stop_cursorlog
  stop_redis
  if [[ -n ${WORK:-} && -n ${OUT:-} && $OUT == "$WORK"/* ]]; then
    local keep
    keep=$(mktemp -d "${TMPDIR:-/tmp}/cursorlog-$(basename "$0" .sh)-XXXXXX")
    cp -r "$OUT"/. "$keep"/ 2>/dev/null || true
    printf 'results (JSON/CSV) kept in %s\n' "$keep" >&2
  fi
  [[ -n ${WORK:-} ]] && rm -rf "$WORK"
}

free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  die "no free port found"
}

# `start_cursorlog NAME`: `cursorlog serve --sync always` on a fresh data dir; sets CL_PID, CL_ADDR.
start_cursorlog() {
  local dir=$WORK/cursorlog-$1
  mkdir -p "$dir"
  "$BIN/cursorlog" serve --listen 127.0.0.1:0 --data-dir "$dir/data" --sync always \
    >"$dir/stdout" 2>"$dir/stderr" &
  CL_PID=$!
  for _ in $(seq 600); do
    CL_ADDR=$(sed -n 's/^listening on //p' "$dir/stdout" | head -n1)
    [[ -n $CL_ADDR ]] && return
    kill -0 "$CL_PID" 2>/dev/null || { cat "$dir/stderr" >&2; die "cursorlog exited"; }
    sleep 0.1
  done
  die "cursorlog did not start listening"
}

# The tools' own tables go to stderr: stdout is for the summary alone.
bench() { "$BIN/cursorlog-bench" --quiet --addr "$CL_ADDR" --server-pid "$CL_PID" "$@" >&2; }

# `start_redis`: one redis-server for the single-node part (appendonly yes, appendfsync always,
# no background AOF rewrite: in Redis's favour), and a REPLAY_EVENTS-entry stream `replay`.
start_redis() {
  REDIS_PORT=$(free_port)
  mkdir -p "$WORK/redis"
  log "redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$REDIS_PORT, appendfsync always, dir $WORK/redis"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK/redis" \
    --appendonly yes --appendfsync always --save '' --auto-aof-rewrite-percentage 0 \
    --daemonize no --logfile "$WORK/redis/redis.log" &
  REDIS_PID=$!
  for _ in $(seq 100); do
    redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
  redis-cli -p "$REDIS_PORT" ping | grep -q PONG || die "redis did not start"
  [[ $(redis-cli -p "$REDIS_PORT" config get appendfsync | tail -n1) == always ]] || die "appendfsync is not always"
  [[ $(redis-cli -p "$REDIS_PORT" config get appendonly | tail -n1) == yes ]] || die "appendonly is not yes"
  # redis-benchmark 7.0 does not substitute __data__ in custom commands: pass a literal value.
  DATA=$(head -c "$PAYLOAD" /dev/zero | tr '\0' 'x')
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$CLIENTS" -P 16 -n "$REPLAY_EVENTS" -q \
    XADD replay '*' f "$DATA" >/dev/null
  [[ $(redis-cli -p "$REDIS_PORT" xlen replay) == "$REPLAY_EVENTS" ]] || die "redis replay stream not filled"
}

# `cursorlog_append BATCH ROUND unary|stream`: durable appends from CLIENTS producers on a
# fresh server; $OUT/cursorlog-append-{unary,stream}-b{BATCH}-r{ROUND}.json.
cursorlog_append() {
  local rpc=$3 flag=""
  [[ $rpc == stream ]] && flag=--streaming
  log "round $2: cursorlog durable appends ($rpc), $CLIENTS producers, batch $1, ${PAYLOAD} B, ${DURATION} s"
  start_cursorlog "append-$rpc-b$1-r$2"
  bench --duration "$DURATION" --json "$OUT/cursorlog-append-$rpc-b$1-r$2.json" \
    append --producers "$CLIENTS" --batch "$1" --payload "$PAYLOAD" $flag
  stop_cursorlog
}

# `redis_xadd PIPELINE ROUND`: redis-benchmark XADD from CLIENTS clients; the CSV in
# $OUT/redis-xadd-p{P}-r{R}.csv, the CPU of redis-server and redis-benchmark over the run in
# $OUT/redis-xadd-p{P}-r{R}.cpu.json.
redis_xadd() {
  local pipe=$1 calib_n rps n
  log "round $2: redis XADD, $CLIENTS clients, pipelining $pipe, ${PAYLOAD} B, about ${DURATION} s"
  # A short run warms up and sizes the measured run (redis-benchmark counts requests).
  calib_n=$((pipe == 1 ? 10000 : 50000))
  rps=$(redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$CLIENTS" -P "$pipe" -n "$calib_n" \
          --csv XADD warm '*' f "$DATA" | awk -F'"' 'NR==2 {print $4}')
  n=$(python3 -c "print(max(10000, int(float('$rps') * $DURATION)))")
  python3 "$SB_PY" --out "$OUT/redis-xadd-p$pipe-r$2.cpu.json" --stdout "$OUT/redis-xadd-p$pipe-r$2.csv" \
    --pid "redis-server=$REDIS_PID" -- \
    redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$CLIENTS" -P "$pipe" -n "$n" \
    --csv XADD bench '*' f "$DATA"
  # The CSV's first column repeats the command with its 512-byte value: print the rest.
  awk -F'","' -v n="$n" -v c="$rps" 'NR==2 {printf "redis XADD: n=%s (calibration %s/s): %s requests/s, latency ms avg %s p50 %s p95 %s p99 %s max %s\n", n, c, $2, $3, $5, $6, $7, $8}' \
    "$OUT/redis-xadd-p$pipe-r$2.csv" | tr -d '"' >&2
  redis-cli -p "$REDIS_PORT" unlink bench warm >/dev/null
}

# `cursorlog_replay ROUND`: Read of a REPLAY_EVENTS-event stream by one reader on a fresh server.
cursorlog_replay() {
  log "round $1: cursorlog replay, Read of a $REPLAY_EVENTS-event stream, 1 reader, ${DURATION} s"
  start_cursorlog "replay-r$1"
  bench --duration "$DURATION" --json "$OUT/cursorlog-replay-r$1.json" \
    replay --readers 1 --events "$REPLAY_EVENTS" --payload "$PAYLOAD" --read-batch 1000
  stop_cursorlog
}

# `cursorlog_stalled`: 400 follow calls (one connection each) that stop reading after their
# resolution, 40 MiB appended to the 4 streams they follow; the server's RssAnon before and
# after (issue 31 item 4: they may add at most 30 MiB).
cursorlog_stalled() {
  log "cursorlog: 400 stalled followers, 40 MiB appended"
  start_cursorlog stalled
  bench --json "$OUT/cursorlog-stalled.json" stalled --followers 400 --connections 400 \
    --streams 4 --append-mib 40 --payload "$PAYLOAD"
  stop_cursorlog
}

# `redis_replay ROUND`: XRANGE COUNT 1000 paging of the `replay` stream; CPU of both processes
# over redis-replay's measurement window (after its 1 s warm-up) in ...cpu.json.
redis_replay() {
  log "round $1: redis replay, XRANGE COUNT 1000 paging of $REPLAY_EVENTS entries, 1 client, ${DURATION} s"
  python3 "$SB_PY" --out "$OUT/redis-replay-r$1.cpu.json" --window 1 "$DURATION" \
    --pid "redis-server=$REDIS_PID" -- \
    "$BIN/redis-replay" --port "$REDIS_PORT" --key replay --count 1000 --warmup 1 \
    --duration "$DURATION" --expect "$REPLAY_EVENTS" --json "$OUT/redis-replay-r$1.json" >&2
}

# `disk_ceiling ROUND`: the raw disk, 1 and 64 x PAYLOAD B per fdatasync.
disk_ceiling() {
  log "round $1: disk ceiling (1 and 64 x ${PAYLOAD} B per fdatasync, ${DISK_SECS} s each)"
  "$BIN/disk-ceiling" --dir "$WORK" --writes-per-sync 1,64 --payload "$PAYLOAD" \
    --duration "$DISK_SECS" --json "$OUT/disk-r$1.json" >&2
}
