//! The appender: funnels the appends and completions of every session this replica serves
//! into shared `AppendBatch` calls (Kafka-producer style), each caller still awaiting its own
//! durable event id.
//!
//! No timer, no linger: a write that finds a free call slot is sent at once, alone, so an
//! idle replica pays exactly one round trip per event. While `max_in_flight` calls are
//! outstanding, new writes queue, and the next free slot takes everything queued (up to
//! `max_items` items or `max_bytes` payload bytes) in one call. The busier the replica, the
//! larger the batches; cursorlog group-commits each call's items with one fsync.
//!
//! Every append and completion carries `expected_next_seq`, so a call that failed in transit
//! (the answer was lost, not refused) is retried: items already written answer
//! `duplicate = true` with their original ids, the rest are written once. A stream open
//! (`open` item) has no such key: a retry could open a second stream, so the opens of a call
//! that failed in transit fail at once and only its other items are retried (the session's
//! store then reconciles the open by its correlation). Items a member refused because it is
//! not the leader (nothing proposed) are all resent, to the leader it names; see
//! [`crate::failover`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cursorlog_proto::v1 as pb;
use pb::batch_item::Item;
use pb::batch_result::Result as BatchOutcome;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tonic::Code;

use crate::error::{Error, Result};
use crate::failover::{item_refusal, refusal, Attempts, Next, Op};
use crate::Client;

/// How the appender batches; see the module docs.
#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// Most `AppendBatch` calls outstanding at once (at least 1). One call per round trip
    /// already batches everything that arrives during the round trip; a few more keep the
    /// connection busy while cursorlog syncs.
    pub max_in_flight: usize,
    /// Most items in one call (cursorlog accepts up to 4096).
    pub max_items: usize,
    /// Most payload bytes in one call, well below cursorlog's gRPC message limit (16 MiB by
    /// default). A single larger write still goes out, alone.
    pub max_bytes: usize,
    /// How often a call that failed in transit (`UNAVAILABLE`, `UNKNOWN`) is retried at least
    /// before its writes fail (a cluster connection keeps retrying until its
    /// [`crate::Failover::deadline`]).
    pub retries: u32,
    /// Open each request stream as an `open` item of the shared `AppendBatch` (one durable
    /// write shared with every session's appends) rather than with its own unary
    /// `OpenStream` call. On by default; off measures the difference (rmcp_load
    /// `--unary-open-side`).
    pub open_in_batch: bool,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 4,
            max_items: 1024,
            max_bytes: 4 << 20,
            retries: 3,
            open_in_batch: true,
        }
    }
}

/// One write: a new stream, an append to a stream, or its completion.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    Open(pb::OpenStreamRequest),
    Append(pb::AppendRequest),
    Complete(pb::CompleteRequest),
}

impl Write {
    fn payload_bytes(&self) -> usize {
        match self {
            Self::Open(_) => 0,
            Self::Append(a) => a.events.iter().map(|e| e.payload.len()).sum(),
            Self::Complete(c) => c.terminal.as_ref().map_or(0, |t| t.payload.len()),
        }
    }

    /// How a resend of this write is judged (see [`crate::failover`]).
    fn kind(&self) -> Op {
        match self {
            Self::Open(_) => Op::Open,
            Self::Append(a) => Op::Keyed(a.expected_next_seq.is_some()),
            Self::Complete(c) => Op::Keyed(c.expected_next_seq.is_some()),
        }
    }

    fn op(&self) -> &'static str {
        match self {
            Self::Open(_) => "OpenStream",
            Self::Append(_) => "Append",
            Self::Complete(_) => "Complete",
        }
    }

    fn item(&self) -> pb::BatchItem {
        let item = match self {
            Self::Open(o) => Item::Open(o.clone()),
            Self::Append(a) => Item::Append(a.clone()),
            Self::Complete(c) => Item::Complete(c.clone()),
        };
        pb::BatchItem { item: Some(item) }
    }
}

