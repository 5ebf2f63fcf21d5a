//! `cursorlog-bench replicated`: what replication costs end to end, over real gRPC against
//! real `cursorlog` processes, in one run (issue 19 item 8). Three parts, each on its own
//! freshly started servers (all under the bench root, `--sync` as given, default `always`):
//!
//! - `throughput`: one single-node `cursorlog serve` and a 3-member cluster run side by side;
//!   the same closed loop (`--producers` producers, each one `AppendStream` call with one
//!   request in flight, exactly `append --streaming`) runs against the single node and against
//!   the cluster's leader, for each `--batches` size, alternating which goes first per round;
//!   it prints appends/s, events/s, p50/p99 per request and replicated/single per batch.
//! - `failover`: see [`crate::failover::failover`], with the default timing and with
//!   `--election-timeout-ms 300 --heartbeat-ms 50` (`--fast-election-ms`, `--fast-heartbeat-ms`).
//! - `catchup`: see [`crate::failover::catchup`].

use std::path::Path;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::cluster::Cluster;
use crate::followers::{measure, Measured};
use crate::spawn::Spawned;
use crate::workloads::{prepare, Prepared};
use crate::{connect, secs, BoxError, Cli, Client, Workload};

/// A part of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// Replicated vs single-node append throughput and latency.
    Throughput,
    /// Leader kill → first acknowledged write, default and fast timing.
    Failover,
    /// Catch-up time of a wiped follower.
    Catchup,
}

/// The options of `replicated` (throughput windows are `--warmup` + `--duration`).
#[derive(Debug, Clone, Args)]
pub struct ReplicatedArgs {
    /// Parts to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "throughput,failover,catchup"
    )]
    pub parts: Vec<Part>,
    /// Concurrent producers (each its own connection and `AppendStream` call).
    #[arg(long, default_value_t = 50)]
    pub producers: usize,
    /// Sessions of the producers' streams.
    #[arg(long, default_value_t = 10)]
    pub sessions: usize,
    /// Streams per session.
    #[arg(long, default_value_t = 5)]
    pub streams_per_session: usize,
    /// Payload bytes per event.
    #[arg(long, default_value_t = 512)]
    pub payload: usize,
    /// Events per request, comma-separated: one comparison each.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub batches: Vec<usize>,
    /// Throughput rounds; each measures every batch size on both sides once.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Leader kills per timing.
    #[arg(long, default_value_t = 10)]
    pub kills: usize,
    /// Light load during failover: writes per second from one writer.
    #[arg(long, default_value_t = 50.0)]
    pub failover_rate: f64,
    /// `--election-timeout-ms` of the fast timing (the default timing passes no flag).
    #[arg(long, default_value_t = 300)]
    pub fast_election_ms: u64,
    /// `--heartbeat-ms` of the fast timing.
    #[arg(long, default_value_t = 50)]
    pub fast_heartbeat_ms: u64,
    /// MiB of payload written before a follower is wiped.
    #[arg(long, default_value_t = 256)]
    pub catchup_mib: u64,
    /// Give up on the catch-up after this many seconds (an error, with the members' logs kept).
    #[arg(long, default_value_t = 1800)]
    pub catchup_timeout_secs: u64,
}

impl ReplicatedArgs {
    /// Flags of the fast timing.
    pub fn fast_timing(&self) -> Vec<String> {
        vec![
            "--election-timeout-ms".to_owned(),
            self.fast_election_ms.to_string(),
            "--heartbeat-ms".to_owned(),
            self.fast_heartbeat_ms.to_string(),
        ]
    }
}

/// Runs the chosen parts; `Ok(false)` when a part saw failed operations.
pub async fn run(cli: &Cli, args: &ReplicatedArgs, bin: &Path) -> Result<bool, BoxError> {
    let mut clean = true;
    if args.parts.contains(&Part::Throughput) {
        clean &= throughput(cli, args, bin).await?;
    }
    if args.parts.contains(&Part::Failover) {
        let timings = [("default", Vec::new()), ("fast", args.fast_timing())];
        let mut rows = Vec::new();
        for (name, timing) in timings {
            let label = if timing.is_empty() {
                format!("{name} (1000 ms / 100 ms)")
            } else {
                format!("{name} ({}) ", timing.join(" "))
            };
            let times = crate::failover::failover(cli, args, bin, &timing).await?;
            rows.push((label, times));
        }
        println!("\nfailover: leader SIGKILL → first acknowledged write on the new leader");
        println!(
            "{:<50} {:>5} {:>8} {:>8} {:>8} {:>8}",
            "timing (election min / heartbeat)", "kills", "min ms", "p50 ms", "p99 ms", "max ms"
        );
        for (label, times) in &rows {
            let q = |p: f64| crate::failover::quantile_ms(times, p);
            println!(
                "{label:<50} {:>5} {:>8.0} {:>8.0} {:>8.0} {:>8.0}",
                times.len(),
                q(0.0),
                q(0.5),
                q(0.99),
                q(1.0)
            );
        }
    }
    if args.parts.contains(&Part::Catchup) {
        crate::failover::catchup(cli, args, bin).await?;
    }
    Ok(clean)
}

