//! One measured run of a configuration (`raft3`, `raft1`, `single`), and the failover mode.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cursorlog_replication::ClusterTiming;
use hdrhistogram::Histogram;
use openraft::async_runtime::WatchReceiver as _;

use super::cluster::{raft_err, BenchError, Cluster, WAIT};
use super::load::{client, histogram, single_writer, AckWatch, Target};
use super::store::AppendCounts;

/// The 1-minute load average now (`/proc/loadavg`), NaN when unreadable.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|f| f.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Acknowledged entries per second.
    pub rate: f64,
    /// Median write latency, ms.
    pub p50_ms: f64,
    /// 99th percentile write latency, ms.
    pub p99_ms: f64,
    /// Entries per `fdatasync` on the leader (the writer for `single`).
    pub leader_epf: f64,
    /// Entries per `fdatasync` on the followers (none for `raft1` and `single`).
    pub follower_epf: Option<f64>,
    /// Writes that failed and were retried.
    pub errors: u64,
    /// Terms that passed during the window (elections nobody asked for).
    pub elections: u64,
    /// Load average at the start and at the end.
    pub load: (f64, f64),
}

/// Entries per append between two `(appends, entries)` readings.
fn per_append(before: (u64, u64), after: (u64, u64)) -> f64 {
    let appends = after.0.saturating_sub(before.0);
    let entries = after.1.saturating_sub(before.1);
    if appends == 0 {
        0.0
    } else {
        entries as f64 / appends as f64
    }
}

/// Runs `clients` clients against `target` for `duration`; the merged histogram and errors.
async fn drive(target: &Target, clients: usize, duration: Duration) -> (Histogram<u64>, u64) {
    let deadline = Instant::now() + duration;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..clients)
        .map(|i| tokio::spawn(client(i, target.clone(), deadline, stop.clone(), None)))
        .collect();
    let mut hist = histogram();
    let mut errors = 0;
    for task in tasks {
        if let Ok(stats) = task.await {
            // Same bounds on both sides: adding cannot fail.
            let _ = hist.add(&stats.hist);
            errors += stats.errors;
        }
    }
    (hist, errors)
}

fn result(hist: &Histogram<u64>, duration: Duration, errors: u64, load0: f64) -> RunResult {
    RunResult {
        rate: hist.len() as f64 / duration.as_secs_f64(),
        p50_ms: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: hist.value_at_quantile(0.99) as f64 / 1000.0,
        leader_epf: 0.0,
        follower_epf: None,
        errors,
        elections: 0,
        load: (load0, loadavg()),
    }
}

/// `voters` openraft nodes of `timing` over the gRPC transport, `clients` clients on the
/// leader.
///
/// # Errors
/// The cluster does not start or stop.
pub async fn run_raft(
    root: &Path,
    voters: u64,
    clients: usize,
    duration: Duration,
    timing: &ClusterTiming,
) -> Result<RunResult, BenchError> {
    let load0 = loadavg();
    let cluster = Cluster::start(root, voters, timing.clone()).await?;
    let leader_id = cluster.agreed_leader(None).await?;
    let leader = cluster
        .node(leader_id)
        .ok_or_else(|| BenchError::Raft("the leader is not live".into()))?;
    // One write first: the leader's first entries (blank, membership) are behind us.
    let warm = super::load::proposal(9_999).as_bytes().to_vec();
    leader
        .raft
        .client_write(cursorlog_replication::Proposal::new(warm))
        .await
        .map_err(raft_err)?;
    let term0 = leader.term();
    let before: Vec<_> = cluster.nodes.iter().map(|n| n.counts.get()).collect();
    let (hist, errors) = drive(&Target::Raft(cluster.router.clone()), clients, duration).await;
    let after: Vec<_> = cluster.nodes.iter().map(|n| n.counts.get()).collect();
    let mut r = result(&hist, duration, errors, load0);
    let mut followers = Vec::new();
    for ((node, b), a) in cluster.nodes.iter().zip(&before).zip(&after) {
        if node.id == leader_id {
            r.leader_epf = per_append(*b, *a);
        } else {
            followers.push(per_append(*b, *a));
        }
    }
    if !followers.is_empty() {
        r.follower_epf = Some(followers.iter().sum::<f64>() / followers.len() as f64);
    }
    r.elections = cluster
        .nodes
        .iter()
        .map(|n| n.term())
        .max()
        .unwrap_or(term0)
        .saturating_sub(term0);
    cluster.stop().await?;
    r.load.1 = loadavg();
    Ok(r)
}

