//! `cursorlog-bench`: a closed-loop load generator for a running `cursorlog` server over gRPC.
//!
//! ```sh
//! cursorlog-bench --spawn append --producers 50 --batch 16      # starts its own server
//! cursorlog-bench --addr 127.0.0.1:50051 resolve --clients 50    # drives a running one
//! cursorlog-bench --spawn replay --events 100000 [--follow]
//! cursorlog-bench --spawn mixed --clients 50 --reconnect-pct 10
//! cursorlog-bench --spawn --warmup 120 --duration 1800 soak --session-idle-ttl-secs 30 ...
//! cursorlog-bench --spawn --warmup 2 --duration 10 followers --followers 10000 --rounds 3
//! cursorlog-bench --warmup 2 --duration 10 replicated --kills 20 --catchup-mib 256
//! ```
//!
//! Each worker (producer, client, reader) runs one request at a time, as fast as the server
//! answers, on its own connection (or a pool, `--connections`). A progress line goes to stderr
//! every second; the final table (throughput, latency p50/p99/p99.9/max, errors, the server's
//! group-commit counters over the window) goes to stdout and, with `--json PATH`, to a file.
//! Every run is bounded by `--warmup` + `--duration` and optionally by `--ops`.

mod cluster;
mod failover;
mod followers;
mod probe;
mod replicated;
mod report;
mod soak;
mod soak_fleet;
mod soak_verdict;
mod spawn;
mod stalled;
mod worker;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use cursorlog_proto::v1 as pb;
use cursorlog_proto::v1::cursor_log_client::CursorLogClient;
use tonic::transport::{Channel, Endpoint};

use crate::report::{histogram, Report, ServerDelta};
pub use crate::worker::{Op, Rng, Shared, Worker};

/// Errors of setup and teardown (the measured operations count their errors instead).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Closed-loop gRPC load generator for cursorlog.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// Address of a running server (ignored with --spawn).
    #[arg(long, global = true, default_value = "127.0.0.1:50051")]
    addr: String,
    /// Start `cursorlog serve` on a temporary data directory (under target/bench-data or
    /// $CURSORLOG_BENCH_DIR) and stop it at the end.
    #[arg(long, global = true)]
    spawn: bool,
    /// The server binary for --spawn (default: `cursorlog` next to this executable).
    #[arg(long, global = true)]
    server_bin: Option<PathBuf>,
    /// Sync policy of the spawned server.
    #[arg(long, global = true, default_value = "always")]
    sync: String,
    /// Extra argument for the spawned server (repeatable), e.g. --server-arg=--segment-bytes=1048576.
    #[arg(long = "server-arg", global = true, allow_hyphen_values = true)]
    server_args: Vec<String>,
    /// Process id of the (not spawned) server on this machine, to report its CPU use.
    #[arg(long, global = true)]
    server_pid: Option<u32>,
    /// Keep the spawned server's data directory.
    #[arg(long, global = true)]
    keep_data: bool,
    /// Measurement time in seconds (after the warm-up).
    #[arg(long, global = true, default_value_t = 10.0)]
    duration: f64,
    /// Warm-up time in seconds (load runs, nothing is recorded).
    #[arg(long, global = true, default_value_t = 1.0)]
    warmup: f64,
    /// Offered load in operations per second over all workers, paced per worker (0: closed
    /// loop, each worker as fast as the server answers). Latency is then measured from each
    /// op's scheduled start, so a slow answer that delays the next op is charged to the server.
    #[arg(long, global = true, default_value_t = 0.0)]
    rate: f64,
    /// Stop after this many measured operations (also bounded by --duration).
    #[arg(long, global = true)]
    ops: Option<u64>,
    /// gRPC connections (default: one per worker).
    #[arg(long, global = true)]
    connections: Option<usize>,
    /// Tokio worker threads of this client.
    #[arg(long, global = true, default_value_t = 2)]
    threads: usize,
    /// Deadline of each RPC, in seconds.
    #[arg(long, global = true, default_value_t = 30.0)]
    rpc_timeout: f64,
    /// Write the results as JSON to this file.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    /// No progress lines.
    #[arg(long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    workload: Workload,
}

