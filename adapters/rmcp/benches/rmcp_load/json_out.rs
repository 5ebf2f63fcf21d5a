//! `--json`: every round's figures, with the store servers' CPU during it, for
//! `benches/scoreboard.sh`.

use std::path::Path;

use crate::{Args, RoundResult};

/// Writes, per side, each round's events, seconds, p50/p99 and CPU seconds of this process
/// (front-ends and clients), of the cursorlog server and of redis-server during the round.
pub(crate) fn write(
    path: &Path,
    args: &Args,
    names: &[&str],
    results: &[Vec<RoundResult>],
    store_cpu: &[Vec<(f64, f64)>],
) {
    let sides: Vec<serde_json::Value> = names
        .iter()
        .zip(results)
        .zip(store_cpu)
        .map(|((name, rs), cpu)| {
            let rounds: Vec<serde_json::Value> = rs
                .iter()
                .zip(cpu)
                .map(|(r, (c, rd))| {
                    serde_json::json!({
                        "events": r.events,
                        "seconds": r.seconds,
                        "events_per_sec": r.events as f64 / r.seconds,
                        "p50_ms": r.hist.value_at_quantile(0.5) as f64 / 1e3,
                        "p99_ms": r.hist.value_at_quantile(0.99) as f64 / 1e3,
                        "process_cpu_secs": r.cpu,
                        "cursorlog_server_cpu_secs": c,
                        "redis_server_cpu_secs": rd,
                    })
                })
                .collect();
            serde_json::json!({ "side": name, "rounds": rounds })
        })
        .collect();
    let v = serde_json::json!({
        "calls": args.calls,
        "events_per_call": args.events + 1,
        "sides": sides,
    });
    std::fs::write(path, serde_json::to_string_pretty(&v).expect("json")).expect("write --json");
}