/// What cursorlog answered to one write.
#[derive(Debug)]
pub(crate) enum Written {
    Opened(pb::OpenStreamResponse),
    Appended(pb::AppendResponse),
    Completed(pb::TerminateResponse),
}

struct Job {
    write: Write,
    reply: oneshot::Sender<Result<Written>>,
}

/// Counters of the appender since it started: how well writes are being coalesced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppendStats {
    /// `AppendBatch` calls sent (retries not counted).
    pub calls: u64,
    /// Writes (appends and completions) sent in them.
    pub items: u64,
    /// Calls retried after failing in transit.
    pub retries: u64,
}

#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU64,
    items: AtomicU64,
    retries: AtomicU64,
}

/// The shared batching writer; see the module docs. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Appender {
    tx: mpsc::UnboundedSender<Job>,
    counters: Arc<Counters>,
}

impl Appender {
    /// Starts the batching task on the current tokio runtime.
    pub(crate) fn spawn(client: Client, config: BatchConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        tokio::spawn(run(client, config, rx, counters.clone()));
        Self { tx, counters }
    }

    /// Writes `write` in the next batch and returns cursorlog's answer to it, once durable.
    pub(crate) async fn write(&self, write: Write) -> Result<Written> {
        let (reply, answer) = oneshot::channel();
        let op = write.op();
        self.tx
            .send(Job { write, reply })
            .map_err(|_| Error::Protocol(format!("{op}: the batching task has stopped")))?;
        answer
            .await
            .map_err(|_| Error::Protocol(format!("{op}: the batching task dropped the write")))?
    }

    /// Calls and items so far.
    pub(crate) fn stats(&self) -> AppendStats {
        AppendStats {
            calls: self.counters.calls.load(Ordering::Relaxed),
            items: self.counters.items.load(Ordering::Relaxed),
            retries: self.counters.retries.load(Ordering::Relaxed),
        }
    }
}

async fn run(
    client: Client,
    config: BatchConfig,
    mut rx: mpsc::UnboundedReceiver<Job>,
    counters: Arc<Counters>,
) {
    let slots = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let max_items = config.max_items.clamp(1, 4096);
    let mut carry: Option<Job> = None;
    loop {
        // A free slot first: while every slot is busy, writes queue up for the next batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match carry.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return, // Every Appender handle is gone.
            },
        };
        let mut bytes = first.write.payload_bytes();
        let mut jobs = vec![first];
        while jobs.len() < max_items {
            let Ok(job) = rx.try_recv() else { break };
            let more = job.write.payload_bytes();
            if bytes + more > config.max_bytes {
                carry = Some(job);
                break;
            }
            bytes += more;
            jobs.push(job);
        }
        counters.calls.fetch_add(1, Ordering::Relaxed);
        counters
            .items
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        tokio::spawn(send(
            client.clone(),
            jobs,
            config.retries,
            counters.clone(),
            slot,
        ));
    }
}

