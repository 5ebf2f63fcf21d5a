//! TEST FIXTURE, NOT PRODUCT CODE: a minimal in-memory `RaftLogStorage` and `RaftStateMachine`
//! for cursorlog's [`TypeConfig`], scaffolding for the transport tests until the engine's
//! segment log becomes the Raft log.
//!
//! `openraft-memstore 0.10.0-alpha.37` exists but is tied to its own type config (`Node = ()`,
//! `leader_id_adv`, string requests) and turns on openraft's default features, so it cannot
//! run our [`TypeConfig`]; this is the same idea, about 200 lines, nothing durable.
//!
//! The state machine records every applied proposal's bytes in order, so a test can compare
//! what each node applied.

use std::collections::BTreeMap;
use std::io::{self, Cursor};
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cursorlog_replication::{ApplyResult, Entry, LogId, TypeConfig, Vote};
use futures_util::TryStreamExt as _;
use openraft::entry::RaftEntry as _;
use openraft::storage::{
    EntryResponder, IOFlushed, LogState, RaftLogReader, RaftLogStorage, RaftSnapshotBuilder,
    RaftStateMachine,
};
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Default)]
struct LogInner {
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    entries: BTreeMap<u64, Entry>,
}

/// The in-memory log (and its reader: the same shared state).
#[derive(Debug, Clone, Default)]
pub struct MemLog(Arc<Mutex<LogInner>>);

impl RaftLogReader<TypeConfig> for MemLog {
    async fn try_get_log_entries<RB>(&mut self, range: RB) -> Result<Vec<Entry>, io::Error>
    where
        RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend,
    {
        Ok(lock(&self.0)
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(lock(&self.0).vote)
    }
}

impl RaftLogStorage<TypeConfig> for MemLog {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let inner = lock(&self.0);
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id())
            .or(inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        lock(&self.0).vote = Some(*vote);
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        lock(&self.0).committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(lock(&self.0).committed)
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
        {
            let mut inner = lock(&self.0);
            for entry in entries {
                inner.entries.insert(entry.index(), entry);
            }
        }
        // Memory is "durable" as soon as it is written: this fixture has no disk.
        callback.io_completed(Ok(()));
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), io::Error> {
        let from = last.map_or(0, |id| id.index + 1);
        lock(&self.0).entries.split_off(&from);
        Ok(())
    }

    async fn purge(&mut self, upto: LogId) -> Result<(), io::Error> {
        let mut inner = lock(&self.0);
        inner.last_purged = Some(upto);
        inner.entries = inner.entries.split_off(&(upto.index + 1));
        Ok(())
    }
}

/// What the state machine holds: the applied proposals in order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembershipOf<TypeConfig>,
    /// The records of every applied normal entry, in log order.
    pub proposals: Vec<Vec<u8>>,
}

#[derive(Debug, Default)]
struct SmInner {
    applied: Applied,
    snapshot: Option<(SnapshotMetaOf<TypeConfig>, Vec<u8>)>,
}

/// The in-memory state machine; snapshots are its JSON, carried as `Cursor<Vec<u8>>`.
#[derive(Debug, Clone, Default)]
pub struct MemStateMachine(Arc<Mutex<SmInner>>);

impl MemStateMachine {
    /// The proposals applied so far.
    pub fn proposals(&self) -> Vec<Vec<u8>> {
        lock(&self.0).applied.proposals.clone()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for MemStateMachine {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(
        &mut self,
    ) -> Result<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>, io::Error> {
        let mut inner = lock(&self.0);
        let data = serde_json::to_vec(&inner.applied).map_err(io::Error::other)?;
        let meta = SnapshotMetaOf::<TypeConfig> {
            last_log_id: inner.applied.last_applied,
            last_membership: inner.applied.membership.clone(),
        };
        inner.snapshot = Some((meta.clone(), data.clone()));
        Ok(SnapshotOf::<TypeConfig, _> {
            meta,
            snapshot: Cursor::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for MemStateMachine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembershipOf<TypeConfig>), io::Error> {
        let inner = lock(&self.0);
        Ok((inner.applied.last_applied, inner.applied.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: futures_util::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let result = ApplyResult::default();
            {
                let mut inner = lock(&self.0);
                inner.applied.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(proposal) => {
                        inner.applied.proposals.push(proposal.records.to_vec());
                    }
                    EntryPayload::Membership(m) => {
                        inner.applied.membership =
                            StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), m);
                    }
                }
            }
            if let Some(responder) = responder {
                responder.send(result);
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
        inner.applied = applied;
        inner.snapshot = Some((meta.clone(), data));
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>>, io::Error> {
        Ok(lock(&self.0)
            .snapshot
            .clone()
            .map(|(meta, data)| SnapshotOf::<TypeConfig, _> {
                meta,
                snapshot: Cursor::new(data),
            }))
    }
}
