#!/usr/bin/env bash
# flake-hunt: runs already-built test binaries many times, several copies at once, beside
# CPU hogs, and reports every failure with its output. A test that passes alone but fails
# here depends on timing (a sleep used as synchronisation, a race with a background thread,
# a clock-based decision): fix the cause, then run this again.
#
# Usage: scripts/flake-hunt.sh [options] [BINARY...] [-- TEST-ARGS...]
#
#   -n RUNS      runs of each binary (default 20)
#   -j COPIES    runs at once (default 4)
#   -H HOGS      busy-looping CPU hogs beside them (default 2; 0 for none)
#   -p PACKAGE   test binaries of this cargo package (repeatable; default cursorlog-engine)
#   -w           test binaries of the whole workspace (needs `cargo build -p cursorlog-server`
#                too: the end-to-end tests run the server binary)
#   -t SECONDS   a run that takes longer is killed and counted as failed (default 900)
#   -o DIR       where failing runs' output is kept (default target/flake-hunt/<time>)
#   BINARY...    explicit test binaries instead of asking cargo (run from the current dir)
#   -- ARGS      passed to every binary (a test name filter, --test-threads=1, ...)
#
# Binaries are found with `cargo test --no-run --message-format=json` (which builds only
# what is stale: build first, so the hunt measures tests, not the compiler). Each run gets
# its own temporary directory as TMPDIR (tempfile puts test data there) and runs in its
# package's directory, as `cargo test` does. Output of passing runs is deleted; each failing
# run's full output is kept in the results directory and its failure section printed.
# The last line is the summary, "flake-hunt: N runs, F failed"; the exit status is 0 only
# when nothing failed.
#
# Example: reproduce a flake of one test with four copies under load:
#   scripts/flake-hunt.sh -n 40 -j 4 target/debug/deps/faults-<hash> -- a_full_disk

set -euo pipefail

runs=20
copies=4
hogs=2
timeout_s=900
results=""
packages=()
workspace=0
binaries=()
test_args=()

usage() {
    sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}

while (($#)); do
    case "$1" in
    -n) runs="$2"; shift 2 ;;
    -j) copies="$2"; shift 2 ;;
    -H) hogs="$2"; shift 2 ;;
    -p) packages+=("$2"); shift 2 ;;
    -w) workspace=1; shift ;;
    -t) timeout_s="$2"; shift 2 ;;
    -o) results="$2"; shift 2 ;;
    -h | --help) usage ;;
    --) shift; test_args=("$@"); break ;;
    -*) echo "flake-hunt: unknown option $1" >&2; usage ;;
    *) binaries+=("$1"); shift ;;
    esac
done
for v in "$runs" "$copies" "$hogs" "$timeout_s"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { echo "flake-hunt: not a number: $v" >&2; exit 2; }
done
((copies >= 1 && runs >= 1)) || { echo "flake-hunt: -n and -j must be at least 1" >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
results="${results:-$root/target/flake-hunt/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$results"
results="$(cd "$results" && pwd)"

# Each binary with the directory it runs in: "dir<TAB>path" lines.
targets="$results/targets.tsv"
: >"$targets"
if ((${#binaries[@]})); then
    for b in "${binaries[@]}"; do
        [[ -x "$b" ]] || { echo "flake-hunt: not an executable: $b" >&2; exit 2; }
        printf '%s\t%s\n' "$PWD" "$(cd "$(dirname "$b")" && pwd)/$(basename "$b")" >>"$targets"
    done
else
    select=()
    if ((workspace)); then
        select=(--workspace)
    else
        ((${#packages[@]})) || packages=(cursorlog-engine)
        for p in "${packages[@]}"; do select+=(-p "$p"); done
    fi
    echo "flake-hunt: finding test binaries: cargo test ${select[*]} --no-run" >&2
    (cd "$root" && cargo test "${select[@]}" --no-run --message-format=json 2>"$results/cargo.log") |
        if command -v jq >/dev/null; then
            jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null)
                   | "\(.manifest_path | sub("/[^/]*$"; ""))\t\(.executable)"'
        else
            python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m.get("executable"):
        print(os.path.dirname(m["manifest_path"]) + "\t" + m["executable"])'
        fi >>"$targets" || { cat "$results/cargo.log" >&2; exit 2; }
fi
n_targets=$(wc -l <"$targets")
((n_targets)) || { echo "flake-hunt: no test binaries found" >&2; exit 2; }

# The hogs: one busy loop each, killed (only they, by pid) when the script ends.
hog_pids=()
running_pids=()
cleanup() {
    for pid in "${hog_pids[@]}" "${running_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for ((h = 0; h < hogs; h++)); do
    (while :; do :; done) &
    hog_pids+=($!)
done

# One run: its own TMPDIR, output to a log; the log is kept only when the run failed.
# Prints "<rc> <log>" to the status file.
run_one() {
    set +e
    local dir="$1" bin="$2" run="$3"
    local name tmp log rc m
    name="$(basename "$bin")"
    log="$results/$name.run$run.log"
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/flake-hunt.XXXXXX")"
    (cd "$dir" && TMPDIR="$tmp" timeout -k 10 "$timeout_s" "$bin" "${test_args[@]}") >"$log" 2>&1
    rc=$?
    if ((rc == 124)); then
        echo "flake-hunt: killed after ${timeout_s} s (timeout)" >>"$log"
    elif ((rc != 0)); then
        echo "flake-hunt: exit status $rc" >>"$log"
    fi
    # A file system a test mounted in its temporary directory and left behind is a failure
    # too (its cleanup did not work); unmount it so the hunt can go on.
    for m in $(awk -v t="$tmp/" 'index($2, t) == 1 { print $2 }' /proc/self/mounts 2>/dev/null | sort -r); do
        echo "flake-hunt: the run left $m mounted" >>"$log"
        umount "$m" >>"$log" 2>&1 || umount -l "$m" >>"$log" 2>&1
        ((rc == 0)) && rc=200
    done
    rm -rf "$tmp" 2>>"$log"
    ((rc == 0)) && rm -f "$log"
    echo "$rc $log" >>"$results/status"
}

: >"$results/status"
echo "flake-hunt: $n_targets binaries x $runs runs, $copies at once, $hogs CPU hogs; results in $results" >&2
started=$SECONDS
for ((run = 1; run <= runs; run++)); do
    while IFS=$'\t' read -r dir bin; do
        while (($(jobs -rp | wc -l) >= copies + hogs)); do
            wait -n || true
        done
        run_one "$dir" "$bin" "$run" &
        running_pids+=($!)
    done <"$targets"
done
for pid in "${running_pids[@]}"; do
    # Runs that `wait -n` already reaped are no children any more: nothing to say about them.
    wait "$pid" 2>/dev/null || true
done
running_pids=()

total=$(wc -l <"$results/status")
failed=0
while read -r rc log; do
    ((rc == 0)) && continue
    failed=$((failed + 1))
    echo
    echo "=== FAILED: $(basename "$log" .log) (exit $rc), full output: $log"
    # The test harness's failure section (panics and the failing names), else the tail.
    if grep -q '^failures:$' "$log"; then
        sed -n '/^failures:$/,$p' "$log" | head -n 80
    else
        tail -n 40 "$log"
    fi
done <"$results/status"
echo
echo "flake-hunt: $total runs, $failed failed ($((SECONDS - started)) s; $n_targets binaries x $runs, -j $copies, $hogs hogs)"
((failed == 0))
