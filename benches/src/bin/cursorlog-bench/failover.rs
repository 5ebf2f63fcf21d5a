//! The failover and catch-up parts of `cursorlog-bench replicated` (issue 19 item 8).
//!
//! - [`failover`]: a 3-member cluster under a light write load (one writer, unary `Append`
//!   at `--failover-rate`); the leader is SIGKILLed `--kills` times; each time the time from
//!   the kill to the first write acknowledged by a surviving member is recorded; the killed
//!   member is restarted on its directory and the next kill waits until it follows the new
//!   leader (its write answer names that leader), so every kill leaves a quorum.
//! - [`catchup`]: `--catchup-mib` MiB of payload are written; both followers are stopped
//!   (SIGTERM), one is wiped and restarted. With the other follower down, the leader can
//!   acknowledge a write only once the wiped member has stored the whole log up to that
//!   write, so the time from the restart to the first acknowledged write is the catch-up time
//!   (the replication lag is not exposed yet; this criterion needs none).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tonic::Code;

use crate::cluster::{Cluster, MEMBERS};
use crate::replicated::ReplicatedArgs;
use crate::workloads::{event, open_session, open_stream, payload};
use crate::{pb, secs, status_text, BoxError, Cli, Client};

/// The bound of every wait for a leader or a rejoin.
const WAIT: Duration = Duration::from_secs(120);

/// The `p` quantile (nearest rank) of `times` in milliseconds; NaN when empty.
pub fn quantile_ms(times: &[Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = times.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// One unary `Append` of `n` events to `stream` (no expected seq), bounded by `timeout`.
async fn append(
    mut client: Client,
    session: &str,
    stream: u64,
    n: usize,
    body: &[u8],
    timeout: Duration,
) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(pb::AppendRequest {
        session: session.to_owned(),
        stream,
        expected_next_seq: None,
        events: (0..n).map(|_| event("progress", body)).collect(),
    });
    request.set_timeout(timeout);
    client.append(request).await.map(drop)
}

/// The writer of the light load: its stream and pace.
struct Writer {
    session: String,
    stream: u64,
    body: Vec<u8>,
    interval: Duration,
    errors: u64,
}

impl Writer {
    /// Writes at the pace to `leader` for `d`; a failed write re-finds the leader.
    async fn load(
        &mut self,
        cluster: &Cluster,
        leader: &mut usize,
        d: Duration,
    ) -> Result<(), BoxError> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            let next = Instant::now() + self.interval;
            let r = append(
                cluster.client(*leader),
                &self.session,
                self.stream,
                1,
                &self.body,
                Duration::from_secs(5),
            )
            .await;
            if r.is_err() {
                self.errors += 1;
                *leader = cluster.leader(&self.session, WAIT).await?;
            }
            tokio::time::sleep_until(next.into()).await;
        }
        Ok(())
    }
}

