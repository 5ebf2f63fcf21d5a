//! The storage under each benchmark node: the real log store ([`SegmentLogStore`] over an
//! [`EntryLog`](cursorlog_engine::EntryLog)) wrapped to count its appends, and a STAND-IN state machine.
//!
//! **The state machine is the benchmark's stand-in, not the engine's apply** (there is none
//! yet): it only counts applied entries and keeps the last applied log id and membership,
//! like the fixture in `replication/tests/support/`. So the figures leave out everything the
//! engine's apply will cost.

use std::io::{self, Cursor};
use std::ops::RangeBounds;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cursorlog_replication::{ApplyResult, Entry, LogId, SegmentLogStore, TypeConfig, Vote};
use futures_util::TryStreamExt as _;
use openraft::storage::{
    EntryResponder, IOFlushed, LogState, RaftLogReader, RaftLogStorage, RaftSnapshotBuilder,
    RaftStateMachine,
};
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::{EntryPayload, OptionalSend};

/// Appends (each one `fdatasync`) and entries written through one node's log store.
#[derive(Debug, Default)]
pub struct AppendCounts {
    /// `append` calls that reached the disk.
    pub appends: AtomicU64,
    /// Entries those calls wrote.
    pub entries: AtomicU64,
}

impl AppendCounts {
    /// `(appends, entries)` now.
    pub fn get(&self) -> (u64, u64) {
        (
            self.appends.load(Ordering::Relaxed),
            self.entries.load(Ordering::Relaxed),
        )
    }

    /// Counts one append of `entries` entries.
    pub fn add(&self, entries: u64) {
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.entries.fetch_add(entries, Ordering::Relaxed);
    }
}

/// A diagnostic knob (`--skip-save-committed`): when set, `save_committed` is not passed to
/// the segment log, to measure what its per-commit file replacement (`COMMITTED`: create,
/// write, rename, under the log's lock) costs. Off by default; a node that skips it only
/// re-applies more entries after a restart.
pub static SKIP_SAVE_COMMITTED: AtomicBool = AtomicBool::new(false);

/// [`SegmentLogStore`] with its appends counted (every call is delegated unchanged, but see
/// [`SKIP_SAVE_COMMITTED`]).
#[derive(Debug, Clone)]
pub struct CountingStore {
    inner: SegmentLogStore,
    counts: Arc<AppendCounts>,
}

impl CountingStore {
    /// Counts `inner`'s appends into `counts`.
    pub fn new(inner: SegmentLogStore, counts: Arc<AppendCounts>) -> Self {
        Self { inner, counts }
    }
}

impl RaftLogReader<TypeConfig> for CountingStore {
    async fn try_get_log_entries<RB>(&mut self, range: RB) -> Result<Vec<Entry>, io::Error>
    where
        RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend,
    {
        self.inner.try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.inner.read_vote().await
    }
}

impl RaftLogStorage<TypeConfig> for CountingStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        self.inner.get_log_state().await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.inner.save_vote(vote).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        if SKIP_SAVE_COMMITTED.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.inner.save_committed(committed).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        self.inner.read_committed().await
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
        let entries: Vec<Entry> = entries.into_iter().collect();
        let n = entries.len() as u64;
        self.inner.append(entries, callback).await?;
        self.counts.add(n);
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), io::Error> {
        self.inner.truncate_after(last).await
    }

    async fn purge(&mut self, upto: LogId) -> Result<(), io::Error> {
        self.inner.purge(upto).await
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the stand-in state machine holds.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    membership: StoredMembershipOf<TypeConfig>,
    count: u64,
}

/// THE BENCHMARK'S STAND-IN STATE MACHINE: counts applied entries, keeps the last applied
/// log id and the membership, answers every proposal with an empty result. Snapshots are
/// its JSON (openraft builds none here: `SnapshotPolicy::Never`, and no log is purged).
#[derive(Debug, Clone, Default)]
pub struct CountingSm(Arc<Mutex<(Applied, Option<Snapshot>)>>);

/// A snapshot built or installed: its meta and its JSON.
type Snapshot = (SnapshotMetaOf<TypeConfig>, Vec<u8>);

impl RaftSnapshotBuilder<TypeConfig> for CountingSm {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(
        &mut self,
    ) -> Result<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>, io::Error> {
        let mut inner = lock(&self.0);
        let data = serde_json::to_vec(&inner.0).map_err(io::Error::other)?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: inner.0.last_applied,
            last_membership: inner.0.membership.clone(),
        };
        inner.1 = Some((meta.clone(), data.clone()));
        Ok(SnapshotOf::<TypeConfig, _> {
            meta,
            snapshot: Cursor::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for CountingSm {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembershipOf<TypeConfig>), io::Error> {
        let inner = lock(&self.0);
        Ok((inner.0.last_applied, inner.0.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: futures_util::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            {
                let mut inner = lock(&self.0);
                inner.0.last_applied = Some(entry.log_id);
                inner.0.count += 1;
                if let EntryPayload::Membership(m) = entry.payload {
                    inner.0.membership =
                        StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), m);
                }
            }
            if let Some(responder) = responder {
                responder.send(ApplyResult::default());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Cursor<Vec<u8>>,
    ) -> Result<(), io::Error> {
        let data = snapshot.into_inner();
        let applied: Applied = serde_json::from_slice(&data).map_err(io::Error::other)?;
        let mut inner = lock(&self.0);
        inner.0 = applied;
        inner.1 = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>>, io::Error> {
        Ok(lock(&self.0)
            .1
            .clone()
            .map(|(meta, data)| SnapshotOf::<TypeConfig, _> {
                meta,
                snapshot: Cursor::new(data),
            }))
    }
}
