//! `cursorlog-bench stalled`: what follow calls whose clients stopped reading cost the server
//! (issue 31 item 4). `--followers` follow calls over `--connections` connections, spread over
//! `--streams` streams, each read its resolution and then stop reading while holding the call
//! open; then `--append-mib` MiB of events go to those streams. The server's anonymous memory
//! (`RssAnon`: its heap, not the page cache or the kernel's socket buffers) is read before the
//! followers, once they are open, and once it settles after the appends; the report is what
//! the stalled followers added, in all and per follower. With `--max-mib` it exits 2 when they
//! added more. Needs the server's pid (`--spawn` or `--server-pid`).

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use tokio::task::JoinSet;
use tonic::codec::Streaming;

use crate::workloads::{open_session, open_stream};
use crate::{connect, pb, probe, status_text, BoxError, Cli, Client};

/// The measurement's options.
#[derive(Debug, Clone, Args)]
pub struct StalledArgs {
    /// Follow calls that stop reading.
    #[arg(long, default_value_t = 400)]
    pub followers: usize,
    /// Connections the follow calls are spread over.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Streams they follow (follower i follows stream i mod streams).
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// MiB of event payload appended to those streams in all.
    #[arg(long, default_value_t = 40)]
    pub append_mib: u64,
    /// Payload bytes per event.
    #[arg(long, default_value_t = 512)]
    pub payload: usize,
    /// Events per Append request.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Exit with status 2 when the followers added more than this many MiB.
    #[arg(long)]
    pub max_mib: Option<f64>,
}

const MIB: f64 = 1024.0 * 1024.0;

/// Follow calls that read their resolution and then nothing: each is kept, unpolled, until
/// dropped.
async fn open_stalled(
    clients: &[Client],
    targets: &[(String, u64, u64)],
    n: usize,
) -> Result<Vec<Streaming<pb::ReadResponse>>, BoxError> {
    let mut set = JoinSet::new();
    for i in 0..n {
        let mut client = clients[i % clients.len()].clone();
        let (session, epoch, stream) = targets[i % targets.len()].clone();
        set.spawn(async move {
            let mut call = client
                .read(pb::ReadRequest {
                    session,
                    last_event_id: format!("{epoch}-{stream}-0"),
                    declared_stream: Some(stream),
                    follow: true,
                    batch_events_max: 0,
                    resume_own_stream: false,
                })
                .await
                .map_err(|s| format!("Read(follow): {}", status_text(&s)))?
                .into_inner();
            match call.message().await {
                Ok(Some(pb::ReadResponse {
                    item: Some(pb::read_response::Item::Resolution(r)),
                })) if r.verdict() == pb::Verdict::Resumable => Ok::<_, BoxError>(call),
                other => Err(format!("Read(follow): expected a resolution, got {other:?}").into()),
            }
        });
    }
    let mut calls = Vec::with_capacity(n);
    while let Some(joined) = set.join_next().await {
        calls.push(joined??);
    }
    Ok(calls)
}

