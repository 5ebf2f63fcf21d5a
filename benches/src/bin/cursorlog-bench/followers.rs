//! `cursorlog-bench followers`: what idle followers cost the write path, as a same-run
//! comparison. Durable append throughput of `--producers` producers (each one `AppendStream`
//! call, one request in flight, exactly the `append --streaming` workload) is measured in
//! rounds, alternately without followers and with `--followers` idle `Read(follow)` calls on
//! other streams (one per session, as MCP clients each hold one GET stream), in the order
//! none/with, with/none, none/with… so drift hits both sides alike. It prints every phase,
//! the median of each side and their ratio; with `--min-ratio` it exits 2 below it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::report::histogram;
use crate::workloads::{open_session, open_stream, prepare, work};
use crate::{
    connect, pb, probe, report, secs, stats, status_text, BoxError, Cli, Client, Shared, Worker,
    Workload,
};

/// The comparison's options (each phase is `--warmup` + `--duration`).
#[derive(Debug, Clone, Args)]
pub struct FollowersArgs {
    /// Idle follow calls during the "with" phases.
    #[arg(long, default_value_t = 10_000)]
    pub followers: usize,
    /// Connections the follow calls are spread over.
    #[arg(long, default_value_t = 50)]
    pub follower_connections: usize,
    /// Concurrent producers, each on its own connection and stream.
    #[arg(long, default_value_t = 50)]
    pub producers: usize,
    /// Sessions of the producers' streams.
    #[arg(long, default_value_t = 10)]
    pub sessions: usize,
    /// Streams per producer session.
    #[arg(long, default_value_t = 5)]
    pub streams_per_session: usize,
    /// Payload bytes per event.
    #[arg(long, default_value_t = 512)]
    pub payload: usize,
    /// Rounds; each measures both sides once.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Exit with status 2 when the ratio of the medians (with / without) is below this.
    #[arg(long)]
    pub min_ratio: Option<f64>,
}

/// A follower's stream.
#[derive(Debug, Clone)]
struct Idle {
    session: String,
    epoch: u64,
    stream: u64,
}

/// Opens one session with one lease-less stream per follower, `in_flight` at a time.
async fn open_idle_streams(
    clients: &[Client],
    prefix: &str,
    n: usize,
) -> Result<Vec<Idle>, BoxError> {
    let mut set = JoinSet::new();
    let mut out = Vec::with_capacity(n);
    let in_flight = clients.len() * 4;
    for i in 0..n {
        let mut client = clients
            .get(i % clients.len())
            .ok_or("no connection")?
            .clone();
        let session = format!("{prefix}-f{i}");
        set.spawn(async move {
            let epoch = open_session(&mut client, &session).await?;
            let stream = open_stream(&mut client, &session, epoch, None)
                .await
                .map_err(|s| format!("OpenStream: {}", status_text(&s)))?;
            Ok::<_, BoxError>(Idle {
                session,
                epoch,
                stream,
            })
        });
        if set.len() >= in_flight {
            if let Some(done) = set.join_next().await {
                out.push(done??);
            }
        }
    }
    while let Some(done) = set.join_next().await {
        out.push(done??);
    }
    Ok(out)
}

/// Idle follow calls that stay open until dropped; a call that fails or ends is recorded.
struct Followers {
    tasks: JoinSet<()>,
    failures: Arc<Mutex<Vec<String>>>,
}

