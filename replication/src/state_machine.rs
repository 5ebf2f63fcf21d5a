//! openraft's state machine over the engine: applying a committed entry is
//! [`Engine::apply_committed`] (the engine reads the entry's records from the segment log,
//! which is the Raft log, checks them with its apply rules and changes its index), and the
//! applied state openraft asks for at start is the engine's [`cursorlog_engine::Progress`].
//!
//! Snapshots (issue 19 item 4) are the log's own segment files up to the applied entry
//! ([`crate::snapshot`]): building one opens the files (no copy), installing one stages the
//! received files under the data directory and makes them the log, then rebuilds the index
//! from them ([`Engine::install_snapshot`]); the log goes on at the LSN the snapshot
//! carries, so stream ids stay identical on every replica.

use std::io;

use cursorlog_engine::{Engine, EntryId};
use futures_util::TryStreamExt as _;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::OptionalSend;

use crate::codec;
use crate::snapshot::{self, SegmentSnapshot};
use crate::types::{ApplyResult, LogId, TypeConfig};

/// The engine as openraft's state machine.
#[derive(Debug, Clone)]
pub struct EngineStateMachine {
    engine: Engine,
}

impl EngineStateMachine {
    /// The state machine of `engine` (opened with [`Engine::open_replicated`] or
    /// [`Engine::open_replica`] over the same log as the node's log store).
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

/// Most entries an apply runs on the calling task (see [`inline_apply`]).
const INLINE_APPLY_ENTRIES_MAX: usize = 16;

/// Whether applying `entries` entries through entry `through` may run on the calling task:
/// they are few and durable already (no `fdatasync` to wait for), so the apply reads them
/// from the log's in-memory tail and changes the index, a few microseconds per event. The
/// hop to the blocking pool and back cost more than that on every committed batch
/// (benches/HISTORY.md, "Pipelined AppendEntries"). A long range (a member catching up)
/// may read the segments: it goes to the blocking pool.
///
/// Needs a multi-threaded runtime (`block_in_place`); on a single-threaded one, as in some
/// tests, the apply always goes to the blocking pool.
fn inline_apply(engine: &Engine, entries: usize, through: u64) -> bool {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    multi_thread
        && entries <= INLINE_APPLY_ENTRIES_MAX
        && engine
            .entry_log()
            .is_some_and(|log| log.durable() >= through)
}

/// The Raft log id of the engine's entry `id` (entry = Raft index + 1).
fn to_raft(id: EntryId) -> LogId {
    LogId::new_term_index(id.term, id.index - 1)
}

/// The engine's id of the Raft log id `id`.
fn to_engine(id: &LogId) -> EntryId {
    EntryId {
        term: id.committed_leader_id().term,
        index: id.index() + 1,
    }
}

impl EngineStateMachine {
    /// A snapshot of what the engine applied: the segment files through the applied entry
    /// and the last applied membership (`None` before anything was applied).
    async fn snapshot(&self) -> io::Result<Option<SnapshotOf<TypeConfig, SegmentSnapshot>>> {
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || {
            // The files, the refusals among their entries and the applied point, at once.
            let Some((taken, progress)) = engine.snapshot().map_err(io::Error::other)? else {
                return Ok(None);
            };
            let last = taken.manifest.last;
            let last_membership = membership(progress.membership)?;
            tracing::debug!(
                last = last.index,
                files = taken.manifest.files.len(),
                bytes = taken.manifest.bytes(),
                "snapshot taken"
            );
            Ok(Some(SnapshotOf::<TypeConfig, SegmentSnapshot> {
                meta: SnapshotMetaOf::<TypeConfig> {
                    last_log_id: Some(to_raft(last)),
                    last_membership,
                },
                snapshot: SegmentSnapshot::taken(taken),
            }))
        })
        .await
        .map_err(io::Error::other)?
    }
}

/// openraft's stored membership for the engine's last applied membership entry.
fn membership(m: Option<(EntryId, Vec<u8>)>) -> io::Result<StoredMembershipOf<TypeConfig>> {
    Ok(match m {
        Some((id, bytes)) => StoredMembershipOf::<TypeConfig>::new(
            Some(to_raft(id)),
            codec::decode("membership", &bytes).map_err(io::Error::other)?,
        ),
        None => StoredMembershipOf::<TypeConfig>::default(),
    })
}

