#!/usr/bin/env bash
# Peer comparison in one run, back to back on the same disk:
#   - raw disk ceiling: one writer, 512 B appends, fdatasync per 1 and per 64 appends
#   - cursorlog (--sync always) durable appends over gRPC, 50 producers, batch 1, one unary
#     Append per event and then one AppendStream call per producer (still one event in flight
#     per producer), then Redis Streams XADD (appendonly yes, appendfsync always), 50 clients,
#     pipelining 1
#   - the same with cursorlog batch 16 and Redis pipelining 16
#   - replay of a 100k-event stream, single client: cursorlog Read vs Redis XRANGE COUNT 1000
# repeated ROUNDS times (a shared machine's disk and CPU drift within minutes; interleaving
# puts each pair under the same conditions), then prints every figure (median and range over
# the rounds) and the ratios cursorlog / Redis and cursorlog / disk ceiling.
#
# Usage: benches/compare.sh            (about 5 minutes with the defaults, after the build)
# Knobs (environment): ROUNDS=3, DURATION=8 (s per measurement), CLIENTS=50, PAYLOAD=512,
#   REPLAY_EVENTS=100000, DISK_SECS=3, OUT=<dir for the JSON/CSV results, default a temp dir>,
#   CURSORLOG_BENCH_DIR (where data goes; default target/bench-data, the repository's disk),
#   CARGO_TARGET_DIR (default target/), SKIP_BUILD=1, LABEL (a note on what was built, printed
#   with the commit: for a run outside a git checkout or with uncommitted changes).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
CLIENTS=${CLIENTS:-50}
PAYLOAD=${PAYLOAD:-512}
REPLAY_EVENTS=${REPLAY_EVENTS:-100000}
DISK_SECS=${DISK_SECS:-3}
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
BIN=$TARGET_DIR/release
DATA_ROOT=${CURSORLOG_BENCH_DIR:-$REPO/target/bench-data}

