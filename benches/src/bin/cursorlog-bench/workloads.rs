//! The four workloads: setup (`prepare`) and one worker's loop (`work`).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::{pb, status_text, BoxError, Client, Rng, Worker, Workload};

/// A stream to drive: its session, epoch and id.
#[derive(Debug, Clone)]
pub struct Target {
    session: String,
    epoch: u64,
    stream: u64,
}

/// A workload after its setup, shared by its workers.
#[derive(Debug, Clone)]
pub enum Prepared {
    /// See [`Workload::Append`].
    Append {
        targets: Arc<Vec<Target>>,
        batch: usize,
        payload: Arc<Vec<u8>>,
        streaming: bool,
        params: Value,
    },
    /// See [`Workload::Resolve`].
    Resolve {
        targets: Arc<Vec<Target>>,
        events_per_stream: u64,
        params: Value,
    },
    /// See [`Workload::Replay`].
    Replay {
        target: Target,
        events: u64,
        read_batch: u32,
        follow: bool,
        params: Value,
    },
    /// See [`Workload::Mixed`].
    Mixed {
        sessions: Arc<Vec<(String, u64)>>,
        progress: usize,
        payload: Arc<Vec<u8>>,
        reconnect_pct: u32,
        params: Value,
    },
}

impl Prepared {
    /// The workload's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Append { .. } => "append",
            Self::Resolve { .. } => "resolve",
            Self::Replay { .. } => "replay",
            Self::Mixed { .. } => "mixed",
        }
    }

    /// The histogram that counts as one op.
    pub fn primary(&self) -> &'static str {
        match self {
            Self::Append { .. } => "append",
            Self::Resolve { .. } => "resolve",
            Self::Replay { .. } => "replay",
            Self::Mixed { .. } => "request",
        }
    }

    /// Its parameters.
    pub fn params(&self) -> Value {
        match self {
            Self::Append { params, .. }
            | Self::Resolve { params, .. }
            | Self::Replay { params, .. }
            | Self::Mixed { params, .. } => params.clone(),
        }
    }
}

/// A payload of `bytes` bytes that looks like a JSON-RPC progress notification.
pub(crate) fn payload(bytes: usize) -> Vec<u8> {
    // JSON-ish and not all one byte, like a real progress notification.
    let pattern =
        br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":42}}"#;
    pattern.iter().copied().cycle().take(bytes).collect()
}

/// A new event of `kind` without correlation.
pub(crate) fn event(kind: &str, payload: &[u8]) -> pb::NewEvent {
    pb::NewEvent {
        kind: kind.to_owned(),
        correlation: None,
        payload: payload.to_vec(),
    }
}

/// Opens (or finds) `session` and returns its epoch.
pub(crate) async fn open_session(client: &mut Client, session: &str) -> Result<u64, BoxError> {
    Ok(client
        .open_session(pb::OpenSessionRequest {
            session: session.to_owned(),
            state: None,
        })
        .await
        .map_err(|s| format!("OpenSession: {}", status_text(&s)))?
        .into_inner()
        .epoch)
}

/// Opens a lease-less stream in `session` and returns its id.
pub(crate) async fn open_stream(
    client: &mut Client,
    session: &str,
    epoch: u64,
    correlation: Option<String>,
) -> Result<u64, tonic::Status> {
    Ok(client
        .open_stream(pb::OpenStreamRequest {
            session: session.to_owned(),
            epoch,
            correlation,
            lease_ms: None,
        })
        .await?
        .into_inner()
        .stream)
}

/// Opens `sessions` sessions with `per_session` streams each (and appends `events` events
/// to each stream), spread over the connections.
async fn open_targets(
    clients: &[Client],
    prefix: &str,
    sessions: usize,
    per_session: usize,
    events: usize,
    payload_bytes: usize,
) -> Result<Vec<Target>, BoxError> {
    let body = Arc::new(payload(payload_bytes));
    let mut set = JoinSet::new();
    let mut out = Vec::with_capacity(sessions * per_session);
    for s in 0..sessions {
        let mut client = clients
            .get(s % clients.len().max(1))
            .ok_or("no connection")?
            .clone();
        let session = format!("{prefix}-s{s}");
        let body = Arc::clone(&body);
        set.spawn(async move {
            let epoch = open_session(&mut client, &session).await?;
            let mut targets = Vec::with_capacity(per_session);
            for _ in 0..per_session {
                let stream = open_stream(&mut client, &session, epoch, None)
                    .await
                    .map_err(|s| format!("OpenStream: {}", status_text(&s)))?;
                let mut left = events;
                while left > 0 {
                    let n = left.min(1000);
                    client
                        .append(pb::AppendRequest {
                            session: session.clone(),
                            stream,
                            expected_next_seq: None,
                            events: (0..n).map(|_| event("progress", &body)).collect(),
                        })
                        .await
                        .map_err(|s| format!("Append (setup): {}", status_text(&s)))?;
                    left -= n;
                }
                targets.push(Target {
                    session: session.clone(),
                    epoch,
                    stream,
                });
            }
            Ok::<_, BoxError>(targets)
        });
        // At most one setup task per connection at a time keeps setup latency sane.
        if set.len() >= clients.len() {
            if let Some(done) = set.join_next().await {
                out.extend(done??);
            }
        }
    }
    while let Some(done) = set.join_next().await {
        out.extend(done??);
    }
    Ok(out)
}

