//! Disk pressure on a member: retention deletes only segments a snapshot covers
//! (`engine/src/member.rs`), and a snapshot comes every `--snapshot-every-entries` entries,
//! which may never come when the disk is full (appends are refused). So while the engine
//! reports free space below its reserve, the member snapshots what it applied and purges its
//! log up to that snapshot at once: retention, which runs every tick while space is short,
//! can then delete the dead segments. Followers that lag behind the purge catch up by
//! snapshot.

use std::time::Duration;

use cursorlog_engine::Engine;
use openraft::async_runtime::WatchReceiver as _;

use crate::state_machine::EngineStateMachine;
use crate::types::Raft;

/// How often free space is looked at (the engine measures it every 50 ms).
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Watches `engine`'s free-space flag and snapshots and purges `raft`'s log while it is low;
/// ends when the Raft core stops or the engine closes, or when the node aborts it at
/// shutdown (it holds a Raft handle, and an engine handle only while it checks).
pub(crate) fn spawn_space_watch(
    raft: Raft<EngineStateMachine>,
    engine: &Engine,
) -> tokio::task::JoinHandle<()> {
    let engine = engine.downgrade();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut metrics = raft.metrics();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = metrics.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
            }
            let m = metrics.borrow_watched().clone();
            if m.running_state.is_err() {
                return;
            }
            match engine.upgrade() {
                None => return,
                Some(e) if !e.low_on_disk() => continue,
                Some(_) => {}
            }
            let snapshot = m.snapshot.map(|s| s.index());
            let applied = m.last_applied.map(|a| a.index());
            let purged = m.purged.map(|p| p.index());
            let outcome = if applied > snapshot {
                tracing::info!(
                    applied = ?applied,
                    "short of disk space: snapshotting so retention can delete segments"
                );
                raft.trigger().snapshot().await
            } else if let Some(upto) = m.snapshot.filter(|_| snapshot > purged) {
                tracing::info!(
                    upto = upto.index(),
                    "short of disk space: purging the log up to the snapshot"
                );
                raft.trigger().purge_log(upto.index()).await
            } else {
                Ok(())
            };
            if outcome.is_err() {
                // The node is shutting down.
                return;
            }
        }
    })
}
