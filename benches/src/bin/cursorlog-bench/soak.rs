//! `cursorlog-bench soak`: plays an MCP front-end fleet (see `soak_fleet.rs`) against a server
//! for `--warmup` + `--duration` seconds and samples, every `--interval-secs`, the server's RSS,
//! data-directory bytes and open descriptors (from `/proc`, so the server runs on this
//! machine), the append p50/p99 of the interval and the server's session and follower counts.
//! It prints a row per sample, writes them as CSV (`--csv`), and ends with the flatness check
//! (`soak_verdict.rs`): exit status 0 when flat, 2 when not, 1 when the run itself failed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use crate::soak_fleet::{Fleet, FleetConfig};
use crate::soak_verdict::{judge, Phase, Sample, Tolerance};
use crate::{connect, pb, probe, report, secs, stats, status_text, BoxError, Cli};

/// The soak's own options (the run's length is `--warmup` + `--duration`, the connections
/// `--connections`).
#[derive(Debug, Clone, Args)]
pub struct SoakArgs {
    /// New sessions per second (opened at a steady rate, never deleted).
    #[arg(long, default_value_t = 20.0)]
    pub sessions_per_sec: f64,
    /// Seconds each client stays connected with its idle follow call; live followers in the
    /// steady state ≈ sessions-per-sec × this.
    #[arg(long, default_value_t = 60.0)]
    pub client_lifetime_secs: f64,
    /// Tool calls (request streams) per session, spread over its lifetime.
    #[arg(long, default_value_t = 3)]
    pub requests: usize,
    /// Progress events per tool call (before its `Complete`).
    #[arg(long, default_value_t = 2)]
    pub progress: usize,
    /// Payload bytes per event.
    #[arg(long, default_value_t = 256)]
    pub payload: usize,
    /// Percentage of tool calls resumed from an earlier cursor after they completed.
    #[arg(long, default_value_t = 10)]
    pub resume_pct: u32,
    /// Seconds between samples.
    #[arg(long, default_value_t = 10.0)]
    pub interval_secs: f64,
    /// Largest allowed change between the first and the last third, in percent.
    #[arg(long, default_value_t = 10.0)]
    pub tolerance_pct: f64,
    /// The same for the append p99 (default: --tolerance-pct). On a shared machine a short
    /// run's p99 swings far more than its resources do (see benches/HISTORY.md). A p99 outside
    /// it passes when its ratio to the disk's own fdatasync p99 (the control probe) is inside.
    #[arg(long)]
    pub p99_tolerance_pct: Option<f64>,
    /// Write every sample to this CSV file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// The data directory of a server not started with --spawn (its size is sampled).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// With --spawn: the server's `--session-idle-ttl-secs`.
    #[arg(long)]
    pub session_idle_ttl_secs: Option<u64>,
    /// With --spawn: the server's `--metadata-horizon-secs`.
    #[arg(long)]
    pub metadata_horizon_secs: Option<u64>,
    /// With --spawn: the server's `--retention-max-age-secs`.
    #[arg(long)]
    pub retention_max_age_secs: Option<u64>,
    /// With --spawn: the server's `--segment-bytes`.
    #[arg(long)]
    pub segment_bytes: Option<u64>,
    /// With --spawn: the server's `--retention-check-interval-ms`.
    #[arg(long)]
    pub retention_check_interval_ms: Option<u64>,
    /// Sessions opened before the fleet starts that stay connected for the whole run, each
    /// holding an idle `Read(follow)` that pins it against the idle TTL. With more than one
    /// expiry round's worth (1,024) they once starved the expiry of every other session.
    #[arg(long, default_value_t = 0)]
    pub pinned_followers: usize,
}

impl SoakArgs {
    /// The flags for a spawned server.
    pub fn server_args(&self) -> Vec<String> {
        [
            ("--session-idle-ttl-secs", self.session_idle_ttl_secs),
            ("--metadata-horizon-secs", self.metadata_horizon_secs),
            ("--retention-max-age-secs", self.retention_max_age_secs),
            ("--segment-bytes", self.segment_bytes),
            (
                "--retention-check-interval-ms",
                self.retention_check_interval_ms,
            ),
        ]
        .into_iter()
        .filter_map(|(flag, v)| v.map(|v| format!("{flag}={v}")))
        .collect()
    }
}