/// Runs the workload's setup.
pub async fn prepare(
    workload: &Workload,
    clients: &[Client],
    prefix: &str,
) -> Result<Prepared, BoxError> {
    match *workload {
        Workload::Append {
            producers,
            sessions,
            streams_per_session,
            batch,
            payload: bytes,
            streaming,
        } => {
            let targets = open_targets(
                clients,
                prefix,
                sessions.max(1),
                streams_per_session.max(1),
                0,
                0,
            )
            .await?;
            Ok(Prepared::Append {
                targets: Arc::new(targets),
                batch: batch.max(1),
                payload: Arc::new(payload(bytes)),
                streaming,
                params: json!({
                    "producers": producers, "sessions": sessions,
                    "streams_per_session": streams_per_session, "batch": batch,
                    "payload_bytes": bytes, "rpc": if streaming { "AppendStream" } else { "Append" },
                }),
            })
        }
        Workload::Resolve {
            clients: n,
            sessions,
            streams_per_session,
            events_per_stream,
        } => {
            let targets = open_targets(
                clients,
                prefix,
                sessions.max(1),
                streams_per_session.max(1),
                events_per_stream,
                512,
            )
            .await?;
            Ok(Prepared::Resolve {
                targets: Arc::new(targets),
                events_per_stream: events_per_stream as u64,
                params: json!({
                    "clients": n, "sessions": sessions,
                    "streams_per_session": streams_per_session,
                    "events_per_stream": events_per_stream,
                }),
            })
        }
        Workload::Replay {
            readers,
            events,
            payload: bytes,
            read_batch,
            follow,
        } => {
            let started = Instant::now();
            let mut targets = open_targets(&clients[..1], prefix, 1, 1, events, bytes).await?;
            let target = targets.pop().ok_or("no replay stream")?;
            eprintln!(
                "pre-filled stream {} with {events} events in {:.1} s",
                target.stream,
                started.elapsed().as_secs_f64()
            );
            Ok(Prepared::Replay {
                target,
                events: events as u64,
                read_batch,
                follow,
                params: json!({
                    "readers": readers, "events": events, "payload_bytes": bytes,
                    "read_batch": read_batch, "follow": follow,
                }),
            })
        }
        Workload::Soak(_)
        | Workload::Followers(_)
        | Workload::Stalled(_)
        | Workload::Replicated(_) => {
            Err("soak and followers have their own drivers, not a closed-loop setup".into())
        }
        Workload::Mixed {
            clients: n,
            progress,
            payload: bytes,
            reconnect_pct,
        } => {
            let mut set = JoinSet::new();
            for i in 0..n.max(1) {
                let mut client = clients
                    .get(i % clients.len().max(1))
                    .ok_or("no connection")?
                    .clone();
                let session = format!("{prefix}-mcp{i}");
                set.spawn(async move {
                    let epoch = open_session(&mut client, &session).await?;
                    Ok::<_, BoxError>((i, session, epoch))
                });
            }
            let mut sessions = Vec::new();
            while let Some(done) = set.join_next().await {
                sessions.push(done??);
            }
            sessions.sort_by_key(|(i, _, _)| *i);
            Ok(Prepared::Mixed {
                sessions: Arc::new(sessions.into_iter().map(|(_, s, e)| (s, e)).collect()),
                progress,
                payload: Arc::new(payload(bytes)),
                reconnect_pct,
                params: json!({
                    "clients": n, "progress_events": progress, "payload_bytes": bytes,
                    "reconnect_pct": reconnect_pct,
                }),
            })
        }
    }
}