/// Appends `events` events of `payload` bytes over the streams, `batch` per request, one
/// producer per stream.
async fn append(
    clients: &[Client],
    targets: &[(String, u64, u64)],
    events: u64,
    payload: usize,
    batch: usize,
) -> Result<(), BoxError> {
    let per_stream = events.div_ceil(targets.len() as u64);
    let mut set = JoinSet::new();
    for (i, (session, _, stream)) in targets.iter().enumerate() {
        let mut client = clients[i % clients.len()].clone();
        let (session, stream) = (session.clone(), *stream);
        set.spawn(async move {
            let mut left = per_stream;
            while left > 0 {
                let n = left.min(batch as u64);
                let request = pb::AppendRequest {
                    session: session.clone(),
                    stream,
                    expected_next_seq: None,
                    events: (0..n)
                        .map(|_| pb::NewEvent {
                            kind: "progress".into(),
                            correlation: None,
                            payload: vec![b'x'; payload],
                        })
                        .collect(),
                };
                client
                    .append(request)
                    .await
                    .map_err(|s| format!("Append: {}", status_text(&s)))?;
                left -= n;
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(joined) = set.join_next().await {
        joined??;
    }
    Ok(())
}

/// The server's `RssAnon` once it stops moving: sampled every 200 ms until two samples a
/// second apart differ by less than 1 %, or `limit` passed.
async fn settled_anon(pid: u32, limit: Duration) -> Result<u64, BoxError> {
    let until = Instant::now() + limit;
    let mut samples = vec![probe::rss_anon_bytes(pid)?];
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        samples.push(probe::rss_anon_bytes(pid)?);
        if samples.len() > 5 {
            let (a, b) = (samples[samples.len() - 6], samples[samples.len() - 1]);
            if a.abs_diff(b) * 100 < a.max(1) || Instant::now() >= until {
                return Ok(b);
            }
        }
    }
}

/// Runs the measurement; `Ok(false)` when the followers added more than `--max-mib`.
pub async fn run(
    cli: &Cli,
    args: &StalledArgs,
    addr: &str,
    server_pid: Option<u32>,
) -> Result<bool, BoxError> {
    let pid = server_pid.ok_or("stalled needs the server's pid: use --spawn or --server-pid")?;
    if args.followers == 0 || args.streams == 0 || args.connections == 0 || args.batch == 0 {
        return Err("--followers, --streams, --connections and --batch must be at least 1".into());
    }
    let rpc_timeout = Duration::from_secs(60);
    let producers = connect(addr, args.streams.min(8), rpc_timeout).await?;
    let follower_clients = connect(addr, args.connections, rpc_timeout).await?;
    let run_id = std::process::id();
    let mut targets = Vec::with_capacity(args.streams);
    for i in 0..args.streams {
        let mut client = producers[i % producers.len()].clone();
        let session = format!("stalled-{run_id}-{i}");
        let epoch = open_session(&mut client, &session).await?;
        let stream = open_stream(&mut client, &session, epoch, None)
            .await
            .map_err(|s| format!("OpenStream: {}", status_text(&s)))?;
        targets.push((session, epoch, stream));
    }
    let before = settled_anon(pid, Duration::from_secs(5)).await?;
    let calls = open_stalled(&follower_clients, &targets, args.followers).await?;
    let opened = settled_anon(pid, Duration::from_secs(5)).await?;
    let events = args.append_mib * 1024 * 1024 / args.payload.max(1) as u64;
    if !cli.quiet {
        eprintln!(
            "stalled: {} follow calls open on {} streams; appending {} MiB ({events} events)",
            calls.len(),
            targets.len(),
            args.append_mib
        );
    }
    let t = Instant::now();
    append(&producers, &targets, events, args.payload, args.batch).await?;
    let appended_in = t.elapsed();
    let after = settled_anon(pid, Duration::from_secs(10)).await?;
    drop(calls);
    let released = settled_anon(pid, Duration::from_secs(5)).await?;
    let added = after.saturating_sub(opened) as f64 / MIB;
    let per_follower_kib = added * 1024.0 / args.followers as f64;
    println!(
        "stalled followers: {} on {} streams over {} connections, {} MiB appended in {:.1} s",
        args.followers,
        args.streams,
        args.connections,
        args.append_mib,
        appended_in.as_secs_f64()
    );
    println!(
        "server RssAnon: {:.1} MiB before, {:.1} with the followers open, {:.1} after the appends \
         (+{added:.1} MiB, {per_follower_kib:.0} KiB per follower), {:.1} once they were dropped",
        before as f64 / MIB,
        opened as f64 / MIB,
        after as f64 / MIB,
        released as f64 / MIB
    );
    if let Some(path) = &cli.json {
        let report = json!({
            "followers": args.followers,
            "streams": args.streams,
            "connections": args.connections,
            "append_mib": args.append_mib,
            "anon_mib": {
                "before": before as f64 / MIB,
                "followers_open": opened as f64 / MIB,
                "after_appends": after as f64 / MIB,
                "after_drop": released as f64 / MIB,
            },
            "added_mib": added,
            "per_follower_kib": per_follower_kib,
        });
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(args.max_mib.is_none_or(|max| added <= max))
}