/// What to run.
#[derive(Debug, Clone, Subcommand)]
pub enum Workload {
    /// Durable appends: N producers over S sessions × T streams, one Append at a time each.
    Append {
        /// Concurrent producers.
        #[arg(long, default_value_t = 50)]
        producers: usize,
        /// Sessions.
        #[arg(long, default_value_t = 10)]
        sessions: usize,
        /// Streams per session (producer i appends to stream i mod sessions × streams).
        #[arg(long, default_value_t = 5)]
        streams_per_session: usize,
        /// Events per Append request.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Payload bytes per event.
        #[arg(long, default_value_t = 512)]
        payload: usize,
        /// Each producer appends over one long-lived `AppendStream` call (still one request
        /// at a time, each awaited) instead of one unary `Append` call per request.
        #[arg(long)]
        streaming: bool,
    },
    /// Resolve of valid (RESUMABLE) cursors with the stream declared, cycling randomly over
    /// pre-filled streams.
    Resolve {
        /// Concurrent clients.
        #[arg(long, default_value_t = 50)]
        clients: usize,
        /// Sessions to pre-fill.
        #[arg(long, default_value_t = 100)]
        sessions: usize,
        /// Streams per session.
        #[arg(long, default_value_t = 4)]
        streams_per_session: usize,
        /// Events per stream.
        #[arg(long, default_value_t = 16)]
        events_per_stream: usize,
    },
    /// Read of one long pre-filled stream from its start, repeatedly; one op = one whole
    /// replay. With --follow the call is a follow read, dropped once it has caught up.
    Replay {
        /// Concurrent readers.
        #[arg(long, default_value_t = 1)]
        readers: usize,
        /// Events in the stream.
        #[arg(long, default_value_t = 100_000)]
        events: usize,
        /// Payload bytes per event.
        #[arg(long, default_value_t = 512)]
        payload: usize,
        /// Events per Read message (`batch_events_max`).
        #[arg(long, default_value_t = 1000)]
        read_batch: u32,
        /// Read with `follow = true` (the stream stays open; the reader stops at the head).
        #[arg(long)]
        follow: bool,
    },
    /// MCP-like requests: OpenStream, a few progress Appends, Complete; sometimes a
    /// reconnect in between (Resolve of the first event's id, then Read of the rest).
    Mixed {
        /// Concurrent clients (each its own session).
        #[arg(long, default_value_t = 50)]
        clients: usize,
        /// Progress events per request.
        #[arg(long, default_value_t = 3)]
        progress: usize,
        /// Payload bytes per event.
        #[arg(long, default_value_t = 512)]
        payload: usize,
        /// Percentage of requests that reconnect (Resolve + Read replay) before completing.
        #[arg(long, default_value_t = 10)]
        reconnect_pct: u32,
    },
    /// MCP front-end fleet soak: sessions at a steady rate, never deleted, idle followers,
    /// resumes; samples server RSS, disk, descriptors, append p50/p99 and live sessions every
    /// interval and checks that the steady state is flat (exit status 2 when it is not).
    Soak(soak::SoakArgs),
    /// Durable append throughput with N idle followers vs none, in interleaved rounds.
    Followers(followers::FollowersArgs),
    /// What follow calls whose clients stopped reading cost the server's memory.
    Stalled(stalled::StalledArgs),
    /// Replicated (3 processes) vs single node in one run: append throughput per batch size,
    /// failover times, catch-up of a wiped follower. Starts its own servers (ignores --spawn).
    Replicated(replicated::ReplicatedArgs),
}

impl Workload {
    /// Flags this workload adds to a spawned server's command line.
    fn server_args(&self) -> Vec<String> {
        match self {
            Self::Soak(a) => a.server_args(),
            _ => Vec::new(),
        }
    }
}

/// The gRPC client type.
pub type Client = CursorLogClient<Channel>;