async fn send(
    conn: Client,
    mut jobs: Vec<Job>,
    retries: u32,
    counters: Arc<Counters>,
    _slot: OwnedSemaphorePermit,
) {
    let mut attempts = Attempts::new(Instant::now());
    let mut attempt = 0;
    loop {
        let (member, mut client) = conn.current();
        let request = pb::AppendBatchRequest {
            items: jobs.iter().map(|j| j.write.item()).collect(),
        };
        // The writes to send again, each with the error it fails with if they are not.
        let mut again: Vec<(Job, Error)> = Vec::new();
        let mut leader = None;
        match client.append_batch(request).await {
            Ok(r) => {
                let results = r.into_inner().results;
                if results.len() != jobs.len() {
                    let n = jobs.len();
                    for job in jobs {
                        let _ = job.reply.send(Err(Error::Protocol(format!(
                            "AppendBatch answered {} results for {n} items",
                            results.len()
                        ))));
                    }
                    return;
                }
                for (job, result) in jobs.into_iter().zip(results) {
                    let refused = match &result.result {
                        Some(BatchOutcome::Failure(f)) => item_refusal(f),
                        _ => None,
                    };
                    let op = job.write.op();
                    match refused {
                        Some(r) if job.write.kind().may_retry(r.retry) => {
                            leader = leader.or(r.leader);
                            again.push((
                                job,
                                outcome(op, result).err().unwrap_or_else(|| {
                                    Error::Protocol("a refused item without its failure".into())
                                }),
                            ));
                        }
                        _ => {
                            let _ = job.reply.send(outcome(op, result));
                        }
                    }
                }
            }
            Err(status) => {
                let refused = refusal(&status);
                for job in jobs {
                    let error = Error::Rpc {
                        op: job.write.op(),
                        status: status.clone(),
                    };
                    match &refused {
                        // Opens whose outcome is unknown fail now (a resend could open a
                        // second stream); the rest is resent.
                        Some(r) if job.write.kind().may_retry(r.retry) => again.push((job, error)),
                        _ => {
                            let _ = job.reply.send(Err(error));
                        }
                    }
                }
                leader = refused.and_then(|r| r.leader);
            }
        }
        if again.is_empty() {
            return;
        }
        let next = attempts.next(
            conn.policy(),
            leader.as_deref(),
            &member,
            Instant::now(),
            attempt < retries,
        );
        if next == Next::GiveUp {
            for (job, error) in again {
                let _ = job.reply.send(Err(error));
            }
            return;
        }
        attempt += 1;
        counters.retries.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(attempt, member, ?next, error = %again[0].1, "cursorlog: AppendBatch refused or failed in transit; retrying");
        conn.step(&member, &next).await;
        jobs = again.into_iter().map(|(job, _)| job).collect();
    }
}

