//! A cluster member's replica side, below the engine and its background threads: how far
//! apply got and what it refused ([`Replica`]), and the retirement of the oldest segments of
//! its log once retention and a snapshot let them go ([`retire_purged`]).
//!
//! Retention on a member (issue 19 item 4, "retention purges only what a snapshot covers"):
//! every member drops the oldest segments of its own log once they are
//! - **purged** by openraft (covered by a snapshot: a member that lacks their entries gets
//!   the snapshot instead), and applied here;
//! - **dead**: every event in them lies below its stream's watermark (or its stream is
//!   forgotten), and no state born in them is left un-carried (no origin mark below the
//!   next segment).
//!
//! The leader decides what to evict, carry forward and forget, and proposes it as entries
//! (`retention::run_pass`, as a single node plans it); what each member unlinks is its own
//! segments' business, decided from its index, which apply keeps identical everywhere.
//! Before a segment goes, `BASE` records the refusals through the entry applied and the
//! membership (`entry_log/retire.rs` says why).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use crate::entry_log::{EntryId, EntryLog, LogBase};
use crate::error::Result;
use crate::index::{origin_key, KvRead, Txn};
use crate::propose::Proposer;
use crate::shared::Shared;

/// The replica side of an engine: the log it applies from and how far it got.
#[derive(Debug)]
pub(crate) struct Replica {
    pub(crate) log: EntryLog,
    /// Where the leader's writes go (`None`: this engine takes no writes).
    pub(crate) proposer: Option<Arc<dyn Proposer>>,
    /// How far apply got, and what it refused. Held while entries apply, a snapshot is
    /// taken, or segments retire, so each sees one consistent point.
    pub(crate) applied: Mutex<ApplyState>,
}

/// What apply did so far.
#[derive(Debug, Default)]
pub(crate) struct ApplyState {
    pub(crate) progress: Progress,
    /// The entries the apply rules refused, ascending, among those the log still holds.
    pub(crate) refused: Vec<EntryId>,
}

impl Replica {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, ApplyState> {
        self.applied.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// How far a replica's apply got: what openraft's state machine reports as its applied
/// state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The last entry applied or refused.
    pub last: Option<EntryId>,
    /// The last membership entry applied, with its configuration (opaque to the engine).
    pub membership: Option<(EntryId, Vec<u8>)>,
}

/// Unlinks the oldest segments of a member's log that are purged, applied and dead (see
/// the module's doc); returns how many.
///
/// # Errors
/// Index or I/O failures (the segments stay; the next pass tries again).
pub(crate) fn retire_purged(shared: &Shared, replica: &Replica) -> Result<usize> {
    let mut state = replica.lock();
    let applied = state.progress.last.map_or(0, |id| id.index);
    let purged = replica.log.state().last_purged.map_or(0, |id| id.index);
    let through = applied.min(purged);
    let held = replica.log.sealed_segments();
    let mut retire = Vec::new();
    let mut streams = BTreeSet::new();
    for h in &held {
        if h.next_entry > through + 1 || !dead(shared, h, &mut streams)? {
            break;
        }
        retire.push(h.segment.base_lsn());
    }
    if retire.is_empty() {
        return Ok(0);
    }
    // The base first, through the entry applied: a rebuild after the unlink replays the
    // entries up to it as they were applied, under the membership then in force.
    replica.log.save_base(&LogBase {
        through: applied,
        refused: state.refused.clone(),
        membership: state.progress.membership.clone(),
    })?;
    let mut txn = Txn::new(&shared.index);
    for stream in &streams {
        crate::apply::drop_runs_in(&mut txn, *stream, &retire)?;
    }
    drop(
        shared
            .index
            .commit(txn, shared.counters.last_lsn.load(Ordering::Acquire)),
    );
    let paths = replica.log.retire_oldest(retire.len())?;
    if let Some(first) = replica.log.first_entry() {
        state.refused.retain(|id| id.index >= first);
    }
    shared
        .counters
        .segments_deleted
        .fetch_add(paths.len() as u64, Ordering::Relaxed);
    tracing::info!(
        segments = paths.len(),
        through_entry = through,
        "retired segments below the retention watermarks and covered by a snapshot"
    );
    Ok(paths.len())
}

/// Whether segment `h` holds nothing retained: every event below its stream's watermark,
/// every state born in it carried forward. Adds the streams with events in it to `streams`.
fn dead(
    shared: &Shared,
    h: &crate::entry_log::HeldSegment,
    streams: &mut BTreeSet<u64>,
) -> Result<bool> {
    let born_here =
        shared
            .index
            .keys_in(&origin_key(0, 0, &[]), &origin_key(h.next_lsn, 0, &[]), 1)?;
    if !born_here.is_empty() {
        return Ok(false);
    }
    let summary = shared.summaries.get(&h.segment)?;
    for (stream, max_seq) in &summary.max_seq {
        // A stream no longer remembered (forgotten) keeps none of its events.
        let watermark = shared
            .index
            .stored_stream(*stream)?
            .map_or(u64::MAX, |s| s.meta.watermark);
        if *max_seq >= watermark {
            return Ok(false);
        }
    }
    streams.extend(summary.max_seq.keys().copied());
    Ok(true)
}