log() { printf '\n=== %s\n' "$*" >&2; }
die() { printf 'compare.sh: %s\n' "$*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 is needed for the summary"

# --- build ------------------------------------------------------------------------------
if [[ -z "${SKIP_BUILD:-}" ]]; then
  log "building release binaries (cursorlog, cursorlog-bench, disk-ceiling, redis-replay)"
  (cd "$REPO" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -q \
      -p cursorlog-server -p cursorlog-benches --bins)
fi
for b in cursorlog cursorlog-bench disk-ceiling redis-replay; do
  [[ -x $BIN/$b ]] || die "$BIN/$b missing (build failed or SKIP_BUILD with another target dir)"
done

# --- redis ------------------------------------------------------------------------------
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  log "installing redis-server and redis-tools from the OS packages"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
fi

mkdir -p "$DATA_ROOT"
WORK=$(mktemp -d "$DATA_ROOT/compare-XXXXXX")
OUT=${OUT:-$WORK/results}
mkdir -p "$OUT"
CL_PID=""
REDIS_PID=""

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
cleanup() {
  stop_cursorlog
  stop_redis
  if [[ $OUT == "$WORK"/* ]]; then
    # Keep the results, drop the data.
    KEEP=$(mktemp -d "${TMPDIR:-/tmp}/cursorlog-compare-XXXXXX")
    cp -r "$OUT"/. "$KEEP"/ 2>/dev/null || true
    printf 'results (JSON/CSV) kept in %s\n' "$KEEP" >&2
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  die "no free port found"
}

# Starts cursorlog serve on a fresh data dir; sets CL_PID and CL_ADDR.
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

bench() { "$BIN/cursorlog-bench" --quiet --addr "$CL_ADDR" --server-pid "$CL_PID" "$@"; }

fs=$(df -T "$WORK" | awk 'NR==2 {print $2" on "$1}')
log "data in $WORK ($fs); results in $OUT"
date -u '+%Y-%m-%d %H:%M:%S UTC' >"$OUT/date"
commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$({ git -C "$REPO" status --porcelain -- engine server proto 2>/dev/null || true; } | wc -l)
echo "commit $commit ($dirty changed files under engine/ server/ proto/)${LABEL:+; $LABEL}" >"$OUT/commit"
log "$(cat "$OUT/commit"); load average $(cut -d' ' -f1-3 /proc/loadavg)"

# --- redis server (one for all rounds) --------------------------------------------------
REDIS_PORT=$(free_port)
mkdir -p "$WORK/redis"
log "redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$REDIS_PORT, appendfsync always, dir $WORK/redis"
# auto-aof-rewrite off: no background AOF rewrite during the runs (in Redis's favour).
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

cursorlog_append() { # batch round [--streaming]
  local rpc=unary
  [[ ${3:-} == --streaming ]] && rpc=stream
  log "round $2: cursorlog durable appends ($rpc), $CLIENTS producers, batch $1, ${PAYLOAD} B, ${DURATION} s"
  start_cursorlog "append-$rpc-b$1-r$2"
  bench --duration "$DURATION" --json "$OUT/cursorlog-append-$rpc-b$1-r$2.json" \
    append --producers "$CLIENTS" --batch "$1" --payload "$PAYLOAD" ${3:-}
  stop_cursorlog
}

redis_xadd() { # pipelining round
  local pipe=$1 calib_n rps n
  log "round $2: redis XADD, $CLIENTS clients, pipelining $pipe, ${PAYLOAD} B, about ${DURATION} s"
  # A short run warms up and sizes the measured run (redis-benchmark counts requests).
  calib_n=$((pipe == 1 ? 10000 : 50000))
  rps=$(redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$CLIENTS" -P "$pipe" -n "$calib_n" \
          --csv XADD warm '*' f "$DATA" | awk -F'"' 'NR==2 {print $4}')
  n=$(python3 -c "print(max(10000, int(float('$rps') * $DURATION)))")
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$CLIENTS" -P "$pipe" -n "$n" \
    --csv XADD bench '*' f "$DATA" >"$OUT/redis-xadd-p$pipe-r$2.csv"
  # The CSV's first column repeats the command with its 512-byte value: print the rest.
  awk -F'","' -v n="$n" -v c="$rps" 'NR==2 {printf "redis XADD: n=%s (calibration %s/s): %s requests/s, latency ms avg %s p50 %s p95 %s p99 %s max %s\n", n, c, $2, $3, $5, $6, $7, $8}' \
    "$OUT/redis-xadd-p$pipe-r$2.csv" | tr -d '"'
  redis-cli -p "$REDIS_PORT" unlink bench warm >/dev/null
}

for round in $(seq "$ROUNDS"); do
  log "round $round: disk ceiling (1 and 64 x ${PAYLOAD} B per fdatasync, ${DISK_SECS} s each)"
  "$BIN/disk-ceiling" --dir "$WORK" --writes-per-sync 1,64 --payload "$PAYLOAD" \
    --duration "$DISK_SECS" --json "$OUT/disk-r$round.json"

  cursorlog_append 1 "$round"
  cursorlog_append 1 "$round" --streaming
  redis_xadd 1 "$round"
  cursorlog_append 16 "$round"
  redis_xadd 16 "$round"

  log "round $round: cursorlog replay, Read of a $REPLAY_EVENTS-event stream, 1 reader, ${DURATION} s"
  start_cursorlog "replay-r$round"
  bench --duration "$DURATION" --json "$OUT/cursorlog-replay-r$round.json" \
    replay --readers 1 --events "$REPLAY_EVENTS" --payload "$PAYLOAD" --read-batch 1000
  stop_cursorlog

  log "round $round: redis replay, XRANGE COUNT 1000 paging of $REPLAY_EVENTS entries, 1 client, ${DURATION} s"
  "$BIN/redis-replay" --port "$REDIS_PORT" --key replay --count 1000 --duration "$DURATION" \
    --expect "$REPLAY_EVENTS" --json "$OUT/redis-replay-r$round.json"
done
redis-cli -p "$REDIS_PORT" info persistence | tr -d '\r' | grep -E '^aof_(enabled|rewrites|last_write_status)' >&2 || true
stop_redis

# --- summary ------------------------------------------------------------------------------
python3 - "$OUT" "$CLIENTS" "$PAYLOAD" "$ROUNDS" <<'PY'
import csv, json, os, statistics, sys
out, clients, payload, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
R = range(1, rounds + 1)
def j(name):
    with open(os.path.join(out, name)) as f:
        return json.load(f)
def text(name):
    with open(os.path.join(out, name)) as f:
        return f.read().strip()
def redis_row(p, r):
    with open(os.path.join(out, f"redis-xadd-p{p}-r{r}.csv")) as f:
        return next(csv.DictReader(f))
med = statistics.median
rows = {}  # name -> list of (events/s, p50, p99, max, extra) per round
for r in R:
    for d in j(f"disk-r{r}.json")["results"]:
        rows.setdefault(f"disk ceiling, {d['writes_per_sync']} x {payload} B per fdatasync", []).append(
            (d["events_per_sec"], d["sync_group_p50_ms"], d["sync_group_p99_ms"], d["sync_group_max_ms"], ""))
    for b in (1, 16):
        for rpc, name in (("unary", f"cursorlog Append, batch {b}"), ("stream", f"cursorlog AppendStream, batch {b}")):
            try:
                c = j(f"cursorlog-append-{rpc}-b{b}-r{r}.json")
            except FileNotFoundError:
                continue
            l = c["latency"]["append"]; s = c.get("server") or {}
            rows.setdefault(name, []).append(
                (c["events_per_sec"], l["p50_ms"], l["p99_ms"], l["max_ms"],
                 f"ev/fsync {s.get('events_per_fsync') or 0:.0f}, srv cpu {c.get('server_cpu_cores') or 0:.2f}, "
                 f"cli cpu {c.get('client_cpu_cores') or 0:.2f}, err {c['errors']}"))
        x = redis_row(b, r)
        rows.setdefault(f"redis XADD, pipelining {b}", []).append(
            (float(x["rps"]), float(x["p50_latency_ms"]), float(x["p99_latency_ms"]), float(x["max_latency_ms"]), ""))
    c = j(f"cursorlog-replay-r{r}.json"); l = c["latency"]["replay"]
    rows.setdefault("cursorlog Read replay, 1 reader", []).append(
        (c["events_per_sec"], l["p50_ms"], l["p99_ms"], l["max_ms"], f"err {c['errors']}"))
    x = j(f"redis-replay-r{r}.json")
    rows.setdefault("redis XRANGE COUNT 1000 replay, 1 client", []).append(
        (x["events_per_sec"], x["replay_p50_ms"], x["replay_p99_ms"], x["replay_max_ms"], ""))
print(f"\nResults ({text('date')}, {text('commit')}; {clients} clients, {payload} B payloads, "
      f"{rounds} rounds; latency per request, per fdatasync group or per whole replay; "
      f"events/s median [min, max] over the rounds, latencies are medians)")
print(f"{'measurement':<44} {'events/s':>9} {'[min, max]':>19} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
for name, v in rows.items():
    eps = [x[0] for x in v]
    print(f"{name:<44} {med(eps):>9.0f} [{min(eps):>8.0f},{max(eps):>8.0f}] {med(x[1] for x in v):>8.2f} "
          f"{med(x[2] for x in v):>8.2f} {med(x[3] for x in v):>8.2f}  {'; '.join(x[4] for x in v if x[4])}")
m = {name: med(x[0] for x in v) for name, v in rows.items()}
per = {name: [x[0] for x in v] for name, v in rows.items()}
def ratio(label, a, b, target=None):
    rs = [x / y for x, y in zip(per[a], per[b])]
    # Both the ratio of the medians and the median of the per-round (paired) ratios: on a
    # noisy machine they can differ, and a target counts as met only when both meet it.
    both = min(m[a] / m[b], med(rs))
    t = "" if target is None else f"  target >= {target}: {'met' if both >= target else 'MISSED'}"
    print(f"  {label:<52} {m[a] / m[b]:>6.2f} {med(rs):>6.2f}  (per round {', '.join(f'{x:.2f}' for x in rs)}){t}")
print("\nRatios (of the medians, then the median of the per-round ratios; per round: same round's pair)")
ratio("cursorlog batch 1 / redis pipelining 1", "cursorlog Append, batch 1", "redis XADD, pipelining 1", 1.5)
ratio("cursorlog AppendStream batch 1 / redis pipelining 1", "cursorlog AppendStream, batch 1", "redis XADD, pipelining 1", 1.5)
ratio("cursorlog batch 16 / redis pipelining 16", "cursorlog Append, batch 16", "redis XADD, pipelining 16", 1.0)
ratio("cursorlog replay / redis XRANGE replay", "cursorlog Read replay, 1 reader", "redis XRANGE COUNT 1000 replay, 1 client", 1.0)
d1, d64 = f"disk ceiling, 1 x {payload} B per fdatasync", f"disk ceiling, 64 x {payload} B per fdatasync"
ratio("cursorlog batch 1 / disk ceiling 1 per fdatasync", "cursorlog Append, batch 1", d1)
ratio("cursorlog batch 1 / disk ceiling 64 per fdatasync", "cursorlog Append, batch 1", d64)
ratio("cursorlog batch 16 / disk ceiling 64 per fdatasync", "cursorlog Append, batch 16", d64)
ratio("redis pipelining 1 / disk ceiling 64 per fdatasync", "redis XADD, pipelining 1", d64)
ratio("redis pipelining 16 / disk ceiling 64 per fdatasync", "redis XADD, pipelining 16", d64)
PY