/// One side of the comparison: its producers and stats connection and prepared streams.
struct Side {
    name: &'static str,
    producers: Vec<Client>,
    stats: Client,
    /// Every server process of the side (the single node; all three members).
    pids: Vec<u32>,
    prepared: Vec<Prepared>,
}

impl Side {
    async fn new(
        name: &'static str,
        addr: &str,
        pids: Vec<u32>,
        cli: &Cli,
        args: &ReplicatedArgs,
    ) -> Result<Self, BoxError> {
        let rpc_timeout = secs(cli.rpc_timeout, "--rpc-timeout")?;
        let producers = connect(addr, args.producers.max(1), rpc_timeout).await?;
        let stats = connect(addr, 1, rpc_timeout)
            .await?
            .pop()
            .ok_or("no stats connection")?;
        let run_id = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let mut prepared = Vec::new();
        for (k, batch) in args.batches.iter().enumerate() {
            let workload = Workload::Append {
                producers: args.producers,
                sessions: args.sessions,
                streams_per_session: args.streams_per_session,
                batch: *batch,
                payload: args.payload,
                streaming: true,
            };
            let prefix = format!("repl-{name}-{run_id}-b{k}");
            prepared.push(prepare(&workload, &producers, &prefix).await?);
        }
        Ok(Self {
            name,
            producers,
            stats,
            pids,
            prepared,
        })
    }
}

/// CPU microseconds per event over the window: every server process of the side plus this
/// load generator. With every core busy, events/s = cores ÷ this, so the two sides' values
/// bound the ratio a CPU-bound machine can reach, whatever the latencies.
fn cpu_us_per_event(m: &Measured) -> Option<f64> {
    let cores = m.server_cpu? + m.client_cpu?;
    (m.events_per_sec > 0.0).then(|| cores / m.events_per_sec * 1e6)
}

/// Like [`cpu_us_per_event`], counting only the first server process (the leader) and this
/// load generator.
fn leader_us_per_event(m: &Measured) -> Option<f64> {
    let cores = (*m.server_cpu_each.first()?)? + m.client_cpu?;
    (m.events_per_sec > 0.0).then(|| cores / m.events_per_sec * 1e6)
}