const CSV_HEADER: &str = "t_secs,phase,rss_bytes,disk_bytes,fds,append_p50_us,append_p99_us,\
appends,live_sessions,sessions,streams,open_streams,server_followers,client_followers,\
server_cpu_cores,sessions_opened,errors,followers_ended_by_server,fsync_probe_p99_us,threads";

/// The control probe's fdatasync p99 over the sample's interval, µs.
fn fsync_p99_us(s: &Sample) -> Option<u64> {
    s.fsync_hist
        .as_ref()
        .filter(|h| !h.is_empty())
        .map(|h| h.value_at_quantile(0.99))
}

fn csv_row(s: &Sample, phase: Phase) -> String {
    let opt = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
    format!(
        "{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
        s.t,
        phase.label(),
        s.rss_bytes,
        s.disk_bytes,
        s.fds,
        opt(s.append_p50_us),
        opt(s.append_p99_us),
        s.appends,
        opt(s.live_sessions),
        s.sessions,
        s.streams,
        s.open_streams,
        s.server_followers,
        s.client_followers,
        s.server_cpu.map_or_else(String::new, |c| format!("{c:.3}")),
        s.sessions_opened,
        s.errors,
        s.followers_ended,
        opt(fsync_p99_us(s)),
        s.threads
    )
}

const TABLE_HEADER: &str = "  t (s) phase    RSS MiB disk MiB   fds  p50 ms  p99 ms appends/s \
live sess  sessions  followers srv/cli  cpu  errors fsync p99 thr";

fn table_row(s: &Sample, phase: Phase, interval: f64) -> String {
    let ms = |v: Option<u64>| {
        v.map_or_else(|| "-".to_owned(), |us| format!("{:.2}", us as f64 / 1000.0))
    };
    format!(
        "{:>7.0} {:<7} {:>8.1} {:>8.1} {:>5} {:>7} {:>7} {:>9.0} {:>9} {:>9} {:>9}/{:<7} {:>4} {:>7} {:>9} {:>3}",
        s.t,
        phase.label(),
        s.rss_bytes as f64 / (1024.0 * 1024.0),
        s.disk_bytes as f64 / (1024.0 * 1024.0),
        s.fds,
        ms(s.append_p50_us),
        ms(s.append_p99_us),
        s.appends as f64 / interval,
        s.live_sessions.map_or_else(|| "-".to_owned(), |n| n.to_string()),
        s.sessions,
        s.server_followers,
        s.client_followers,
        s.server_cpu.map_or_else(|| "-".to_owned(), |c| format!("{c:.2}")),
        s.errors,
        ms(fsync_p99_us(s)),
        s.threads
    )
}

/// Asks the server for its idle TTL (a probe session, left to expire like the fleet's).
async fn idle_ttl_ms(client: &mut crate::Client, session: &str) -> Result<u64, BoxError> {
    client
        .open_session(pb::OpenSessionRequest {
            session: session.to_owned(),
            state: None,
        })
        .await
        .map_err(|s| format!("OpenSession (probe): {}", status_text(&s)))?;
    let r = client
        .get_session(pb::GetSessionRequest {
            session: session.to_owned(),
        })
        .await
        .map_err(|s| format!("GetSession (probe): {}", status_text(&s)))?;
    Ok(r.into_inner().idle_ttl_ms)
}

