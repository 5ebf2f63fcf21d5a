//! The clients and the two write paths they drive: `raft` (openraft's `client_write` on the
//! current leader) and `single` (one writer thread that group-commits whatever is queued as
//! consecutive entries in one `EntryLog::append`, i.e. one `fdatasync`, like the engine's
//! writer). Each client keeps one write in flight.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cursorlog_engine::{
    EntryId, EntryLog, EntryLogConfig, EntryPayload, LogEntry, Proposal, ProposedRecord,
};
use cursorlog_replication::{NodeId, Raft};
use hdrhistogram::Histogram;
use tokio::sync::{mpsc, oneshot, Notify};

use super::cluster::{BenchError, Router};
use super::store::{AppendCounts, CountingSm};

/// Size of every proposal, in bytes (the engine's proposal encoding, all framing included).
pub const PROPOSAL_BYTES: usize = 512;

/// Client `client`'s proposal: one SessionState record (tag 12) whose body is session
/// String, state `Vec<u8>`, at_ms u64 (little-endian u64 lengths, FORMAT.md), the state
/// sized so that the whole encoded proposal is [`PROPOSAL_BYTES`].
pub fn proposal(client: usize) -> Proposal {
    let session = format!("bench-{client:04}");
    // u32 count + u8 tag + u32 body length; body: u64 len + session, u64 len + state, u64.
    let fixed = 4 + 1 + 4 + 8 + session.len() + 8 + 8;
    let state = PROPOSAL_BYTES.saturating_sub(fixed);
    let mut body = (session.len() as u64).to_le_bytes().to_vec();
    body.extend_from_slice(session.as_bytes());
    body.extend_from_slice(&(state as u64).to_le_bytes());
    body.extend(std::iter::repeat_n((client % 251) as u8, state));
    body.extend_from_slice(&1_764_633_600_000u64.to_le_bytes());
    Proposal::from_records(&[ProposedRecord { tag: 12, body }])
}

/// A queued write of the `single` path and where to acknowledge it.
pub type SingleWrite = (Proposal, oneshot::Sender<()>);

/// Where a client's writes go.
#[derive(Clone)]
pub enum Target {
    /// `client_write` on whichever node leads.
    Raft(Arc<Router>),
    /// The group-committing writer thread.
    Single(mpsc::UnboundedSender<SingleWrite>),
}

/// The first acknowledged write after a kill, by a node other than the killed one.
#[derive(Default)]
pub struct AckWatch {
    armed: Mutex<Option<(NodeId, Instant, Option<Instant>)>>,
    /// Woken when the first acknowledgement after the kill arrives.
    pub seen: Notify,
}

impl AckWatch {
    /// Starts watching for an acknowledgement from any node but `killed` after `at`.
    pub fn arm(&self, killed: NodeId, at: Instant) {
        *self.armed.lock().unwrap_or_else(PoisonError::into_inner) = Some((killed, at, None));
    }

    /// When the first one came, if it did.
    pub fn first(&self) -> Option<Instant> {
        self.armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .and_then(|a| a.2)
    }

    fn observe(&self, node: NodeId, at: Instant) {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((killed, since, first @ None)) = armed.as_mut() {
            if node != *killed && at > *since {
                *first = Some(at);
                self.seen.notify_one();
            }
        }
    }
}

/// What one client measured.
pub struct ClientStats {
    /// Latencies (µs) of the writes acknowledged before the deadline.
    pub hist: Histogram<u64>,
    /// Writes that failed and were retried (leader changes, lapsed leases); polls for a
    /// leader while there is none are not counted.
    pub errors: u64,
}

/// A latency histogram from 1 µs to 60 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts (low ≥ 1, high ≥ 2 × low).
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap_or_else(|_| unreachable!())
}

/// One client: writes its proposal, waits for the acknowledgement, writes again, until
/// `deadline` or `stop`. A failed write is retried (on the new leader) and counted.
pub async fn client(
    id: usize,
    target: Target,
    deadline: Instant,
    stop: Arc<AtomicBool>,
    acks: Option<Arc<AckWatch>>,
) -> ClientStats {
    let proposal = proposal(id);
    let mut stats = ClientStats {
        hist: histogram(),
        errors: 0,
    };
    let mut leader: Option<(NodeId, Raft<CountingSm>)> = None;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let begin = Instant::now();
        let node = loop {
            match write(&target, &mut leader, &proposal).await {
                Ok(node) => break node,
                Err(_) if stop.load(Ordering::Relaxed) => return stats,
                Err(attempted) => {
                    stats.errors += u64::from(attempted);
                    // Between leaders: poll for the next one (1 ms is the resolution of the
                    // failover figure, well under the elections measured).
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        };
        let end = Instant::now();
        if end <= deadline {
            let us = u64::try_from((end - begin).as_micros()).unwrap_or(u64::MAX);
            stats.hist.saturating_record(us.max(1));
        }
        if let Some(acks) = &acks {
            acks.observe(node, end);
        }
    }
    stats
}

/// One write; the acknowledging node's id, or whether a write was attempted (`false`: no
/// node leads right now).
async fn write(
    target: &Target,
    leader: &mut Option<(NodeId, Raft<CountingSm>)>,
    proposal: &Proposal,
) -> Result<NodeId, bool> {
    match target {
        Target::Single(tx) => {
            let (ack, acked) = oneshot::channel();
            tx.send((proposal.clone(), ack)).map_err(|_| true)?;
            acked.await.map(|()| 0).map_err(|_| true)
        }
        Target::Raft(router) => {
            if leader.is_none() {
                *leader = router.leader();
            }
            let (id, raft) = leader.as_ref().ok_or(false)?;
            let records = proposal.as_bytes().to_vec();
            match raft
                .client_write(cursorlog_replication::Proposal::new(records))
                .await
            {
                Ok(_) => Ok(*id),
                Err(_) => {
                    *leader = None;
                    Err(true)
                }
            }
        }
    }
}

/// The `single` path's writer thread (its result: the first append error).
pub type Writer = std::thread::JoinHandle<Result<(), BenchError>>;

/// The `single` path: a writer thread over one [`EntryLog`] in `dir` that drains whatever
/// is queued, appends it as consecutive entries in one call (one `fdatasync`), then
/// acknowledges them all. Ends when every sender is dropped.
///
/// # Errors
/// The log does not open.
pub fn single_writer(
    dir: &Path,
    counts: Arc<AppendCounts>,
) -> Result<(mpsc::UnboundedSender<SingleWrite>, Writer), BenchError> {
    let log = EntryLog::open(EntryLogConfig::new(dir))?;
    let (tx, mut rx) = mpsc::unbounded_channel::<SingleWrite>();
    let thread = std::thread::spawn(move || {
        let mut next = log.state().last.map_or(1, |id| id.index + 1);
        let mut batch = Vec::new();
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            let (entries, acks): (Vec<LogEntry>, Vec<oneshot::Sender<()>>) = batch
                .drain(..)
                .zip(next..)
                .map(|((p, ack), index)| {
                    let id = EntryId { term: 1, index };
                    let payload = EntryPayload::Records(p);
                    (LogEntry { id, payload }, ack)
                })
                .unzip();
            log.append(&entries)?;
            next += entries.len() as u64;
            counts.add(entries.len() as u64);
            for ack in acks {
                let _ = ack.send(());
            }
        }
        Ok(())
    });
    Ok((tx, thread))
}
