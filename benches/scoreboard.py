#!/usr/bin/env python3
"""The table of benches/scoreboard.sh (and compare.sh): reads the JSON/CSV that its tools
wrote into one results directory and prints one Markdown table, also written to
<dir>/scoreboard.md.

    python3 benches/scoreboard.py RESULTS_DIR

One row per measurement: the cursorlog figure and the peer's (medians over the rounds), the
ratio of the medians with the range of the per-round ratios (each round's pair ran back to back),
issue 31's target, whether it is met (only when both the ratio of the medians and the median of
the per-round ratios meet it), and the CPU µs per event (per task for tasks) of every process
on each side, medians over the rounds. Parts whose files are missing are left out; a part that
failed is named under the table.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

med = statistics.median


@dataclass
class Row:
    name: str
    cl: list[float]
    peer: list[float]
    unit: str = "ev/s"
    target: tuple[str, float] | None = None  # (">=" or "<=", value)
    cl_cpu: str = ""
    peer_cpu: str = ""
    notes: list[str] = field(default_factory=list)

    def ratios(self) -> tuple[float, list[float]]:
        paired = [a / b for a, b in zip(self.cl, self.peer) if b]
        return med(self.cl) / med(self.peer), paired

    def verdict(self) -> str:
        if self.target is None:
            return "–"
        of_medians, paired = self.ratios()
        op, t = self.target
        values = [of_medians] + ([med(paired)] if paired else [])
        ok = min(values) >= t if op == ">=" else max(values) <= t
        return "met" if ok else "**not met**"


def fmt(x: float, unit: str) -> str:
    if unit == "ev/s":
        return f"{x / 1000:.1f} k" if x >= 10_000 else f"{x:.0f}"
    if unit == "tasks/s":
        return f"{x:.1f}" if x < 100 else f"{x:.0f}"
    if unit in ("µs/ev", "µs/call", "ms", "MiB"):
        return f"{x:.2f}" if x < 10 else f"{x:.1f}"
    return f"{x:.3g}"


def cpu_cell(parts: list[tuple[str, list[float]]]) -> str:
    """'server 48 · gen 12' from each process's per-round µs figures (medians)."""
    cells = []
    for name, values in parts:
        values = [v for v in values if v is not None and v == v]
        if values:
            m = med(values)
            cells.append(f"{name} {m:.0f}" if m >= 10 else f"{name} {m:.1f}")
    return " · ".join(cells) or "–"


