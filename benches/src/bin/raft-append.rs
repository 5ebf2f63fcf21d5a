//! `raft-append`: what replication costs at the storage and consensus layer (issue 19 item
//! 8), measured in one run, configurations interleaved:
//!
//! - `raft3`: 3 openraft nodes in this process, each over its own `EntryLog` directory,
//!   talking over the real gRPC transport on loopback; N clients call `client_write` on the
//!   leader with a 512-byte proposal, one in flight each;
//! - `raft1`: the same code with one voter (consensus and storage, no replication);
//! - `single`: the same `EntryLog`, no Raft: one writer thread group-commits whatever is
//!   queued in one append (one `fdatasync`), like the engine's writer.
//!
//! The state machine is a stand-in that only counts entries (no engine apply exists yet).
//!
//! ```sh
//! DURATION=5 ROUNDS=3 N=1,16,50 raft-append            # throughput, latency, ratios
//! raft-append --failover 10                             # leader kills, two timings
//! ```
//!
//! Data goes under `$CURSORLOG_BENCH_DIR` or `target/bench-data` (a warning if on tmpfs).

#[path = "../raft/cluster.rs"]
mod cluster;
#[path = "../raft/load.rs"]
mod load;
#[path = "../raft/run.rs"]
mod run;
#[path = "../raft/store.rs"]
mod store;

// The modules above refer to each other as `super::x`: this file is their crate root.
use std::collections::BTreeMap;
use std::time::Duration;

use clap::Parser;
use cursorlog_replication::ClusterTiming;
use run::{failover, loadavg, run_raft, run_single, RunResult};

/// Replication's cost at the storage and consensus layer.
#[derive(Debug, Parser)]
#[command(
    about = "What replication costs at the storage and consensus layer: 3-voter vs 1-voter openraft on the segment log vs a single EntryLog group commit, interleaved; or leader failover times (--failover)"
)]
struct Cli {
    /// Seconds per measurement.
    #[arg(long, env = "DURATION", default_value_t = 5.0)]
    duration: f64,
    /// Rounds; each runs every configuration once, interleaved.
    #[arg(long, env = "ROUNDS", default_value_t = 3)]
    rounds: usize,
    /// Client counts (each client keeps one write in flight).
    #[arg(long, env = "N", value_delimiter = ',', default_value = "1,16,50")]
    clients: Vec<usize>,
    /// Configurations, in the order each round runs them.
    #[arg(
        long,
        env = "CONFIGS",
        value_delimiter = ',',
        default_value = "raft3,raft1,single"
    )]
    configs: Vec<String>,
    /// Leave Nagle's algorithm on for the nodes' accepted connections (the server crate turns
    /// it off), to measure what it costs.
    #[arg(long)]
    server_nagle: bool,
    /// Instead: kill the leader this many times under 16 writing clients, with the default
    /// timing and with the fast one.
    #[arg(long)]
    failover: Option<usize>,
    /// Diagnostic: do not pass openraft's `save_committed` to the segment log (it replaces the
    /// `COMMITTED` file on every commit), to measure what that costs.
    #[arg(long)]
    skip_save_committed: bool,
    /// Run the throughput configurations with the fast timing (default: `ClusterTiming`'s).
    #[arg(long)]
    fast: bool,
    /// The fast timing's heartbeat, ms.
    #[arg(long, default_value_t = 50)]
    fast_heartbeat: u64,
    /// The fast timing's election timeout range, ms (`min,max`).
    #[arg(long, value_delimiter = ',', default_value = "300,600")]
    fast_election: Vec<u64>,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    cluster::SERVER_NODELAY.store(!cli.server_nagle, std::sync::atomic::Ordering::Relaxed);
    store::SKIP_SAVE_COMMITTED.store(
        cli.skip_save_committed,
        std::sync::atomic::Ordering::Relaxed,
    );
    let root = cursorlog_benches::bench_root();
    println!(
        "raft-append: data under {} ({}), {} cores, server TCP_NODELAY {}, load {:.2}",
        root.display(),
        cursorlog_benches::fs_type(&root).unwrap_or_else(|| "?".into()),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        !cli.server_nagle,
        loadavg()
    );
    let fast = match cli.fast_election[..] {
        [min, max] => ClusterTiming {
            heartbeat: Duration::from_millis(cli.fast_heartbeat),
            election_min: Duration::from_millis(min),
            election_max: Duration::from_millis(max),
            ..ClusterTiming::default()
        },
        _ => return Err("--fast-election takes min,max".into()),
    };
    if let Some(kills) = cli.failover {
        for (name, timing) in [("default", ClusterTiming::default()), ("fast", fast)] {
            let load0 = loadavg();
            let f = failover(&root, kills, 16, timing.clone()).await?;
            let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
            let mut times: Vec<f64> = f.times.iter().map(ms).collect();
            let mut catch: Vec<f64> = f.catch_up.iter().map(ms).collect();
            println!(
                "failover {name} (heartbeat {:?}, election {:?}–{:?}), {kills} kills, load \
                 {load0:.2}→{:.2}:\n  kill → first ack on the new leader, ms: {}\n  restart → \
                 caught up, ms: {}\n  extra terms at failover {}, spurious elections between \
                 kills {}, failed and retried writes {}, acked {}\n  each kill, ms: {:?}",
                timing.heartbeat,
                timing.election_min,
                timing.election_max,
                loadavg(),
                dist(&mut times),
                dist(&mut catch),
                f.extra_terms,
                f.spurious,
                f.errors,
                f.acked,
                f.times
                    .iter()
                    .map(|d| ms(d).round() as u64)
                    .collect::<Vec<_>>(),
            );
        }
        return Ok(());
    }

    let duration = Duration::from_secs_f64(cli.duration);
    let timing = if cli.fast {
        fast
    } else {
        ClusterTiming::default()
    };
    println!(
        "raft timing: {timing:?}{}",
        if cli.skip_save_committed {
            ", save_committed SKIPPED (diagnostic)"
        } else {
            ""
        }
    );
    // (clients, config) → one result per round.
    let mut results: BTreeMap<(usize, String), Vec<RunResult>> = BTreeMap::new();
    for round in 1..=cli.rounds {
        for &n in &cli.clients {
            for config in &cli.configs {
                let r = match config.as_str() {
                    "raft3" => run_raft(&root, 3, n, duration, &timing).await?,
                    "raft1" => run_raft(&root, 1, n, duration, &timing).await?,
                    "single" => run_single(&root, n, duration).await?,
                    other => return Err(format!("unknown config {other}").into()),
                };
                println!(
                    "round {round} N={n:<3} {config:<6} {:>8.0} entries/s  p50 {:>7.2} ms  \
                     p99 {:>7.2} ms  entries/fdatasync leader {:.2}{}  retried {}  \
                     elections {}  load {:.2}→{:.2}",
                    r.rate,
                    r.p50_ms,
                    r.p99_ms,
                    r.leader_epf,
                    r.follower_epf
                        .map_or(String::new(), |f| format!(" followers {f:.2}")),
                    r.errors,
                    r.elections,
                    r.load.0,
                    r.load.1
                );
                results.entry((n, config.clone())).or_default().push(r);
            }
        }
    }
    summary(&cli.clients, &cli.configs, &results);
    Ok(())
}