fn outcome(op: &'static str, result: pb::BatchResult) -> Result<Written> {
    match result.result {
        Some(BatchOutcome::Opened(o)) if op == "OpenStream" => Ok(Written::Opened(o)),
        Some(BatchOutcome::Appended(a)) if op == "Append" => Ok(Written::Appended(a)),
        Some(BatchOutcome::Completed(c)) if op == "Complete" => Ok(Written::Completed(c)),
        Some(BatchOutcome::Failure(f)) => Err(Error::Rpc {
            op,
            status: tonic::Status::new(Code::from_i32(f.code), f.message),
        }),
        other => Err(Error::Protocol(format!(
            "AppendBatch answered {other:?} to an {op}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::fake::{self, Fake};

    fn append(stream: u64, seq: u64) -> Write {
        Write::Append(pb::AppendRequest {
            session: "s".into(),
            stream,
            expected_next_seq: Some(seq),
            events: vec![pb::NewEvent {
                kind: "notification".into(),
                correlation: None,
                payload: b"{}".to_vec(),
            }],
        })
    }

    fn config(retries: u32) -> BatchConfig {
        BatchConfig {
            retries,
            ..BatchConfig::default()
        }
    }

    #[tokio::test]
    async fn a_batch_that_failed_in_transit_is_retried_and_each_write_gets_its_answer() {
        let fake = Arc::new(Fake::default());
        fake.batch_failures.store(2, Ordering::SeqCst);
        let appender = Appender::spawn(fake::start(fake.clone()).await, config(3));
        let Written::Appended(a) = appender.write(append(7, 3)).await.unwrap() else {
            panic!("an append is answered as one")
        };
        assert_eq!(a.event_ids, ["1-7-3"]);
        assert_eq!(fake.batch_calls.load(Ordering::SeqCst), 3);
        assert_eq!(appender.stats().retries, 2);
        assert_eq!((appender.stats().calls, appender.stats().items), (1, 1));
    }

    #[tokio::test]
    async fn after_the_retries_a_write_fails_with_the_calls_status() {
        let fake = Arc::new(Fake::default());
        fake.batch_failures.store(10, Ordering::SeqCst);
        let appender = Appender::spawn(fake::start(fake.clone()).await, config(2));
        let err = appender.write(append(7, 1)).await.unwrap_err();
        assert!(
            matches!(&err, Error::Rpc { op: "Append", status } if status.code() == Code::Unavailable),
            "{err}"
        );
        assert_eq!(
            fake.batch_calls.load(Ordering::SeqCst),
            3,
            "1 call + 2 retries"
        );
    }

    fn open() -> Write {
        Write::Open(pb::OpenStreamRequest {
            session: "s".into(),
            epoch: 1,
            correlation: Some("r1".into()),
            lease_ms: None,
        })
    }

    #[tokio::test]
    async fn an_open_travels_in_the_batch_and_is_answered_with_its_stream() {
        let fake = Arc::new(Fake::default());
        let appender = Appender::spawn(fake::start(fake.clone()).await, config(3));
        let Written::Opened(o) = appender.write(open()).await.unwrap() else {
            panic!("an open is answered as one")
        };
        assert_eq!((o.stream, o.epoch), (100, 1));
        assert_eq!(fake.batch_calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_open_in_a_call_that_failed_in_transit_fails_and_only_the_rest_is_retried() {
        let fake = Arc::new(Fake::default());
        fake.batch_failures.store(1, Ordering::SeqCst);
        // The test runtime has one thread: both writes are queued before the batching task
        // first runs, so they leave in one call.
        let appender = Appender::spawn(
            fake::start(fake.clone()).await,
            BatchConfig {
                max_in_flight: 1,
                ..config(3)
            },
        );
        let (opened, appended) = tokio::join!(appender.write(open()), appender.write(append(8, 1)));
        let err = opened.unwrap_err();
        assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
        assert!(matches!(appended.unwrap(), Written::Appended(a) if a.stream == 8));
        assert_eq!(
            fake.opens.load(Ordering::SeqCst),
            0,
            "a retried open could open a second stream: it is never retried"
        );
        assert_eq!(fake.batch_calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn writes_a_follower_refuses_go_to_the_leader_it_names_opens_included() {
        let (follower, leader) = (Arc::new(Fake::default()), Arc::new(Fake::default()));
        let leader_addr = fake::serve(leader.clone()).await;
        *follower.leader_is.lock().unwrap() = Some(leader_addr.to_string());
        let follower_addr = fake::serve(follower.clone()).await;
        let conn = Client::to_members(
            &[format!("http://{follower_addr}")],
            None,
            crate::BearerToken::default(),
            crate::Failover::default(),
        );
        let appender = Appender::spawn(
            conn,
            BatchConfig {
                max_in_flight: 1,
                ..config(0)
            },
        );
        let (opened, appended) = tokio::join!(appender.write(open()), appender.write(append(8, 1)));
        assert!(matches!(opened.unwrap(), Written::Opened(o) if o.stream == 100));
        assert!(matches!(appended.unwrap(), Written::Appended(a) if a.stream == 8));
        assert_eq!(follower.batch_calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            leader.opens.load(Ordering::SeqCst),
            1,
            "nothing was proposed on the follower: the open is resent, once"
        );
        // Later writes go straight to the leader.
        appender.write(append(8, 2)).await.unwrap();
        assert_eq!(follower.batch_calls.load(Ordering::SeqCst), 1);
        assert_eq!(leader.batch_calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_refused_item_fails_alone_and_is_not_retried() {
        let fake = Arc::new(Fake::default());
        *fake.refused_stream.lock().unwrap() = Some(9);
        let appender = Appender::spawn(
            fake::start(fake.clone()).await,
            BatchConfig {
                max_in_flight: 1,
                ..config(3)
            },
        );
        let (refused, fine) =
            tokio::join!(appender.write(append(9, 1)), appender.write(append(8, 1)));
        let err = refused.unwrap_err();
        assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
        assert!(err.to_string().contains("stream 9 is terminated"), "{err}");
        assert!(matches!(fine.unwrap(), Written::Appended(a) if a.stream == 8));
        assert_eq!(appender.stats().retries, 0);
    }
}