def load(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def per_ev(cores: float | None, eps: float) -> float | None:
    return None if cores is None or not eps else cores / eps * 1e6


def rounds_of(out: str, pattern: str) -> list[int]:
    found = []
    for p in glob.glob(os.path.join(out, pattern.replace("{r}", "*"))):
        m = re.search(r"-r(\d+)\.", os.path.basename(p))
        if m:
            found.append(int(m.group(1)))
    return sorted(found)


def single_rows(out: str) -> list[Row]:
    rows: list[Row] = []
    rounds = rounds_of(out, "cursorlog-append-stream-b1-r{r}.json")
    if not rounds:
        return rows

    def redis_xadd(p: int, r: int) -> tuple[float, dict[str, float]]:
        with open(os.path.join(out, f"redis-xadd-p{p}-r{r}.csv")) as f:
            rps = float(next(csv.DictReader(f))["rps"])
        cores = load(os.path.join(out, f"redis-xadd-p{p}-r{r}.cpu.json"))["cores"]
        return rps, {"redis": per_ev(cores.get("redis-server"), rps), "bench": per_ev(cores.get("command"), rps)}

    def cursorlog(name: str) -> tuple[float, dict[str, float | None]]:
        c = load(os.path.join(out, name))
        eps = c["events_per_sec"]
        if c.get("errors"):
            raise SystemExit(f"{name}: {c['errors']} errors")
        return eps, {"server": per_ev(c.get("server_cpu_cores"), eps), "gen": per_ev(c.get("client_cpu_cores"), eps)}

    def row(name: str, cl_files: list[str], peer: list[tuple[float, dict[str, Any]]], target: tuple[str, float] | None,
            peer_names: tuple[str, str] = ("redis", "bench")) -> Row:
        cl = [cursorlog(f) for f in cl_files]
        return Row(
            name,
            [x[0] for x in cl],
            [x[0] for x in peer],
            target=target,
            cl_cpu=cpu_cell([(k, [x[1][k] for x in cl]) for k in ("server", "gen")]),
            peer_cpu=cpu_cell([(k, [x[1][k] for x in peer]) for k in peer_names]),
        )

    clients = load(os.path.join(out, f"cursorlog-append-stream-b1-r{rounds[0]}.json"))["params"].get("producers", "")
    for b, t in ((1, 1.1), (16, 1.3)):
        rows.append(row(f"AppendStream batch {b}, {clients} producers, vs XADD pipelining {b}",
                        [f"cursorlog-append-stream-b{b}-r{r}.json" for r in rounds],
                        [redis_xadd(b, r) for r in rounds], (">=", t)))
    for b in (1, 16):  # compare.sh's extras
        files = [f"cursorlog-append-unary-b{b}-r{r}.json" for r in rounds]
        if all(os.path.exists(os.path.join(out, f)) for f in files):
            rows.append(row(f"unary Append batch {b} vs XADD pipelining {b}", files,
                            [redis_xadd(b, r) for r in rounds], None))
    if all(os.path.exists(os.path.join(out, f"cursorlog-replay-r{r}.json")) for r in rounds):
        peer = []
        for r in rounds:
            x = load(os.path.join(out, f"redis-replay-r{r}.json"))
            cores = load(os.path.join(out, f"redis-replay-r{r}.cpu.json"))["cores"]
            eps = x["events_per_sec"]
            peer.append((eps, {"redis": per_ev(cores.get("redis-server"), eps), "reader": per_ev(cores.get("command"), eps)}))
        rows.append(row("replay, 1 reader, Read vs XRANGE COUNT 1000", [f"cursorlog-replay-r{r}.json" for r in rounds],
                        peer, (">=", 1.5), peer_names=("redis", "reader")))
    stalled = os.path.join(out, "cursorlog-stalled.json")
    if os.path.exists(stalled):
        x = load(stalled)
        # The peer column is the budget: issue 31 item 4 allows 30 MiB for 400 followers.
        budget = 30.0 * x["followers"] / 400
        rows.append(Row(f"{x['followers']} followers that stopped reading, {x['append_mib']} MiB appended: "
                        f"server memory added (RssAnon), vs the budget", [x["added_mib"]], [budget],
                        unit="MiB", target=("<=", 1.0),
                        cl_cpu=f"{x['per_follower_kib']:.0f} KiB per follower", peer_cpu="–"))
    disks = [os.path.join(out, f"disk-r{r}.json") for r in rounds]
    if all(os.path.exists(d) for d in disks):
        ceiling = {}
        for d in disks:
            for x in load(d)["results"]:
                ceiling.setdefault(x["writes_per_sync"], []).append(x["events_per_sec"])
        stream1 = rows[0]
        for n, v in sorted(ceiling.items()):
            rows.append(Row(f"AppendStream batch 1 vs the raw disk, {n} write(s) per fdatasync", stream1.cl, v,
                            cl_cpu=stream1.cl_cpu, peer_cpu="–"))
    return rows


def replicated_rows(out: str) -> list[Row]:
    path = os.path.join(out, "replicated.json")
    if not os.path.exists(path):
        return []
    doc = load(path)
    rows: list[Row] = []
    for b in doc["batches"]:
        single, repl = b["single"], b["replicated"]

        def each(ms: list[dict[str, Any]], i: int) -> list[float | None]:
            return [per_ev((m["server_cpu_cores_each"] + [None] * 3)[i], m["events_per_sec"]) for m in ms]

        gen = lambda ms: [per_ev(m["client_cpu_cores"], m["events_per_sec"]) for m in ms]  # noqa: E731
        s_srv, r_lead = each(single, 0), each(repl, 0)
        followers = [[f for f in (a, c) if f is not None] for a, c in zip(each(repl, 1), each(repl, 2))]
        worst = [max(f) if f else None for f in followers]
        rows.append(Row(
            f"replicated (3 members) vs single node, AppendStream batch {b['batch']}, {doc['producers']} producers",
            [m["events_per_sec"] for m in repl], [m["events_per_sec"] for m in single], target=(">=", 0.5),
            cl_cpu=cpu_cell([("leader", r_lead), ("follower", each(repl, 1)), ("follower", each(repl, 2)), ("gen", gen(repl))]),
            peer_cpu=cpu_cell([("server", s_srv), ("gen", gen(single))]),
        ))
        if all(x is not None for x in r_lead + s_srv):
            rows.append(Row(f"leader CPU per event vs the single node's, batch {b['batch']}", r_lead, s_srv,  # type: ignore[arg-type]
                            unit="µs/ev", target=("<=", 1.5)))
        if all(x is not None for x in worst + s_srv):
            rows.append(Row(f"costlier follower's CPU per event vs the single node's, batch {b['batch']}", worst, s_srv,  # type: ignore[arg-type]
                            unit="µs/ev", target=("<=", 1.0)))
    return rows


def tasks_rows(out: str) -> list[Row]:
    path = os.path.join(out, "tasks.json")
    if not os.path.exists(path):
        return []
    doc = load(path)
    calls = doc.get("callsPerTask", 13)
    by = {(r["side"], r["inFlight"]): r["rounds"] for r in doc["rows"]}
    rows: list[Row] = []
    levels = sorted({k[1] for k in by})
    us = lambda rs, k: [r[k] * 1000 for r in rs]  # noqa: E731  (ms per task -> µs per task)
    for level in levels:
        cl = by.get(("cursorlog", level))
        for peer_side, label, target in (("redis-always", "appendfsync always", (">=", 1.0)),
                                         ("redis-everysec", "appendfsync everysec", None)):
            peer = by.get((peer_side, level))
            if cl is None or peer is None:
                continue
            rows.append(Row(
                f"tasks, {level} in flight, vs Redis TaskStore ({label})",
                [r["tasksPerSec"] for r in cl], [r["tasksPerSec"] for r in peer], unit="tasks/s", target=target,
                cl_cpu=cpu_cell([("server", us(cl, "serverCpuMsPerTask")), ("node", us(cl, "benchCpuMsPerTask"))]),
                peer_cpu=cpu_cell([("redis", us(peer, "serverCpuMsPerTask")), ("node", us(peer, "benchCpuMsPerTask"))]),
            ))
        peer = by.get(("redis-always", level))
        if cl is not None and peer is not None:
            per_call = lambda rs: [r["benchCpuMsPerTask"] * 1000 / calls for r in rs]  # noqa: E731
            rows.append(Row(f"tasks, {level} in flight: Node CPU per call, TypeScript adapter vs ioredis",
                            per_call(cl), per_call(peer), unit="µs/call", target=("<=", 2.0)))
    gets = doc.get("gets") or {}
    if gets.get("cursorlog") and gets.get("redis"):
        for q in ("p50", "p99"):
            rows.append(Row(f"tasks/get through another replica, {q} (cursorlog GetTask vs Redis GET)",
                            [gets["cursorlog"][q]], [gets["redis"][q]], unit="ms", target=("<=", 1.0)))
    return rows


def sdk_rows(out: str) -> list[Row]:
    rows: list[Row] = []
    path = os.path.join(out, "sdk-python.json")
    if os.path.exists(path):
        doc = load(path)
        s, a = doc["summary"], doc["args"]
        c, r = s["cursorlog"], s["redis"]
        cpu = lambda x, names: " · ".join(f"{n} {x[k]:.0f}" for n, k in names)  # noqa: E731
        names = (("front-end", "frontend_cpu_us_per_event"), ("store", "store_cpu_us_per_event"),
                 ("driver", "driver_cpu_us_per_event"))
        rows.append(Row(
            f"MCP front-end, Python mcp ({a['loop']}), {a['calls']} calls x {a['events'] + 1} events, vs Redis EventStore",
            c.get("events_per_s_each_round", [c["events_per_s"]]), r.get("events_per_s_each_round", [r["events_per_s"]]),
            cl_cpu=cpu(c, [n for n in names if n[1] in c]), peer_cpu=cpu(r, [n for n in names if n[1] in r]),
        ))
    path = os.path.join(out, "sdk-typescript.json")
    if os.path.exists(path):
        doc = load(path)
        c, r = doc["sides"]["cursorlog"], doc["sides"]["redis"]
        cpu = lambda rs: cpu_cell([(n, [x[k] for x in rs]) for n, k in  # noqa: E731
                                   (("front-end", "replicaCpuMsPer1000"), ("store", "storeCpuMsPer1000"), ("driver", "benchCpuMsPer1000"))])
        rows.append(Row(
            f"MCP front-end, TypeScript SDK, {doc['calls']} calls x {doc['steps'] + 1} events, vs Redis EventStore",
            [x["eventsPerSec"] for x in c], [x["eventsPerSec"] for x in r], cl_cpu=cpu(c), peer_cpu=cpu(r),
        ))
    path = os.path.join(out, "sdk-rmcp.json")
    if os.path.exists(path):
        doc = load(path)
        sides = {s["side"]: s["rounds"] for s in doc["sides"]}
        c, r = sides["cursorlog"], sides["redis"]

        def cpu(rs: list[dict[str, Any]], store_key: str, store: str) -> str:
            return cpu_cell([("front-end+clients", [x["process_cpu_secs"] / x["events"] * 1e6 for x in rs]),
                             (store, [x[store_key] / x["events"] * 1e6 for x in rs])])

        rows.append(Row(
            f"MCP front-end, rmcp, {doc['calls']} calls x {doc['events_per_call']} events, vs Redis EventStore",
            [x["events_per_sec"] for x in c], [x["events_per_sec"] for x in r],
            cl_cpu=cpu(c, "cursorlog_server_cpu_secs", "server"), peer_cpu=cpu(r, "redis_server_cpu_secs", "redis"),
        ))
    return rows


def text(out: str, name: str) -> str:
    try:
        with open(os.path.join(out, name)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return "?"


def main() -> int:
    out = sys.argv[1]
    rows: list[Row] = []
    problems: list[str] = []
    builders: list[tuple[str, Callable[[str], list[Row]]]] = [
        ("single", single_rows), ("replicated", replicated_rows), ("tasks", tasks_rows), ("sdk", sdk_rows)]
    for part, build in builders:
        try:
            rows += build(out)
        except (OSError, KeyError, ValueError, IndexError, StopIteration, statistics.StatisticsError) as e:
            problems.append(f"part {part}: its results could not be read ({type(e).__name__}: {e})")
        failed = os.path.join(out, f"failed-{part}")
        if os.path.exists(failed):
            problems.append(f"part {part} FAILED ({text(out, f'failed-{part}')}): its rows are missing or partial")
    lines = [
        f"Scoreboard {text(out, 'date')}, {text(out, 'commit')}; {text(out, 'knobs')}; "
        f"load average before {text(out, 'load-before')}, after {text(out, 'load-after')}.",
        "",
        "| measurement | cursorlog | peer | ratio [per-round range] | target | | CPU µs/ev (per task for tasks), cursorlog side | CPU µs/ev, peer side |",
        "|---|---:|---:|---:|---:|---|---|---|",
    ]
    for row in rows:
        of_medians, paired = row.ratios()
        spread = f" [{min(paired):.2f}–{max(paired):.2f}]" if len(paired) > 1 else ""
        target = "–" if row.target is None else f"{'≥' if row.target[0] == '>=' else '≤'} {row.target[1]:g}×"
        lines.append(
            f"| {row.name} | {fmt(med(row.cl), row.unit)} | {fmt(med(row.peer), row.unit)} {row.unit} | "
            f"{of_medians:.2f}×{spread} | {target} | {row.verdict()} | {row.cl_cpu or '–'} | {row.peer_cpu or '–'} |"
        )
    lines += [""] + [f"- {p}" for p in problems]
    table = "\n".join(lines).rstrip() + "\n"
    print(table, end="")
    with open(os.path.join(out, "scoreboard.md"), "w") as f:
        f.write(table)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