/// The append loop over one `AppendStream` call: one request in flight at a time, like the
/// unary loop, so the two measure the same closed loop with a different RPC shape.
async fn append_streaming(
    t: &Target,
    batch: usize,
    payload: &[u8],
    mut client: Client,
    w: &mut Worker,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut answers = match client
        .append_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => {
            if let Some(op) = w.begin().await {
                w.finish(op, 0, Err(format!("AppendStream: {}", status_text(&s))));
            }
            return;
        }
    };
    while let Some(op) = w.begin().await {
        let request = pb::AppendRequest {
            session: t.session.clone(),
            stream: t.stream,
            expected_next_seq: None,
            events: (0..batch).map(|_| event("progress", payload)).collect(),
        };
        if tx.send(request).await.is_err() {
            w.finish(op, 0, Err("AppendStream: the call ended".into()));
            return;
        }
        let result = match answers.message().await {
            Ok(Some(pb::AppendResult {
                result: Some(pb::append_result::Result::Appended(r)),
            })) if r.event_ids.len() == batch => Ok(()),
            Ok(Some(pb::AppendResult {
                result: Some(pb::append_result::Result::Failure(f)),
            })) => Err(format!("AppendStream: code {}: {}", f.code, f.message)),
            Ok(other) => Err(format!("AppendStream: unexpected answer {other:?}")),
            Err(s) => Err(format!("AppendStream: {}", status_text(&s))),
        };
        let ended = result.is_err();
        w.finish(op, batch as u64, result);
        if ended {
            return;
        }
    }
}

/// One worker's loop; returns its counters.
pub async fn work(prepared: Prepared, index: usize, mut client: Client, mut w: Worker) -> Worker {
    let mut rng = Rng::new(index as u64 + 1);
    match prepared {
        Prepared::Append {
            targets,
            batch,
            payload,
            streaming: true,
            ..
        } => {
            let Some(t) = targets.get(index % targets.len().max(1)) else {
                return w;
            };
            append_streaming(t, batch, &payload, client, &mut w).await;
        }
        Prepared::Append {
            targets,
            batch,
            payload,
            streaming: false,
            ..
        } => {
            let Some(t) = targets.get(index % targets.len().max(1)) else {
                return w;
            };
            while let Some(op) = w.begin().await {
                let request = pb::AppendRequest {
                    session: t.session.clone(),
                    stream: t.stream,
                    expected_next_seq: None,
                    events: (0..batch).map(|_| event("progress", &payload)).collect(),
                };
                let result = client.append(request).await;
                let result = match result {
                    Ok(r) if r.get_ref().event_ids.len() == batch => Ok(()),
                    Ok(r) => Err(format!(
                        "Append returned {} ids for {batch} events",
                        r.get_ref().event_ids.len()
                    )),
                    Err(s) => Err(format!("Append: {}", status_text(&s))),
                };
                w.finish(op, batch as u64, result);
            }
        }
        Prepared::Resolve {
            targets,
            events_per_stream,
            ..
        } => {
            while let Some(op) = w.begin().await {
                let Some(t) = targets.get(rng.below(targets.len() as u64) as usize) else {
                    break;
                };
                let seq = rng.below(events_per_stream + 1);
                let request = pb::ResolveRequest {
                    session: t.session.clone(),
                    last_event_id: format!("{}-{}-{seq}", t.epoch, t.stream),
                    declared_stream: Some(t.stream),
                };
                let result = match client.resolve(request).await {
                    Ok(r) if r.get_ref().verdict == pb::Verdict::Resumable as i32 => Ok(()),
                    Ok(r) => Err(format!("Resolve: verdict {:?}", r.get_ref().verdict())),
                    Err(s) => Err(format!("Resolve: {}", status_text(&s))),
                };
                w.finish(op, 1, result);
            }
        }
        Prepared::Replay {
            target,
            events,
            read_batch,
            follow,
            ..
        } => {
            while let Some(op) = w.begin().await {
                let result =
                    replay_once(&mut client, &mut w, &target, events, read_batch, follow).await;
                w.finish(op, 0, result);
            }
        }
        Prepared::Mixed {
            sessions,
            progress,
            payload,
            reconnect_pct,
            ..
        } => {
            let Some((session, epoch)) = sessions.get(index) else {
                return w;
            };
            let mut n = 0_u64;
            while let Some(op) = w.begin().await {
                n += 1;
                let reconnect = rng.below(100) < u64::from(reconnect_pct);
                let result = mcp_request(
                    &mut client,
                    &mut w,
                    op,
                    session,
                    *epoch,
                    &format!("req-{index}-{n}"),
                    progress,
                    &payload,
                    reconnect,
                )
                .await;
                w.finish(op, progress as u64 + 1, result);
            }
        }
    }
    w
}

