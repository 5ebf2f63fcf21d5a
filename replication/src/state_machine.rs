//! openraft's state machine over the engine: applying a committed entry is
//! [`Engine::apply_committed`] (the engine reads the entry's records from the segment log,
//! which is the Raft log, checks them with its apply rules and changes its index), and the
//! applied state openraft asks for at start is the engine's [`cursorlog_engine::Progress`].
//!
//! Snapshots are not built yet (issue 19 item 4): the Raft config never asks for one
//! (`SnapshotPolicy::Never`) and the log is not purged on a replicated node, so a follower
//! always catches up from the log itself. Building or installing one answers an error
//! naming what is missing.

use std::io::{self, Cursor};

use cursorlog_engine::{Engine, EntryId};
use futures_util::TryStreamExt as _;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use openraft::type_config::alias::{SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::OptionalSend;

use crate::codec;
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

/// The Raft log id of the engine's entry `id` (entry = Raft index + 1).
fn to_raft(id: EntryId) -> LogId {
    LogId::new_term_index(id.term, id.index - 1)
}

fn no_snapshots() -> io::Error {
    io::Error::other(
        "cursorlog does not build or install snapshots yet (issue 19 item 4): a follower catches up from the log",
    )
}

impl RaftSnapshotBuilder<TypeConfig> for EngineStateMachine {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(
        &mut self,
    ) -> Result<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>, io::Error> {
        Err(no_snapshots())
    }
}

impl RaftStateMachine<TypeConfig> for EngineStateMachine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembershipOf<TypeConfig>), io::Error> {
        let progress = self
            .engine
            .applied()
            .ok_or_else(|| io::Error::other("the engine is a single node's, not a replica's"))?;
        let membership = match progress.membership {
            Some((id, bytes)) => StoredMembershipOf::<TypeConfig>::new(
                Some(to_raft(id)),
                codec::decode("membership", &bytes).map_err(io::Error::other)?,
            ),
            None => StoredMembershipOf::<TypeConfig>::default(),
        };
        Ok((progress.last.map(to_raft), membership))
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
        // The engine's apply is synchronous I/O (the index, reads of the log): off the
        // runtime's worker threads.
        let applied = tokio::task::spawn_blocking(move || engine.apply_committed(through))
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)?;
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

    async fn install_snapshot(
        &mut self,
        _meta: &SnapshotMetaOf<TypeConfig>,
        _snapshot: Cursor<Vec<u8>>,
    ) -> Result<(), io::Error> {
        Err(no_snapshots())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Cursor<Vec<u8>>>>, io::Error> {
        Ok(None)
    }
}