/// Runs the soak; `Ok(true)` when the steady state was flat.
pub async fn run(
    cli: &Cli,
    args: &SoakArgs,
    addr: &str,
    pid: Option<u32>,
    data_dir: Option<&Path>,
) -> Result<bool, BoxError> {
    let pid =
        pid.ok_or("soak samples the server's /proc entries: pass --server-pid (or --spawn)")?;
    let data_dir = data_dir
        .map(Path::to_path_buf)
        .or_else(|| args.data_dir.clone())
        .ok_or("soak samples the data directory's size: pass --data-dir (or --spawn)")?;
    let positive = |v: f64| v.is_finite() && v > 0.0;
    let interval = args.interval_secs;
    if !positive(interval) || cli.duration < 3.0 * interval {
        return Err(format!(
            "--duration ({} s) must cover at least three --interval-secs ({interval} s), one per third",
            cli.duration
        )
        .into());
    }
    if !positive(args.sessions_per_sec) || !positive(args.client_lifetime_secs) {
        return Err("--sessions-per-sec and --client-lifetime-secs must be positive".into());
    }
    let rpc_timeout = secs(cli.rpc_timeout, "--rpc-timeout")?;
    let lifetime = secs(args.client_lifetime_secs, "--client-lifetime-secs")?;
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let prefix = format!("soak-{run_id}");
    let clients = connect(addr, cli.connections.unwrap_or(16).max(1), rpc_timeout).await?;
    let mut stats_client = connect(addr, 1, rpc_timeout)
        .await?
        .pop()
        .ok_or("no stats connection")?;
    let ttl_ms = idle_ttl_ms(&mut stats_client, &format!("{prefix}-probe")).await?;
    eprintln!(
        "soak: {} sessions/s, clients connected {} s, {} calls × {} progress events, {} % resumed, \
         {} connections; server idle TTL {} s{}",
        args.sessions_per_sec,
        args.client_lifetime_secs,
        args.requests,
        args.progress,
        args.resume_pct,
        clients.len(),
        ttl_ms as f64 / 1000.0,
        if ttl_ms == 0 { " (sessions never expire when idle)" } else { "" }
    );
    let settle = args.client_lifetime_secs
        + ttl_ms as f64 / 1000.0
        + args.metadata_horizon_secs.unwrap_or(0) as f64
        + args.retention_max_age_secs.unwrap_or(0) as f64;
    if ttl_ms > 0 && cli.warmup < settle {
        eprintln!(
            "note: --warmup {} s is shorter than client lifetime + idle TTL + horizon + retention \
             ({settle} s, of what is known): the first third may still be filling up",
            cli.warmup
        );
    }
    let mut csv = match &args.csv {
        Some(path) => {
            let mut f = std::fs::File::create(path)
                .map_err(|e| format!("creating {}: {e}", path.display()))?;
            writeln!(f, "{CSV_HEADER}")?;
            Some(f)
        }
        None => None,
    };

    let fleet = Arc::new(Fleet::new(
        FleetConfig {
            prefix,
            sessions_per_sec: args.sessions_per_sec,
            client_lifetime: lifetime,
            requests: args.requests,
            progress: args.progress,
            payload: Arc::new(crate::workloads::payload(args.payload)),
            resume_pct: args.resume_pct,
        },
        clients,
    ));
    // The control probe writes beside the data directory (the same file system when spawned).
    let probe_dir = data_dir.parent().unwrap_or(&data_dir).to_path_buf();
    let fsync_probe = match probe::FsyncProbe::start(&probe_dir, Duration::from_millis(50)) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("note: no fsync control probe ({e}); the fsync p99 column stays empty");
            None
        }
    };
    let pinned = if args.pinned_followers > 0 {
        let started = Instant::now();
        let held = fleet.hold_pinned(args.pinned_followers).await?;
        eprintln!(
            "soak: {} pinned sessions following idle in {:.1} s",
            args.pinned_followers,
            started.elapsed().as_secs_f64()
        );
        Some(held)
    } else {
        None
    };
    let t0 = Instant::now();
    let total = cli.warmup + cli.duration;
    let (stop_fleet, stop) = tokio::sync::oneshot::channel();
    let fleet_task = tokio::spawn(Arc::clone(&fleet).run(stop));
    fleet.take_appends();

    println!("{TABLE_HEADER}");
    let mut samples = Vec::new();
    let mut phases = Vec::new();
    let mut before = Sample::default();
    let mut cpu_before = report::cpu_secs(&pid.to_string());
    for k in 1u32.. {
        let t = interval * f64::from(k);
        if t > total + interval / 100.0 {
            break;
        }
        tokio::time::sleep_until((t0 + Duration::from_secs_f64(t)).into()).await;
        let appends = fleet.take_appends();
        let server = stats(&mut stats_client).await;
        let cpu = report::cpu_secs(&pid.to_string());
        let c = &fleet.counters;
        let phase = Phase::of(t, interval, cli.warmup, cli.duration);
        if phase == Phase::Third(0) && !phases.contains(&Phase::Third(0)) {
            before = samples.last().cloned().unwrap_or_default();
        }
        let has_appends = !appends.is_empty();
        let sample = Sample {
            t,
            rss_bytes: probe::rss_bytes(pid)
                .map_err(|e| format!("the server (pid {pid}) is gone? {e}"))?,
            disk_bytes: probe::dir_bytes(&data_dir)?,
            fds: probe::fd_count(pid)?,
            threads: probe::thread_count(pid)?,
            append_p50_us: has_appends.then(|| appends.value_at_quantile(0.5)),
            append_p99_us: has_appends.then(|| appends.value_at_quantile(0.99)),
            appends: appends.len(),
            append_hist: has_appends.then_some(appends),
            fsync_hist: fsync_probe.as_ref().map(probe::FsyncProbe::take),
            live_sessions: server.as_ref().map(|s| s.live_sessions),
            sessions: server.as_ref().map_or(0, |s| s.sessions),
            streams: server.as_ref().map_or(0, |s| s.streams),
            open_streams: server.as_ref().map_or(0, |s| s.open_streams),
            server_followers: server.as_ref().map_or(0, |s| s.active_followers),
            client_followers: c.followers_open.load(Ordering::Relaxed),
            server_cpu: cpu.zip(cpu_before).map(|(a, b)| (a - b) / interval),
            sessions_opened: c.sessions_opened.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            followers_ended: c.followers_ended_by_server.load(Ordering::Relaxed),
        };
        cpu_before = cpu;
        println!("{}", table_row(&sample, phase, interval));
        if let Some(f) = csv.as_mut() {
            writeln!(f, "{}", csv_row(&sample, phase))?;
            f.flush()?;
        }
        samples.push(sample);
        phases.push(phase);
    }
    // The last sample is taken with the fleet still at full strength; only now it stops.
    let _ = stop_fleet.send(());
    fleet_task.await?;
    drop(pinned);

    let c = &fleet.counters;
    println!(
        "\nfleet: {} sessions opened, {} calls completed, {} appends, {} resumes checked \
         ({} evicted), {} follow calls ended by the server, {} errors",
        c.sessions_opened.load(Ordering::Relaxed),
        c.requests_completed.load(Ordering::Relaxed),
        c.appends.load(Ordering::Relaxed),
        c.resumes.load(Ordering::Relaxed),
        c.resumes_evicted.load(Ordering::Relaxed),
        c.followers_ended_by_server.load(Ordering::Relaxed),
        c.errors.load(Ordering::Relaxed),
    );
    for e in fleet.first_errors() {
        println!("  error: {e}");
    }
    let tolerance = Tolerance {
        resources: args.tolerance_pct / 100.0,
        p99: args.p99_tolerance_pct.unwrap_or(args.tolerance_pct) / 100.0,
    };
    let verdict = judge(&samples, &phases, &before, tolerance);
    verdict.print();
    if let Some(path) = &args.csv {
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &cli.json {
        let mut v = verdict.to_json();
        if let Some(m) = v.as_object_mut() {
            m.insert("idle_ttl_ms".into(), ttl_ms.into());
            m.insert(
                "sessions_opened".into(),
                c.sessions_opened.load(Ordering::Relaxed).into(),
            );
            m.insert("errors".into(), c.errors.load(Ordering::Relaxed).into());
        }
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(verdict.passed())
}
