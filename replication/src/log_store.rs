//! openraft's log storage over the engine's segment log ([`cursorlog_engine::EntryLog`]):
//! the segment log *is* the Raft log (issue 19 item 1), not a second write-ahead log.
//!
//! Mapping:
//! - a Raft entry is one atomic group of the segment log, its frames stamped with the
//!   entry's term; openraft's first index is 0, the engine's first entry is 1, so
//!   **entry = Raft index + 1** (here and only here);
//! - `Blank` and `Membership` entries are one record each (tags 14 and 15, FORMAT.md), the
//!   membership encoded with this crate's [`codec`]; a `Normal` entry's
//!   [`Proposal`] bytes are the engine's proposal encoding, checked before they are written;
//! - `append` writes (on a blocking thread: the engine's I/O is synchronous) and returns;
//!   openraft's flushed callback comes after a later `fdatasync` shared by every append
//!   written before it (`log_sync.rs`), so neither openraft's core nor the
//!   replication reading the new entries waits for the disk;
//! - `truncate_after` cuts only an uncommitted suffix (the engine refuses to cut a sealed
//!   segment or a committed entry); `purge` deletes whole sealed segments;
//! - the vote is saved durably (temp file, fsync, rename, directory fsync) before
//!   `save_vote` returns; the committed log id is saved without an fsync.

use std::io;
use std::ops::{Bound, RangeBounds};

use cursorlog_engine::{
    EntryId, EntryLog, EntryPayload as Stored, LogEntry, Proposal as EngineProposal,
};
use openraft::entry::RaftEntry as _;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{EntryPayload, OptionalSend};

use crate::codec;
use crate::log_sync::LogSync;
use crate::types::{Entry, LogId, Proposal, TypeConfig, Vote};

/// The Raft log store (and, cloned, its reader) over one segment log.
#[derive(Debug, Clone)]
pub struct SegmentLogStore {
    log: EntryLog,
    sync: LogSync,
}

impl SegmentLogStore {
    /// A store over `log` (opened by the caller, who chose its directory).
    pub fn new(log: EntryLog) -> Self {
        Self {
            sync: LogSync::new(log.clone()),
            log,
        }
    }

    /// Waits until every append so far is synced and reported flushed: after it, no sync
    /// runs on the log (a node shutting down calls it before it lets the log go).
    ///
    /// # Errors
    /// The sync failed.
    pub async fn settle(&self) -> io::Result<()> {
        self.sync.barrier().await
    }

    /// The engine's log underneath.
    pub fn entry_log(&self) -> &EntryLog {
        &self.log
    }

    /// Runs a blocking engine call off the async runtime's worker threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(EntryLog) -> cursorlog_engine::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || f(log))
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)
    }
}

/// The engine's id of the Raft log id `id`.
fn to_engine(id: &LogId) -> EntryId {
    EntryId {
        term: id.committed_leader_id().term,
        index: id.index() + 1,
    }
}

/// The Raft log id of the engine's entry `id`.
fn to_raft(id: EntryId) -> LogId {
    LogId::new_term_index(id.term, id.index - 1)
}

/// The engine's entry for a Raft entry.
fn stored(entry: Entry) -> io::Result<LogEntry> {
    let id = to_engine(&entry.log_id());
    let payload = match entry.payload {
        EntryPayload::Blank => Stored::Blank,
        EntryPayload::Normal(p) => Stored::Records(EngineProposal::from_bytes(p.records)),
        EntryPayload::Membership(m) => {
            Stored::Membership(codec::encode("membership", &m).map_err(io::Error::other)?)
        }
    };
    Ok(LogEntry { id, payload })
}

/// The Raft entry for an engine entry.
fn raft_entry(entry: LogEntry) -> io::Result<Entry> {
    let log_id = to_raft(entry.id);
    let payload = match entry.payload {
        Stored::Blank => EntryPayload::Blank,
        Stored::Records(p) => EntryPayload::Normal(Proposal::new(p.into_bytes())),
        Stored::Membership(bytes) => {
            EntryPayload::Membership(codec::decode("membership", &bytes).map_err(io::Error::other)?)
        }
    };
    Ok(Entry { log_id, payload })
}

impl RaftLogReader<TypeConfig> for SegmentLogStore {
    async fn try_get_log_entries<RB>(&mut self, range: RB) -> Result<Vec<Entry>, io::Error>
    where
        RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend,
    {
        // Raft indexes → engine entries (+1).
        let from = match range.start_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => i.saturating_add(2),
            Bound::Unbounded => 1,
        };
        let to = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(2),
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => u64::MAX,
        };
        // New entries (what replication asks for) are answered from the log's tail in
        // memory, here; older ones are read on a blocking thread.
        let entries = match self.log.read_cached(from, to) {
            Some(entries) => entries,
            None => self.blocking(move |log| log.read(from, to)).await?,
        };
        entries.into_iter().map(raft_entry).collect()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        let bytes = self.blocking(|log| log.read_vote()).await?;
        bytes
            .map(|b| codec::decode("vote", &b).map_err(io::Error::other))
            .transpose()
    }
}

impl RaftLogStorage<TypeConfig> for SegmentLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        // Off the runtime's threads: the log's lock is held through an append's fdatasync.
        let state = self.blocking(|log| Ok(log.state())).await?;
        Ok(LogState {
            last_purged_log_id: state.last_purged.map(to_raft),
            last_log_id: state.last.map(to_raft),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let bytes = codec::encode("vote", vote).map_err(io::Error::other)?;
        self.sync.barrier().await?;
        self.blocking(move |log| log.save_vote(&bytes)).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        let Some(id) = committed else {
            return Ok(());
        };
        let id = to_engine(&id);
        // A write of a few bytes in place: on this thread unless the log is busy.
        match self.log.try_save_committed(id) {
            Some(r) => r.map_err(io::Error::other),
            None => self.blocking(move |log| log.save_committed(id)).await,
        }
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        let committed = self.blocking(|log| Ok(log.committed())).await?;
        Ok(committed.map(to_raft))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries = match entries
            .into_iter()
            .map(stored)
            .collect::<io::Result<Vec<_>>>()
        {
            Ok(entries) => entries,
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(e);
            }
        };
        // Written (readable) when `append` returns; flushed when a later sync covers it.
        // The write is a `pwrite` into the page cache (no sync): on this thread unless the
        // log is busy, which saves a hand-off to a blocking thread and back per append.
        let written = match self.log.try_write(&entries) {
            Some(r) => r.map_err(io::Error::other),
            None => self.blocking(move |log| log.write(&entries)).await,
        };
        match written {
            Ok(()) => {
                self.sync.flush_later(callback);
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), io::Error> {
        let keep = last.map(|id| to_engine(&id).index);
        // Earlier appends' flushes are reported first: Raft's I/O completes in order.
        self.sync.barrier().await?;
        self.blocking(move |log| log.truncate_after(keep)).await
    }

    async fn purge(&mut self, upto: LogId) -> Result<(), io::Error> {
        let id = to_engine(&upto);
        self.blocking(move |log| log.purge_through(id)).await
    }
}
