#!/usr/bin/env python3
"""Runs a command and records the CPU it and other processes used, for benches/scoreboard.sh.

    sb_cpu.py --out F.json [--stdout F] [--window WARMUP SECS] [--pid NAME=PID ...] -- CMD ...

Without --window: the command's own CPU (user + system, from its rusage once it has exited)
and each --pid process's CPU from just before it starts to just after it exits, over the
command's wall time. With --window: both sampled from /proc at WARMUP + 0.05 s and at WARMUP +
SECS - 0.05 s after the start (the command's measurement window, a little inside it so the
command is still alive at the second sample). Writes {"wall_secs", "cores": {"command": c,
NAME: c, ...}, "cpu_secs": {...}} (cores = CPU seconds / seconds sampled); exits with the
command's status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def cpu_secs(pid: int) -> float | None:
    """User + system CPU seconds of a live process, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stdout", default=None, help="the command's stdout goes here")
    parser.add_argument("--window", nargs=2, type=float, metavar=("WARMUP", "SECS"))
    parser.add_argument("--pid", action="append", default=[], help="NAME=PID of another process to sample")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command")
    others = {name: int(pid) for name, pid in (p.split("=", 1) for p in args.pid)}
    stdout = open(args.stdout, "wb") if args.stdout else None
    started = time.monotonic()
    before = {name: cpu_secs(pid) for name, pid in others.items()}
    proc = subprocess.Popen(cmd, stdout=stdout)
    cpu: dict[str, float | None] = {}
    if args.window:
        warmup, secs = args.window
        t0, t1 = warmup + 0.05, warmup + max(secs - 0.05, 0.1)
        time.sleep(max(0.0, started + t0 - time.monotonic()))
        a = {**{name: cpu_secs(pid) for name, pid in others.items()}, "command": cpu_secs(proc.pid)}
        at0 = time.monotonic()
        time.sleep(max(0.0, started + t1 - time.monotonic()))
        b = {**{name: cpu_secs(pid) for name, pid in others.items()}, "command": cpu_secs(proc.pid)}
        seconds = time.monotonic() - at0
        cpu = {k: (b[k] - a[k]) if a[k] is not None and b[k] is not None else None for k in a}
        rc = proc.wait()
        wall = time.monotonic() - started
    else:
        r0 = os.times()
        rc = proc.wait()
        r1 = os.times()
        wall = seconds = time.monotonic() - started
        after = {name: cpu_secs(pid) for name, pid in others.items()}
        cpu = {
            name: (after[name] - before[name]) if after[name] is not None and before[name] is not None else None
            for name in others
        }
        cpu["command"] = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    if stdout:
        stdout.close()
    doc = {
        "cmd": cmd[0],
        "wall_secs": wall,
        "seconds_sampled": seconds,
        "cpu_secs": cpu,
        "cores": {k: (v / seconds if v is not None and seconds > 0 else None) for k, v in cpu.items()},
        "exit": rc,
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)
    return rc


if __name__ == "__main__":
    sys.exit(main())