/// One [`cursorlog_engine::EntryLog`], no Raft: a group-committing writer thread.
///
/// # Errors
/// The log does not open, or an append failed.
pub async fn run_single(
    root: &Path,
    clients: usize,
    duration: Duration,
) -> Result<RunResult, BenchError> {
    let load0 = loadavg();
    let dir = tempfile::Builder::new().prefix("single").tempdir_in(root)?;
    let counts = Arc::new(AppendCounts::default());
    let (tx, writer) = single_writer(dir.path(), counts.clone())?;
    let (hist, errors) = drive(&Target::Single(tx), clients, duration).await;
    // Every client dropped its sender clone; the writer ends.
    let ended = tokio::task::spawn_blocking(move || writer.join())
        .await
        .map_err(|e| BenchError::Server(e.to_string()))?;
    ended.map_err(|_| BenchError::Server("the writer thread panicked".into()))??;
    let mut r = result(&hist, duration, errors, load0);
    r.leader_epf = per_append((0, 0), counts.get());
    Ok(r)
}

/// The failover mode's figures for one timing.
#[derive(Debug, Default)]
pub struct Failover {
    /// Kill of the leader → first acknowledged write on the new leader, per kill.
    pub times: Vec<Duration>,
    /// Restart of the killed node → it applied what the leader had committed.
    pub catch_up: Vec<Duration>,
    /// Terms beyond one per kill while electing the new leader (split or repeated votes).
    pub extra_terms: u64,
    /// Terms that passed while no node was being killed (spurious elections).
    pub spurious: u64,
    /// Writes that failed and were retried.
    pub errors: u64,
    /// Entries acknowledged in all.
    pub acked: u64,
}

/// How long the clients write between one node's catch-up and the next kill: a window for
/// spurious elections to show.
const STEADY: Duration = Duration::from_secs(2);

/// With `clients` clients writing to a 3-node cluster of `timing`, kills the leader `kills`
/// times (restarting it from its directory and waiting for it to catch up each time).
///
/// # Errors
/// The cluster fails, or a step does not happen within the cluster's wait bound.
pub async fn failover(
    root: &Path,
    kills: usize,
    clients: usize,
    timing: ClusterTiming,
) -> Result<Failover, BenchError> {
    let mut cluster = Cluster::start(root, 3, timing).await?;
    let acks = Arc::new(AckWatch::default());
    let stop = Arc::new(AtomicBool::new(false));
    let far = Instant::now() + Duration::from_secs(24 * 3600);
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let target = Target::Raft(cluster.router.clone());
            tokio::spawn(client(i, target, far, stop.clone(), Some(acks.clone())))
        })
        .collect();
    let mut out = Failover::default();
    let mut term = cluster.nodes.iter().map(|n| n.term()).max().unwrap_or(0);
    for _ in 0..kills {
        tokio::time::sleep(STEADY).await;
        let leader = cluster.agreed_leader(None).await?;
        let now_term = cluster.nodes.iter().map(|n| n.term()).max().unwrap_or(0);
        out.spurious += now_term.saturating_sub(term);
        let killed_at = Instant::now();
        acks.arm(leader, killed_at);
        let (addr, dir) = cluster.kill(leader).await?;
        tokio::time::timeout(WAIT, acks.seen.notified())
            .await
            .map_err(|_| BenchError::Raft("no write acknowledged after the kill".into()))?;
        let first = acks.first().unwrap_or_else(Instant::now);
        out.times.push(first - killed_at);
        let new_leader = cluster.agreed_leader(Some(leader)).await?;
        let elected_term = cluster.nodes.iter().map(|n| n.term()).max().unwrap_or(0);
        out.extra_terms += elected_term.saturating_sub(now_term + 1);
        let restarted_at = Instant::now();
        cluster.restart(leader, &addr, &dir).await?;
        let committed = cluster.node(new_leader).and_then(|n| {
            n.raft
                .metrics()
                .borrow_watched()
                .cluster_committed
                .map(|c| c.index)
        });
        if let Some(node) = cluster.node(leader) {
            node.raft
                .wait(Some(WAIT))
                .applied_index_at_least(committed, "the restarted node catches up")
                .await
                .map_err(raft_err)?;
        }
        out.catch_up.push(restarted_at.elapsed());
        term = elected_term;
    }
    tokio::time::sleep(STEADY).await;
    let last_term = cluster.nodes.iter().map(|n| n.term()).max().unwrap_or(0);
    out.spurious += last_term.saturating_sub(term);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in tasks {
        if let Ok(stats) = task.await {
            out.errors += stats.errors;
            out.acked += stats.hist.len();
        }
    }
    cluster.stop().await?;
    Ok(out)
}