/// Runs the failover part with `timing` flags; returns the kill → first-ack times.
pub async fn failover(
    cli: &Cli,
    args: &ReplicatedArgs,
    bin: &Path,
    timing: &[String],
) -> Result<Vec<Duration>, BoxError> {
    let mut extra = cli.server_args.clone();
    extra.extend(timing.iter().cloned());
    let mut cluster = Cluster::start(bin, &cli.sync, &extra)?;
    let session = "failover".to_owned();
    let mut leader = cluster.leader(&session, WAIT).await?;
    let mut c = cluster.client(leader);
    let epoch = open_session(&mut c, &session).await?;
    let stream = open_stream(&mut c, &session, epoch, None)
        .await
        .map_err(|s| format!("OpenStream: {}", status_text(&s)))?;
    let mut w = Writer {
        session,
        stream,
        body: payload(args.payload),
        interval: secs(1.0 / args.failover_rate.max(0.1), "--failover-rate")?,
        errors: 0,
    };
    let mut times = Vec::with_capacity(args.kills);
    for k in 0..args.kills {
        w.load(&cluster, &mut leader, Duration::from_millis(500))
            .await?;
        let killed = leader;
        let t0 = Instant::now();
        cluster.kill(killed);
        // Every surviving member in turn, as a client that knows all addresses would.
        let (new_leader, took) = 'found: loop {
            for i in (0..MEMBERS).filter(|i| cluster.is_up(*i)) {
                let r = append(
                    cluster.client(i),
                    &w.session,
                    w.stream,
                    1,
                    &w.body,
                    Duration::from_secs(5),
                )
                .await;
                if r.is_ok() {
                    break 'found (i, t0.elapsed());
                }
            }
            if t0.elapsed() > WAIT {
                return Err(format!("no write acknowledged within {WAIT:?} of kill {k}").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        eprintln!(
            "kill {}: member {} → member {} acknowledged after {:.0} ms",
            k + 1,
            killed + 1,
            new_leader + 1,
            took.as_secs_f64() * 1000.0
        );
        times.push(took);
        leader = new_leader;
        cluster.start_node(killed)?;
        // Under the load, until the restarted member names the leader (or is it).
        let deadline = Instant::now() + WAIT;
        loop {
            w.load(&cluster, &mut leader, Duration::from_millis(100))
                .await?;
            let r = append(
                cluster.client(killed),
                &w.session,
                w.stream,
                1,
                &w.body,
                Duration::from_secs(5),
            )
            .await;
            match r {
                Ok(()) => {
                    leader = killed;
                    break;
                }
                Err(s) if s.code() == Code::Unavailable => {
                    if cluster.hinted(&s).is_some_and(|h| h != killed) {
                        break;
                    }
                }
                Err(s) => return Err(format!("restarted member: {}", status_text(&s)).into()),
            }
            if Instant::now() > deadline {
                return Err(format!("member {} did not rejoin within {WAIT:?}", killed + 1).into());
            }
        }
    }
    if w.errors > 0 {
        eprintln!(
            "note: {} light-load writes failed around the kills",
            w.errors
        );
    }
    Ok(times)
}

/// Runs the catch-up part and prints its line.
pub async fn catchup(cli: &Cli, args: &ReplicatedArgs, bin: &Path) -> Result<(), BoxError> {
    const WRITERS: usize = 8;
    const EVENT_BYTES: usize = 4096;
    const BATCH: usize = 64;
    let mut extra = cli.server_args.clone();
    extra.extend(args.fast_timing());
    let mut cluster = Cluster::start(bin, &cli.sync, &extra)?;
    let leader = cluster.leader("catchup", WAIT).await?;
    let body = Arc::new(payload(EVENT_BYTES));
    let request_bytes = (EVENT_BYTES * BATCH) as u64;
    let requests = (args.catchup_mib * 1024 * 1024)
        .div_ceil(request_bytes)
        .max(1);
    let fill_started = Instant::now();
    let mut set = JoinSet::new();
    let mut targets = Vec::new();
    for wi in 0..WRITERS as u64 {
        let mut c = cluster.client(leader);
        let session = format!("catchup-{wi}");
        let epoch = open_session(&mut c, &session).await?;
        let stream = open_stream(&mut c, &session, epoch, None)
            .await
            .map_err(|s| format!("OpenStream: {}", status_text(&s)))?;
        targets.push((session.clone(), stream));
        let n = requests / WRITERS as u64 + u64::from(wi < requests % WRITERS as u64);
        let body = Arc::clone(&body);
        set.spawn(async move {
            for _ in 0..n {
                append(
                    c.clone(),
                    &session,
                    stream,
                    BATCH,
                    &body,
                    Duration::from_secs(600),
                )
                .await
                .map_err(|s| format!("fill Append: {}", status_text(&s)))?;
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let fill = fill_started.elapsed();
    let written_mib = (requests * request_bytes) as f64 / (1024.0 * 1024.0);
    let leader_bytes = cluster.data_bytes(leader);
    let followers: Vec<usize> = (0..MEMBERS).filter(|i| *i != leader).collect();
    // Never wipe member 1: an empty member 1 forms a new cluster on start.
    let (other, wiped) = (followers[0], followers[1]);
    cluster.stop(other);
    cluster.stop(wiped);
    cluster.wipe(wiped)?;
    let t0 = Instant::now();
    cluster.start_node(wiped)?;
    let (session, stream) = targets.first().cloned().ok_or("no fill stream")?;
    let limit = Duration::from_secs(args.catchup_timeout_secs);
    let mut last = String::new();
    'acked: loop {
        for i in [leader, wiped] {
            let left = limit
                .saturating_sub(t0.elapsed())
                .max(Duration::from_secs(1));
            match append(cluster.client(i), &session, stream, 1, &body, left).await {
                Ok(()) => break 'acked,
                Err(s) => last = format!("member {}: {}", i + 1, status_text(&s)),
            }
        }
        if t0.elapsed() > limit {
            cluster.keep();
            return Err(format!(
                "no write acknowledged within {limit:?} of the wiped member's restart \
                 (--catchup-timeout-secs); last answer: {last}; logs in {}",
                cluster.root().display()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed().as_secs_f64();
    let gib = leader_bytes as f64 / (1024.0 * 1024.0 * 1024.0);
    println!("\ncatch-up of a wiped follower (fast timing; criterion: restart of the wiped member → first write acknowledged while the other follower is down)");
    println!(
        "filled {written_mib:.0} MiB payload in {:.1} s ({:.1} MiB/s replicated); leader data dir {:.0} MiB; wiped member {} back to {:.0} MiB",
        fill.as_secs_f64(),
        written_mib / fill.as_secs_f64(),
        leader_bytes as f64 / (1024.0 * 1024.0),
        wiped + 1,
        cluster.data_bytes(wiped) as f64 / (1024.0 * 1024.0),
    );
    println!(
        "caught up in {took:.2} s = {:.1} s/GiB of the leader's data dir ({:.1} MiB/s)",
        took / gib,
        leader_bytes as f64 / (1024.0 * 1024.0) / took
    );
    Ok(())
}