impl Followers {
    /// Opens one follow call per stream and waits until every one got its `Resolution`.
    async fn open(clients: &[Client], idle: &[Idle], timeout: Duration) -> Result<Self, BoxError> {
        let ready = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let all_ready = Arc::new(tokio::sync::Notify::new());
        // A bounded number of calls being set up at once, so setup does not time out.
        let setting_up = Arc::new(Semaphore::new(clients.len() * 8));
        let mut tasks = JoinSet::new();
        for (i, t) in idle.iter().enumerate() {
            let mut client = clients
                .get(i % clients.len())
                .ok_or("no connection")?
                .clone();
            let (ready, failures, all_ready, setting_up) = (
                Arc::clone(&ready),
                Arc::clone(&failures),
                Arc::clone(&all_ready),
                Arc::clone(&setting_up),
            );
            let total = idle.len() as u64;
            let request = pb::ReadRequest {
                session: t.session.clone(),
                last_event_id: format!("{}-{}-0", t.epoch, t.stream),
                declared_stream: Some(t.stream),
                follow: true,
                batch_events_max: 0,
                resume_own_stream: false,
            };
            tasks.spawn(async move {
                let fail = |e: String| {
                    failures
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(e);
                    all_ready.notify_one();
                };
                let Ok(permit) = setting_up.acquire().await else {
                    return;
                };
                let mut call = match client.read(request).await {
                    Ok(r) => r.into_inner(),
                    Err(s) => return fail(format!("Read(follow): {}", status_text(&s))),
                };
                let mut permit = Some(permit);
                loop {
                    match call.message().await {
                        Ok(Some(pb::ReadResponse {
                            item: Some(pb::read_response::Item::Resolution(r)),
                        })) if r.verdict() == pb::Verdict::Resumable && permit.is_some() => {
                            drop(permit.take());
                            if ready.fetch_add(1, Ordering::Relaxed) + 1 == total {
                                all_ready.notify_one();
                            }
                        }
                        Ok(other) => return fail(format!("Read(follow): unexpected {other:?}")),
                        Err(s) => return fail(format!("Read(follow): {}", status_text(&s))),
                    }
                }
            });
        }
        let deadline = Instant::now() + timeout;
        while ready.load(Ordering::Relaxed) < idle.len() as u64 {
            if let Some(e) = failures
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .first()
            {
                return Err(format!("opening the followers: {e}").into());
            }
            if tokio::time::timeout_at(deadline.into(), all_ready.notified())
                .await
                .is_err()
            {
                return Err(format!(
                    "only {} of {} follow calls were open after {timeout:?}",
                    ready.load(Ordering::Relaxed),
                    idle.len()
                )
                .into());
            }
        }
        Ok(Self { tasks, failures })
    }

    /// Drops every call; errors if any failed or ended while it should have been idle.
    async fn close(mut self) -> Result<(), BoxError> {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        let failures = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match failures.first() {
            Some(e) => Err(format!(
                "{} follow calls failed while idle, first: {e}",
                failures.len()
            )
            .into()),
            None => Ok(()),
        }
    }
}