/// `code: message` of a failed RPC.
pub fn status_text(s: &tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

async fn connect(addr: &str, n: usize, rpc_timeout: Duration) -> Result<Vec<Client>, BoxError> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(10))
        .timeout(rpc_timeout)
        .tcp_nodelay(true);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let e = endpoint.clone();
        set.spawn(async move { e.connect().await });
    }
    let mut clients = Vec::with_capacity(n);
    while let Some(joined) = set.join_next().await {
        let channel = joined?.map_err(|e| format!("connecting to {addr}: {e}"))?;
        clients.push(
            CursorLogClient::new(channel)
                .max_decoding_message_size(64 * 1024 * 1024)
                .max_encoding_message_size(64 * 1024 * 1024),
        );
    }
    Ok(clients)
}

async fn stats(client: &mut Client) -> Option<pb::StatsResponse> {
    client
        .stats(pb::StatsRequest {})
        .await
        .ok()
        .map(tonic::Response::into_inner)
}

/// Prints ops/s and events/s every second until `done` is set.
async fn progress(shared: Arc<Shared>, t0: Instant, done: Arc<AtomicBool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let (mut last_ops, mut last_events) = (0, 0);
    while !done.load(Ordering::Relaxed) {
        tick.tick().await;
        let ops = shared.progress_ops.load(Ordering::Relaxed);
        let events = shared.progress_events.load(Ordering::Relaxed);
        let errors = shared.progress_errors.load(Ordering::Relaxed);
        let now = Instant::now();
        let phase = if now < shared.start {
            "warm-up"
        } else if now < shared.end {
            "measuring"
        } else {
            "draining"
        };
        eprintln!(
            "[{:>6.1}s {phase:>9}] {:>9} ops/s {:>10} events/s | total {ops} ops, {errors} errors",
            (now - t0).as_secs_f64(),
            ops - last_ops,
            events - last_events,
        );
        (last_ops, last_events) = (ops, events);
    }
}

fn secs(s: f64, what: &str) -> Result<Duration, BoxError> {
    Duration::try_from_secs_f64(s).map_err(|e| format!("{what}: {e}").into())
}

/// Exit status of a soak whose steady state was not flat, or a follower comparison below
/// `--min-ratio` (1 is a failed run: an error before any verdict).
const EXIT_VERDICT_FAILED: u8 = 2;

fn main() -> Result<ExitCode, BoxError> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.threads.max(1))
        .enable_all()
        .build()?;
    let mut server = if cli.spawn && !matches!(cli.workload, Workload::Replicated(_)) {
        let bin = match &cli.server_bin {
            Some(b) => b.clone(),
            None => spawn::default_server_bin()?,
        };
        let mut args = cli.server_args.clone();
        args.extend(cli.workload.server_args());
        Some(spawn::Spawned::start(&bin, &cli.sync, &args)?)
    } else {
        None
    };
    let addr = server
        .as_ref()
        .map_or_else(|| cli.addr.clone(), |s| s.addr.clone());
    let server_pid = server.as_ref().map(spawn::Spawned::pid).or(cli.server_pid);
    let data_dir = server.as_ref().map(|s| s.data_dir.clone());
    let result = runtime.block_on(async {
        match &cli.workload {
            Workload::Soak(args) => soak::run(&cli, args, &addr, server_pid, data_dir.as_deref())
                .await
                .map(Finished::Verdict),
            Workload::Followers(args) => followers::run(&cli, args, &addr, server_pid)
                .await
                .map(Finished::Verdict),
            Workload::Stalled(args) => stalled::run(&cli, args, &addr, server_pid)
                .await
                .map(Finished::Verdict),
            Workload::Replicated(args) => {
                let bin = match &cli.server_bin {
                    Some(b) => Ok(b.clone()),
                    None => spawn::default_server_bin(),
                };
                match bin {
                    Ok(bin) => replicated::run(&cli, args, &bin)
                        .await
                        .map(Finished::Verdict),
                    Err(e) => Err(e),
                }
            }
            _ => run(&cli, &addr, server_pid)
                .await
                .map(|r| Finished::Report(Box::new(r))),
        }
    });
    let mut unclean_stop = None;
    if let Some(s) = &mut server {
        if cli.keep_data {
            s.keep_data();
        }
        if let Some(note) = s.stop() {
            eprintln!("warning: {note}; server log: {}", s.log_path.display());
            unclean_stop = Some(note);
        }
    }
    match result? {
        Finished::Report(report) => {
            report.print();
            if let Some(path) = &cli.json {
                std::fs::write(path, serde_json::to_string_pretty(&report.to_json())?)?;
                eprintln!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Finished::Verdict(passed) => {
            // A verdict over a server that did not stop cleanly is no verdict.
            if let Some(note) = unclean_stop {
                return Err(format!("the server did not stop cleanly: {note}").into());
            }
            Ok(if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_VERDICT_FAILED)
            })
        }
    }
}

