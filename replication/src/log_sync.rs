//! Group commit of the Raft log's flushes: `append` writes its entries and returns, and one
//! `fdatasync` on a blocking thread then reports every append written before it as flushed.
//!
//! Why: openraft awaits `append` in its core task. A store that syncs inside `append` holds
//! the core (and the log, so replication cannot read the new entries) through every
//! `fdatasync`: the leader's sync and its followers' ran one after the other, and every
//! batch paid both (benches/HISTORY.md, "Flushes off Raft's path"). openraft only needs
//! the flushed callback to come after the entries are durable, and in order.
//!
//! Order: callbacks fire in the order their appends were written, each after a sync that
//! started after its write. [`LogSync::barrier`] waits until every flush queued before it
//! has been reported, so a truncation, a purge or a vote is never reordered before an
//! earlier append's flush, and a shutdown leaves no sync running on the log.

use std::io;
use std::sync::{Arc, Mutex};

use cursorlog_engine::EntryLog;
use openraft::storage::IOFlushed;
use tokio::sync::oneshot;

use crate::types::TypeConfig;

/// The flush queue of one log (cheap to clone: clones share it).
#[derive(Debug, Clone)]
pub(crate) struct LogSync {
    log: EntryLog,
    queue: Arc<Mutex<Queue>>,
}

#[derive(Default)]
struct Queue {
    /// Flushed callbacks of appends written and not yet synced, oldest first.
    flushes: Vec<IOFlushed<TypeConfig>>,
    /// Callers of [`LogSync::barrier`] waiting for the next sync to finish.
    barriers: Vec<oneshot::Sender<io::Result<()>>>,
    /// A blocking task is syncing (and will take what is queued before it stops).
    running: bool,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("flushes", &self.flushes.len())
            .field("barriers", &self.barriers.len())
            .field("running", &self.running)
            .finish()
    }
}

impl LogSync {
    pub(crate) fn new(log: EntryLog) -> Self {
        Self {
            log,
            queue: Arc::new(Mutex::new(Queue::default())),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues `callback` for the next sync (its append's entries are written already), and
    /// starts a syncing task if none runs.
    pub(crate) fn flush_later(&self, callback: IOFlushed<TypeConfig>) {
        let start = {
            let mut q = self.queue();
            q.flushes.push(callback);
            !std::mem::replace(&mut q.running, true)
        };
        if start {
            let this = self.clone();
            tokio::task::spawn_blocking(move || this.run());
        }
    }

    /// Waits until every flush queued before this call has been synced and reported, and the
    /// syncing task has let go of the log.
    ///
    /// # Errors
    /// The sync failed (the log then refuses writes).
    pub(crate) async fn barrier(&self) -> io::Result<()> {
        let rx = {
            let mut q = self.queue();
            if !q.running {
                return Ok(());
            }
            let (tx, rx) = oneshot::channel();
            q.barriers.push(tx);
            rx
        };
        rx.await
            .map_err(|_| io::Error::other("the log's sync task stopped"))?
    }

    /// Syncs while anything is queued: each round takes the whole queue, so appends that
    /// arrive during a sync share the next one. Barriers are answered once nothing is left
    /// to sync, after this task let go of the log (a node restarting after
    /// [`LogSync::barrier`] finds its directory free).
    fn run(self) {
        let mut barriers = Vec::new();
        let mut failed: Option<String> = None;
        loop {
            let flushes = {
                let mut q = self.queue();
                barriers.append(&mut q.barriers);
                if q.flushes.is_empty() {
                    q.running = false;
                    break;
                }
                std::mem::take(&mut q.flushes)
            };
            let synced = self.log.sync().map(drop);
            failed = synced.as_ref().err().map(ToString::to_string);
            for callback in flushes {
                callback.io_completed(copy(&synced));
            }
        }
        drop(self);
        for barrier in barriers {
            let outcome = match &failed {
                None => Ok(()),
                Some(why) => Err(io::Error::other(why.clone())),
            };
            // A barrier whose caller went away needs no answer.
            let _ = barrier.send(outcome);
        }
    }
}

/// The outcome for one more caller (`io::Error` is not `Clone`).
fn copy(r: &cursorlog_engine::Result<()>) -> io::Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(e) => Err(io::Error::other(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use cursorlog_engine::{
        EntryId, EntryLogConfig, EntryPayload, LogEntry, Proposal, ProposedRecord,
    };

    use openraft::type_config::TypeConfigExt as _;

    use super::*;

    /// A one-record entry (a SessionState record of session "s", FORMAT.md).
    fn entry(index: u64) -> LogEntry {
        let mut body = 1u64.to_le_bytes().to_vec();
        body.push(b's');
        body.extend_from_slice(&4u64.to_le_bytes());
        body.extend_from_slice(&[7; 4]);
        body.extend_from_slice(&index.to_le_bytes());
        LogEntry {
            id: EntryId { term: 1, index },
            payload: EntryPayload::Records(Proposal::from_records(&[ProposedRecord {
                tag: 12,
                body,
            }])),
        }
    }

    fn flushed() -> (
        IOFlushed<TypeConfig>,
        openraft::type_config::alias::OneshotReceiverOf<TypeConfig, io::Result<()>>,
    ) {
        let (tx, rx) = TypeConfig::oneshot();
        (IOFlushed::signal(tx), rx)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flush_is_reported_only_after_a_sync_covers_its_write_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap();
        let sync = LogSync::new(log.clone());
        // Nothing queued: a barrier returns at once.
        sync.barrier().await.unwrap();
        let mut waits = Vec::new();
        for i in 1..=20 {
            log.write(&[entry(i)]).unwrap();
            let (callback, rx) = flushed();
            sync.flush_later(callback);
            waits.push((i, rx));
        }
        for (i, rx) in waits {
            rx.await.unwrap().unwrap();
            assert!(
                log.durable() >= i,
                "entry {i} reported flushed, durable through {}",
                log.durable()
            );
        }
        // And after a barrier no sync runs: everything written is durable.
        log.write(&[entry(21)]).unwrap();
        let (callback, _rx) = flushed();
        sync.flush_later(callback);
        sync.barrier().await.unwrap();
        assert_eq!(log.durable(), 21);
        assert!(!sync.queue().running);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_sync_reports_the_failure_to_every_waiting_append() {
        let dir = tempfile::tempdir().unwrap();
        let fs = cursorlog_engine::FaultyFs::new(1);
        let log =
            EntryLog::open_with_fs(EntryLogConfig::new(dir.path()), Arc::new(fs.clone())).unwrap();
        let sync = LogSync::new(log.clone());
        log.write(&[entry(1)]).unwrap();
        fs.crash(false);
        let (callback, rx) = flushed();
        sync.flush_later(callback);
        assert!(
            rx.await.unwrap().is_err(),
            "a flush must not be reported after a failed sync"
        );
        assert_eq!(log.durable(), 0);
    }
}