/// Reads the stream from its start until `events` events arrived (or the end message).
async fn replay_once(
    client: &mut Client,
    w: &mut Worker,
    t: &Target,
    events: u64,
    read_batch: u32,
    follow: bool,
) -> Result<(), String> {
    let request = pb::ReadRequest {
        session: t.session.clone(),
        last_event_id: format!("{}-{}-0", t.epoch, t.stream),
        declared_stream: Some(t.stream),
        follow,
        batch_events_max: read_batch,
        resume_own_stream: false,
    };
    let mut stream = client
        .read(request)
        .await
        .map_err(|s| format!("Read: {}", status_text(&s)))?
        .into_inner();
    let mut next = 1_u64;
    loop {
        if !w.in_window() {
            // Cut by the end of the window: not counted as an op (its events up to here are).
            return Ok(());
        }
        let Some(msg) = stream
            .message()
            .await
            .map_err(|s| format!("Read stream: {}", status_text(&s)))?
        else {
            break;
        };
        match msg.item {
            Some(pb::read_response::Item::Resolution(r)) => {
                if r.verdict != pb::Verdict::Resumable as i32 {
                    return Err(format!("Read: verdict {:?}", r.verdict()));
                }
            }
            Some(pb::read_response::Item::Events(batch)) => {
                let n = batch.events.len() as u64;
                if batch.events.first().map(|e| e.seq) != Some(next) {
                    return Err(format!("Read: gap, expected seq {next}"));
                }
                next += n;
                w.add_events(n);
                if follow && next > events {
                    break; // caught up: drop the follow call
                }
            }
            Some(pb::read_response::Item::Gap(g)) => {
                return Err(format!(
                    "Read: evicted gap {}..={}",
                    g.first_seq, g.last_seq
                ));
            }
            Some(pb::read_response::Item::End(_)) | None => break,
        }
    }
    if next == events + 1 {
        Ok(())
    } else {
        Err(format!("Read delivered {} of {events} events", next - 1))
    }
}

/// One MCP request: OpenStream, `progress` Appends of one event, maybe a reconnect (Resolve of
/// the first event's id with the stream declared, then Read of the rest), Complete.
#[allow(clippy::too_many_arguments)]
async fn mcp_request(
    client: &mut Client,
    w: &mut Worker,
    op: crate::Op,
    session: &str,
    epoch: u64,
    correlation: &str,
    progress: usize,
    payload: &[u8],
    reconnect: bool,
) -> Result<(), String> {
    let t = Instant::now();
    let stream = open_stream(client, session, epoch, Some(correlation.to_owned()))
        .await
        .map_err(|s| format!("OpenStream: {}", status_text(&s)))?;
    w.record(op, "open_stream", t.elapsed());
    for _ in 0..progress {
        let t = Instant::now();
        client
            .append(pb::AppendRequest {
                session: session.to_owned(),
                stream,
                expected_next_seq: None,
                events: vec![event("progress", payload)],
            })
            .await
            .map_err(|s| format!("Append: {}", status_text(&s)))?;
        w.record(op, "append", t.elapsed());
    }
    if reconnect && progress >= 1 {
        let cursor = format!("{epoch}-{stream}-1");
        let t = Instant::now();
        let r = client
            .resolve(pb::ResolveRequest {
                session: session.to_owned(),
                last_event_id: cursor.clone(),
                declared_stream: Some(stream),
            })
            .await
            .map_err(|s| format!("Resolve: {}", status_text(&s)))?
            .into_inner();
        w.record(op, "resolve", t.elapsed());
        if r.verdict != pb::Verdict::Resumable as i32 {
            return Err(format!("Resolve on reconnect: verdict {:?}", r.verdict()));
        }
        let t = Instant::now();
        let mut stream_in = client
            .read(pb::ReadRequest {
                session: session.to_owned(),
                last_event_id: cursor,
                declared_stream: Some(stream),
                follow: false,
                batch_events_max: 0,
                resume_own_stream: false,
            })
            .await
            .map_err(|s| format!("Read: {}", status_text(&s)))?
            .into_inner();
        let mut got = 0;
        while let Some(msg) = stream_in
            .message()
            .await
            .map_err(|s| format!("Read stream: {}", status_text(&s)))?
        {
            if let Some(pb::read_response::Item::Events(b)) = msg.item {
                got += b.events.len();
            }
        }
        w.record(op, "read", t.elapsed());
        if got != progress - 1 {
            return Err(format!(
                "reconnect replay: {got} events, expected {}",
                progress - 1
            ));
        }
    }
    let t = Instant::now();
    client
        .complete(pb::CompleteRequest {
            session: session.to_owned(),
            stream,
            expected_next_seq: None,
            terminal: Some(event("result", payload)),
        })
        .await
        .map_err(|s| format!("Complete: {}", status_text(&s)))?;
    w.record(op, "complete", t.elapsed());
    Ok(())
}