/// The throughput comparison; `Ok(false)` when an append failed.
async fn throughput(cli: &Cli, args: &ReplicatedArgs, bin: &Path) -> Result<bool, BoxError> {
    let mut single = Spawned::start(bin, &cli.sync, &cli.server_args)?;
    let cluster = Cluster::start(bin, &cli.sync, &cli.server_args)?;
    let leader = cluster
        .leader("bench-leader-probe", Duration::from_secs(60))
        .await?;
    eprintln!(
        "cluster leader: member {} at {}",
        leader + 1,
        cluster.addrs[leader]
    );
    let mut sides = [
        Side::new("single", &single.addr, vec![single.pid()], cli, args).await?,
        Side::new(
            "replicated",
            &cluster.addrs[leader],
            // The leader first, so its CPU is the first of `server_cpu_each`.
            std::iter::once(leader)
                .chain((0..crate::cluster::MEMBERS).filter(|&i| i != leader))
                .filter_map(|i| cluster.pid(i))
                .collect(),
            cli,
            args,
        )
        .await?,
    ];
    println!(
        "\nthroughput: {} producers, AppendStream, {} B payload, sync={}, {} s window",
        args.producers, args.payload, cli.sync, cli.duration
    );
    println!(
        "{:>5} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>6}",
        "round",
        "batch",
        "node",
        "appends/s",
        "events/s",
        "p50 ms",
        "p99 ms",
        "srv cores",
        "gen cores",
        "cpu µs/ev",
        "errors"
    );
    // results[batch index][side index] = per-round measurements
    let mut results: Vec<[Vec<Measured>; 2]> = args
        .batches
        .iter()
        .map(|_| [Vec::new(), Vec::new()])
        .collect();
    for round in 0..args.rounds.max(1) {
        for (k, batch) in args.batches.iter().enumerate() {
            let order = if (round + k) % 2 == 0 { [0, 1] } else { [1, 0] };
            for s in order {
                let side = &mut sides[s];
                let m = measure(
                    cli,
                    &side.prepared[k],
                    &side.producers,
                    &mut side.stats,
                    &side.pids,
                )
                .await?;
                let cores =
                    |c: Option<f64>| c.map_or_else(|| "-".to_owned(), |c| format!("{c:.2}"));
                println!(
                    "{round:>5} {batch:>5} {:>10} {:>10.0} {:>10.0} {:>8.2} {:>8.2} {:>9} {:>9} {:>9} {:>6}",
                    side.name,
                    m.ops_per_sec,
                    m.events_per_sec,
                    m.p50_ms,
                    m.p99_ms,
                    cores(m.server_cpu),
                    cores(m.client_cpu),
                    cpu_us_per_event(&m)
                        .map_or_else(|| "-".to_owned(), |c| format!("{c:.1}")),
                    m.errors
                );
                if m.server_cpu_each.len() > 1 {
                    let each: Vec<String> = m.server_cpu_each.iter().map(|c| cores(*c)).collect();
                    println!(
                        "{:>22} cores of the leader, then each follower: {}",
                        "",
                        each.join(", ")
                    );
                }
                results[k][s].push(m);
            }
        }
    }
    // Cores of this machine, for the CPU-bound estimate.
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    println!(
        "\nreplicated vs single (median over rounds; cpu = every server process and this \
         generator, per event; cores allow = the ratio reached if the replicated side kept its \
         CPU per event and used every core of this machine ({cores}); leader alone = the same \
         counting only the leader and the generator, as if each member had a machine like this)"
    );
    println!(
        "{:>5} {:>12} {:>12} {:>7} {:>14} {:>14} {:>14} {:>11} {:>12}",
        "batch",
        "single ev/s",
        "repl ev/s",
        "ratio",
        "p50 ms s/r",
        "p99 ms s/r",
        "cpu µs/ev s/r",
        "cores allow",
        "leader alone"
    );
    let mut errors = 0;
    for (k, batch) in args.batches.iter().enumerate() {
        let med = |s: usize, f: fn(&Measured) -> f64| {
            crate::followers::median(results[k][s].iter().map(f).collect())
        };
        let (se, re) = (med(0, |m| m.events_per_sec), med(1, |m| m.events_per_sec));
        let cpu = |s: usize| med(s, |m| cpu_us_per_event(m).unwrap_or(f64::NAN));
        println!(
            "{batch:>5} {se:>12.0} {re:>12.0} {:>7.3} {:>14} {:>14} {:>14} {:>11.3} {:>12.3}",
            re / se,
            format!("{:.2}/{:.2}", med(0, |m| m.p50_ms), med(1, |m| m.p50_ms)),
            format!("{:.2}/{:.2}", med(0, |m| m.p99_ms), med(1, |m| m.p99_ms)),
            format!("{:.1}/{:.1}", cpu(0), cpu(1)),
            cores * 1e6 / cpu(1) / se,
            cores * 1e6 / med(1, |m| leader_us_per_event(m).unwrap_or(f64::NAN)) / se,
        );
        errors += results[k].iter().flatten().map(|m| m.errors).sum::<u64>();
    }
    if let Some(path) = &cli.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&to_json(args, cli, &results))?,
        )?;
        eprintln!("wrote {}", path.display());
    }
    drop(sides);
    drop(cluster);
    if let Some(note) = single.stop() {
        eprintln!("warning: single node: {note}");
    }
    Ok(errors == 0)
}

/// Every throughput measurement as JSON (`--json`): per batch size, each side's rounds.
fn to_json(args: &ReplicatedArgs, cli: &Cli, results: &[[Vec<Measured>; 2]]) -> serde_json::Value {
    let one = |m: &Measured| {
        serde_json::json!({
            "ops_per_sec": m.ops_per_sec,
            "events_per_sec": m.events_per_sec,
            "p50_ms": m.p50_ms,
            "p99_ms": m.p99_ms,
            "server_cpu_cores": m.server_cpu,
            "client_cpu_cores": m.client_cpu,
            // The leader first, then each follower (the single node alone on its side).
            "server_cpu_cores_each": m.server_cpu_each,
            "errors": m.errors,
        })
    };
    let batches: Vec<serde_json::Value> = args
        .batches
        .iter()
        .zip(results)
        .map(|(batch, [single, replicated])| {
            serde_json::json!({
                "batch": batch,
                "single": single.iter().map(one).collect::<Vec<_>>(),
                "replicated": replicated.iter().map(one).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({
        "workload": "replicated-throughput",
        "producers": args.producers,
        "payload": args.payload,
        "sync": cli.sync,
        "duration_secs": cli.duration,
        "batches": batches,
    })
}