/// What a run ended with.
enum Finished {
    /// A closed-loop workload's report.
    Report(Box<Report>),
    /// A soak's flatness or a follower comparison's target: met or not.
    Verdict(bool),
}

async fn run(cli: &Cli, addr: &str, server_pid: Option<u32>) -> Result<Report, BoxError> {
    let rpc_timeout = secs(cli.rpc_timeout, "--rpc-timeout")?;
    let warmup = secs(cli.warmup, "--warmup")?;
    let duration = secs(cli.duration, "--duration")?;
    let workers = match &cli.workload {
        Workload::Append { producers, .. } => *producers,
        Workload::Resolve { clients, .. } | Workload::Mixed { clients, .. } => *clients,
        Workload::Replay { readers, .. } => *readers,
        Workload::Soak(_)
        | Workload::Followers(_)
        | Workload::Stalled(_)
        | Workload::Replicated(_) => {
            return Err("soak, followers and replicated are not closed-loop workloads".into())
        }
    }
    .max(1);
    let clients = connect(addr, cli.connections.unwrap_or(workers).max(1), rpc_timeout).await?;
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let prefix = format!("bench-{run_id}");

    let setup_started = Instant::now();
    let prepared = workloads::prepare(&cli.workload, &clients, &prefix).await?;
    eprintln!(
        "setup done in {:.1} s; {workers} workers on {} connections to {addr}",
        setup_started.elapsed().as_secs_f64(),
        clients.len()
    );

    let t0 = Instant::now();
    let shared = Arc::new(Shared {
        start: t0 + warmup,
        end: t0 + warmup + duration,
        budget: cli.ops.map(AtomicU64::new),
        stop: AtomicBool::new(false),
        progress_ops: AtomicU64::new(0),
        progress_events: AtomicU64::new(0),
        progress_errors: AtomicU64::new(0),
        first_errors: Mutex::new(Vec::new()),
    });
    let done = Arc::new(AtomicBool::new(false));
    let progress_task =
        (!cli.quiet).then(|| tokio::spawn(progress(Arc::clone(&shared), t0, Arc::clone(&done))));

    // Server counters and CPU at the start of the window.
    let mut stats_client = clients.first().ok_or("no connection")?.clone();
    let window_start = {
        let shared = Arc::clone(&shared);
        let mut c = stats_client.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(shared.start.into()).await;
            let cpu_client = report::cpu_secs("self");
            let cpu_server = server_pid.and_then(|p| report::cpu_secs(&p.to_string()));
            (stats(&mut c).await, cpu_client, cpu_server)
        })
    };

    // The same at the end of the window, so CPU and counters cover exactly the window the
    // throughput is computed over (not the drain of ops still in flight after it, which for
    // a replay can be a whole replay long).
    let window_end = {
        let shared = Arc::clone(&shared);
        let mut c = stats_client.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(shared.end.into()).await;
            let cpu_client = report::cpu_secs("self");
            let cpu_server = server_pid.and_then(|p| report::cpu_secs(&p.to_string()));
            (stats(&mut c).await, cpu_client, cpu_server)
        })
    };

    let mut set = tokio::task::JoinSet::new();
    for i in 0..workers {
        let client = clients
            .get(i % clients.len())
            .ok_or("no connection")?
            .clone();
        let mut worker = Worker::new(Arc::clone(&shared), prepared.primary());
        if cli.rate > 0.0 {
            let interval = secs(workers as f64 / cli.rate, "--rate")?;
            worker.pace(interval, t0 + interval.mul_f64(i as f64 / workers as f64));
        }
        set.spawn(workloads::work(prepared.clone(), i, client, worker));
    }
    let mut merged = Worker::new(Arc::clone(&shared), prepared.primary());
    let hard_stop = shared.end + rpc_timeout + Duration::from_secs(5);
    loop {
        let joined = tokio::time::timeout_at(hard_stop.into(), set.join_next()).await;
        match joined {
            Ok(Some(Ok(w))) => {
                merged.ops += w.ops;
                merged.events += w.events;
                merged.errors += w.errors;
                merged.last_done = merged.last_done.max(w.last_done);
                for (name, h) in w.hists {
                    merged
                        .hists
                        .entry(name)
                        .or_insert_with(histogram)
                        .add(h)
                        .map_err(|e| format!("merging histograms: {e}"))?;
                }
            }
            Ok(Some(Err(e))) => return Err(format!("worker failed: {e}").into()),
            Ok(None) => break,
            Err(_) => {
                eprintln!("warning: workers still busy past the window; aborting them");
                set.abort_all();
                break;
            }
        }
    }
    let (stats_before, cpu_client_before, cpu_server_before) = if window_start.is_finished() {
        window_start.await?
    } else {
        window_start.abort();
        (None, None, None)
    };
    // With an op budget the run can end before the window does: then sample now.
    let at_end = if window_end.is_finished() {
        window_end.await.ok()
    } else {
        window_end.abort();
        None
    };
    let (stats_after, cpu_client_after, cpu_server_after) = match at_end {
        Some((stats_end, cpu_client, cpu_server)) if stats_end.is_some() => {
            (stats_end, cpu_client, cpu_server)
        }
        // No end-of-window sample (budget hit, or its Stats call failed): take one now.
        _ => (
            stats(&mut stats_client).await,
            report::cpu_secs("self"),
            server_pid.and_then(|p| report::cpu_secs(&p.to_string())),
        ),
    };
    done.store(true, Ordering::Relaxed);
    if let Some(t) = progress_task {
        t.abort();
    }

    let budget_hit = shared.stop.load(Ordering::Relaxed);
    let elapsed = match merged.last_done {
        Some(last) if budget_hit => last.saturating_duration_since(shared.start),
        _ => duration,
    };
    let server = match (stats_before, stats_after) {
        (Some(b), Some(a)) => Some(ServerDelta {
            events_appended: a.events_appended.saturating_sub(b.events_appended),
            fsyncs: a.fsyncs.saturating_sub(b.fsyncs),
            commit_batches: a.commit_batches.saturating_sub(b.commit_batches),
            records_written: a.records_written.saturating_sub(b.records_written),
        }),
        _ => None,
    };
    let mut params = prepared.params();
    if let Some(m) = params.as_object_mut() {
        m.insert("warmup_secs".into(), cli.warmup.into());
        m.insert("duration_secs".into(), cli.duration.into());
        m.insert("connections".into(), clients.len().into());
        m.insert("client_threads".into(), cli.threads.into());
        m.insert(
            "offered_rate".into(),
            if cli.rate > 0.0 {
                cli.rate.into()
            } else {
                "closed loop".into()
            },
        );
        m.insert("addr".into(), addr.into());
        if cli.spawn {
            m.insert("spawned_sync".into(), cli.sync.clone().into());
        }
    }
    let first_errors = shared
        .first_errors
        .lock()
        .expect("error list lock poisoned")
        .clone();
    Ok(Report {
        workload: prepared.name().to_owned(),
        params,
        elapsed,
        ops: merged.ops,
        events: merged.events,
        errors: merged.errors,
        first_errors,
        primary: prepared.primary(),
        hists: merged.hists,
        server,
        client_cpu_secs: cpu_client_after.zip(cpu_client_before).map(|(a, b)| a - b),
        server_cpu_secs: cpu_server_after.zip(cpu_server_before).map(|(a, b)| a - b),
    })
}