/// `median [min–max]` of `v` (sorted in place).
fn med_range(v: &mut [f64], digits: usize) -> String {
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!("{:.digits$} [{lo:.digits$}–{hi:.digits$}]", median(v)),
        _ => "–".into(),
    }
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `min / p50 / p99 / max` (nearest rank) of `v`, sorted in place.
fn dist(v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1)) - 1;
        v.get(i).copied().unwrap_or(f64::NAN)
    };
    format!(
        "min {:.0} / p50 {:.0} / p99 {:.0} / max {:.0}",
        at(0.0),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

/// The medians table and the per-round ratios, as markdown.
fn summary(
    clients: &[usize],
    configs: &[String],
    results: &BTreeMap<(usize, String), Vec<RunResult>>,
) {
    println!("\n| N | config | entries/s | p50 ms | p99 ms | entries/fdatasync leader (followers) | retried | elections |");
    println!("|---|---|---|---|---|---|---|---|");
    for &n in clients {
        for config in configs {
            let Some(rs) = results.get(&(n, config.clone())) else {
                continue;
            };
            let col = |f: fn(&RunResult) -> f64| rs.iter().map(f).collect::<Vec<_>>();
            let mut fol: Vec<f64> = rs.iter().filter_map(|r| r.follower_epf).collect();
            println!(
                "| {n} | {config} | {} | {} | {} | {}{} | {} | {} |",
                med_range(&mut col(|r| r.rate), 0),
                med_range(&mut col(|r| r.p50_ms), 2),
                med_range(&mut col(|r| r.p99_ms), 2),
                med_range(&mut col(|r| r.leader_epf), 2),
                if fol.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", med_range(&mut fol, 2))
                },
                rs.iter().map(|r| r.errors).sum::<u64>(),
                rs.iter().map(|r| r.elections).sum::<u64>(),
            );
        }
    }
    println!("\nThroughput ratios per round (entries/s), then the median:\n");
    println!("| N | raft3/single | raft3/raft1 |");
    println!("|---|---|---|");
    for &n in clients {
        let rates = |c: &str| {
            results
                .get(&(n, c.to_owned()))
                .map(|rs| rs.iter().map(|r| r.rate).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let ratio = |a: Vec<f64>, b: Vec<f64>| {
            let mut r: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x / y).collect();
            let each: Vec<String> = r.iter().map(|x| format!("{x:.2}")).collect();
            r.sort_by(f64::total_cmp);
            if r.is_empty() {
                "–".to_owned()
            } else {
                format!("{} → **{:.2}**", each.join(", "), median(&r))
            }
        };
        println!(
            "| {n} | {} | {} |",
            ratio(rates("raft3"), rates("single")),
            ratio(rates("raft3"), rates("raft1"))
        );
    }
}