impl RaftSnapshotBuilder<TypeConfig> for EngineStateMachine {
    type SnapshotData = SegmentSnapshot;

    async fn build_snapshot(
        &mut self,
    ) -> Result<SnapshotOf<TypeConfig, SegmentSnapshot>, io::Error> {
        self.snapshot()
            .await?
            .ok_or_else(|| io::Error::other("nothing is applied yet: no snapshot to build"))
    }
}

impl RaftStateMachine<TypeConfig> for EngineStateMachine {
    type SnapshotData = SegmentSnapshot;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembershipOf<TypeConfig>), io::Error> {
        let progress = self
            .engine
            .applied()
            .ok_or_else(|| io::Error::other("the engine is a single node's, not a replica's"))?;
        Ok((progress.last.map(to_raft), membership(progress.membership)?))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: futures_util::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        let mut batch = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            batch.push((entry.log_id.index + 1, responder));
        }
        let Some(&(through, _)) = batch.last() else {
            return Ok(());
        };
        let engine = self.engine.clone();
        let applied = if inline_apply(&engine, batch.len(), through) {
            // Still blocking, if briefly: the runtime hands this worker's other tasks to
            // another thread first, so a slow apply never holds up Raft's own tasks.
            tokio::task::block_in_place(|| engine.apply_committed(through))
                .map_err(io::Error::other)?
        } else {
            // The engine's apply is synchronous I/O (a sync of the entries, reads of the
            // log): off the runtime's worker threads.
            tokio::task::spawn_blocking(move || engine.apply_committed(through))
                .await
                .map_err(io::Error::other)?
                .map_err(io::Error::other)?
        };
        for (index, responder) in batch {
            let refused = applied
                .refused
                .iter()
                .find(|(id, _)| id.index == index)
                .map(|(_, why)| why.clone());
            if let Some(responder) = responder {
                responder.send(ApplyResult { refused });
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    /// Stages the received files under the data directory (fsynced), makes them the log
    /// and rebuilds the index from them; progress (files, bytes) goes to the log.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        mut snapshot: SegmentSnapshot,
    ) -> Result<(), io::Error> {
        let engine = self.engine.clone();
        let want = meta.last_log_id.as_ref().map(to_engine);
        tokio::task::spawn_blocking(move || {
            let manifest = snapshot.read_manifest()?;
            if want != Some(manifest.last) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the snapshot's files end at entry {:?}, its meta says {want:?}",
                        manifest.last
                    ),
                ));
            }
            tracing::info!(
                last = manifest.last.index,
                term = manifest.last.term,
                next_lsn = manifest.next_lsn,
                files = manifest.files.len(),
                bytes = manifest.bytes(),
                "snapshot install: receiving"
            );
            let log = engine
                .entry_log()
                .ok_or_else(|| io::Error::other("the engine has no replicated log"))?;
            if log.holds(manifest.last).map_err(io::Error::other)? {
                // Everything the snapshot brings is already here (and maybe entries after
                // it, which openraft keeps): apply up to it instead of replacing the log.
                let applied = engine
                    .apply_committed(manifest.last.index)
                    .map_err(io::Error::other)?;
                tracing::info!(
                    entries = applied.entries,
                    "snapshot install: the log already holds the snapshot's entries; applied them"
                );
                return Ok(());
            }
            let staging = log.begin_install(manifest).map_err(io::Error::other)?;
            snapshot::copy_into(snapshot, &staging)?;
            staging.finish().map_err(io::Error::other)?;
            let applied = engine.install_snapshot(staging).map_err(io::Error::other)?;
            tracing::info!(
                entries = applied.entries,
                refused = applied.refused.len(),
                "snapshot install: the log is replaced and the index rebuilt"
            );
            Ok(())
        })
        .await
        .map_err(io::Error::other)?
    }

    /// A snapshot of what is applied now (taking one costs opening the files).
    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, SegmentSnapshot>>, io::Error> {
        self.snapshot().await
    }
}