/// Polls `Stats.active_followers` until `done(n)` holds (the server counts calls as they
/// start and end, a little after the client sees them), or fails after `timeout`.
async fn wait_followers(
    client: &mut Client,
    done: impl Fn(u64) -> bool,
    timeout: Duration,
) -> Result<u64, BoxError> {
    let deadline = Instant::now() + timeout;
    loop {
        let n = stats(client).await.ok_or("Stats failed")?.active_followers;
        if done(n) {
            return Ok(n);
        }
        if Instant::now() >= deadline {
            return Err(
                format!("the server still reports {n} active followers after {timeout:?}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one phase measured.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    /// Requests (appends) per second.
    pub(crate) ops_per_sec: f64,
    pub(crate) events_per_sec: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// Server CPU over the window, in cores (summed over every process measured: all members
    /// of a cluster).
    pub(crate) server_cpu: Option<f64>,
    /// This load generator's own CPU over the window, in cores.
    pub(crate) client_cpu: Option<f64>,
    /// Each measured process's CPU over the window, in cores, in the order of its pid.
    pub(crate) server_cpu_each: Vec<Option<f64>>,
    /// The server's resident set at the end of the window, MiB.
    server_rss_mib: Option<f64>,
    /// The server's events per fdatasync over the window (its group-commit size).
    events_per_fsync: Option<f64>,
    pub(crate) errors: u64,
}

/// One measured phase.
#[derive(Debug, Clone)]
struct Phase {
    round: usize,
    with: bool,
    server_followers: u64,
    m: Measured,
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs the producers for one warm-up + window and measures them.
pub(crate) async fn measure(
    cli: &Cli,
    prepared: &crate::workloads::Prepared,
    producers: &[Client],
    stats_client: &mut Client,
    pids: &[u32],
) -> Result<Measured, BoxError> {
    // CPU seconds of each process in `pids`.
    let server_secs = || -> Vec<Option<f64>> {
        pids.iter()
            .map(|p| report::cpu_secs(&p.to_string()))
            .collect()
    };
    let warmup = secs(cli.warmup, "--warmup")?;
    let duration = secs(cli.duration, "--duration")?;
    let t0 = Instant::now();
    let shared = Arc::new(Shared {
        start: t0 + warmup,
        end: t0 + warmup + duration,
        budget: None,
        stop: AtomicBool::new(false),
        progress_ops: AtomicU64::new(0),
        progress_events: AtomicU64::new(0),
        progress_errors: AtomicU64::new(0),
        first_errors: Mutex::new(Vec::new()),
    });
    let mut set = JoinSet::new();
    for (i, client) in producers.iter().enumerate() {
        let w = Worker::new(Arc::clone(&shared), prepared.primary());
        set.spawn(work(prepared.clone(), i, client.clone(), w));
    }
    tokio::time::sleep_until(shared.start.into()).await;
    let cpu0 = server_secs();
    let own0 = report::cpu_secs("self");
    let before = stats(stats_client).await;
    tokio::time::sleep_until(shared.end.into()).await;
    let cpu1 = server_secs();
    let own1 = report::cpu_secs("self");
    let rss = pids.first().and_then(|p| probe::rss_bytes(*p).ok());
    let after = stats(stats_client).await;
    let mut latency = histogram();
    let (mut ops, mut events, mut errors) = (0, 0, 0);
    while let Some(w) = set.join_next().await {
        let w = w?;
        ops += w.ops;
        events += w.events;
        errors += w.errors;
        if let Some(h) = w.hists.get(prepared.primary()) {
            latency
                .add(h)
                .map_err(|e| format!("merging histograms: {e}"))?;
        }
    }
    if let Some(e) = shared
        .first_errors
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .first()
    {
        eprintln!("warning: {errors} appends failed, first: {e}");
    }
    let ms = |q| latency.value_at_quantile(q) as f64 / 1000.0;
    let window = duration.as_secs_f64();
    let cpu_each: Vec<Option<f64>> = cpu1
        .iter()
        .zip(&cpu0)
        .map(|(a, b)| Some((a.as_ref()? - b.as_ref()?) / window))
        .collect();
    Ok(Measured {
        ops_per_sec: ops as f64 / window,
        events_per_sec: events as f64 / window,
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        server_cpu: cpu_each
            .iter()
            .copied()
            .sum::<Option<f64>>()
            .filter(|_| !cpu_each.is_empty()),
        server_cpu_each: cpu_each,
        client_cpu: own1.zip(own0).map(|(a, b)| (a - b) / window),
        server_rss_mib: rss.map(|b| b as f64 / (1024.0 * 1024.0)),
        events_per_fsync: after.zip(before).and_then(|(a, b)| {
            let fsyncs = a.fsyncs.saturating_sub(b.fsyncs);
            (fsyncs > 0)
                .then(|| a.events_appended.saturating_sub(b.events_appended) as f64 / fsyncs as f64)
        }),
        errors,
    })
}

/// Runs the comparison; `Ok(false)` when `--min-ratio` was given and missed.
pub async fn run(
    cli: &Cli,
    args: &FollowersArgs,
    addr: &str,
    pid: Option<u32>,
) -> Result<bool, BoxError> {
    let rpc_timeout = secs(cli.rpc_timeout, "--rpc-timeout")?;
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let prefix = format!("followers-{run_id}");
    let producers = connect(addr, args.producers.max(1), rpc_timeout).await?;
    let follower_clients = connect(addr, args.follower_connections.max(1), rpc_timeout).await?;
    let mut stats_client = connect(addr, 1, rpc_timeout)
        .await?
        .pop()
        .ok_or("no stats connection")?;
    let setup = Instant::now();
    let workload = Workload::Append {
        producers: args.producers,
        sessions: args.sessions,
        streams_per_session: args.streams_per_session,
        batch: 1,
        payload: args.payload,
        streaming: true,
    };
    let prepared = prepare(&workload, &producers, &prefix).await?;
    let idle = open_idle_streams(&follower_clients, &prefix, args.followers).await?;
    eprintln!(
        "setup: {} producer streams and {} follower streams in {:.1} s",
        args.sessions * args.streams_per_session,
        idle.len(),
        setup.elapsed().as_secs_f64()
    );
    let baseline = wait_followers(&mut stats_client, |_| true, rpc_timeout).await?;

    println!(
        "{:>5} {:>10} {:>9} {:>10} {:>8} {:>8} {:>10} {:>12} {:>8} {:>6}",
        "round",
        "followers",
        "server",
        "events/s",
        "p50 ms",
        "p99 ms",
        "srv cores",
        "events/fsync",
        "RSS MiB",
        "errors"
    );
    let mut phases = Vec::new();
    for round in 0..args.rounds.max(1) {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with in order {
            let followers = if with {
                let f = Followers::open(&follower_clients, &idle, Duration::from_secs(120)).await?;
                wait_followers(
                    &mut stats_client,
                    |n| n >= baseline + idle.len() as u64,
                    Duration::from_secs(60),
                )
                .await?;
                Some(f)
            } else {
                None
            };
            let server_followers = stats(&mut stats_client)
                .await
                .map_or(0, |s| s.active_followers);
            let pids: Vec<u32> = pid.into_iter().collect();
            let m = measure(cli, &prepared, &producers, &mut stats_client, &pids).await?;
            if let Some(f) = followers {
                f.close().await?;
                wait_followers(
                    &mut stats_client,
                    |n| n <= baseline,
                    Duration::from_secs(60),
                )
                .await?;
            }
            let p = Phase {
                round,
                with,
                server_followers,
                m,
            };
            let opt = |v: Option<f64>, digits: usize| {
                v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
            };
            println!(
                "{:>5} {:>10} {:>9} {:>10.0} {:>8.2} {:>8.2} {:>10} {:>12} {:>8} {:>6}",
                p.round,
                if p.with { idle.len() } else { 0 },
                p.server_followers,
                p.m.events_per_sec,
                p.m.p50_ms,
                p.m.p99_ms,
                opt(p.m.server_cpu, 2),
                opt(p.m.events_per_fsync, 1),
                opt(p.m.server_rss_mib, 1),
                p.m.errors
            );
            phases.push(p);
        }
    }
    let side = |with: bool| {
        median(
            phases
                .iter()
                .filter(|p| p.with == with)
                .map(|p| p.m.events_per_sec)
                .collect(),
        )
    };
    let (none, with) = (side(false), side(true));
    let ratio = with / none;
    let pair_ratios: Vec<f64> = (0..args.rounds.max(1))
        .filter_map(|r| {
            let get = |w: bool| {
                phases
                    .iter()
                    .find(|p| p.round == r && p.with == w)
                    .map(|p| p.m.events_per_sec)
            };
            Some(get(true)? / get(false)?)
        })
        .collect();
    println!(
        "\nmedian events/s: {none:.0} without followers, {with:.0} with {} idle followers; \
         ratio {ratio:.3} (per round: {})",
        idle.len(),
        pair_ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let errors: u64 = phases.iter().map(|p| p.m.errors).sum();
    let passed = errors == 0 && args.min_ratio.is_none_or(|min| ratio >= min);
    if let Some(min) = args.min_ratio {
        println!("target ≥ {min}: {}", if passed { "met" } else { "MISSED" });
    }
    if let Some(path) = &cli.json {
        let rows: Vec<_> = phases
            .iter()
            .map(|p| {
                json!({"round": p.round, "followers": if p.with { idle.len() } else { 0 },
                       "server_followers": p.server_followers, "events_per_sec": p.m.events_per_sec,
                       "p50_ms": p.m.p50_ms, "p99_ms": p.m.p99_ms, "server_cores": p.m.server_cpu, "server_rss_mib": p.m.server_rss_mib,
                       "events_per_fsync": p.m.events_per_fsync, "errors": p.m.errors})
            })
            .collect();
        let v = json!({"producers": args.producers, "followers": idle.len(),
                       "median_without": none, "median_with": with, "ratio": ratio,
                       "pair_ratios": pair_ratios, "phases": rows});
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(passed)
}
