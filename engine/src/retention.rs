//! Retention: raises watermarks by age and total size, and retires whole segments once
//! nothing in them is retained.
//!
//! A pass looks at sealed segments oldest first. Segments past `max_age`, or needed to get
//! under `max_total_bytes`, have the watermarks of every stream in them raised past their
//! events (durably, through the writer). Then the longest prefix of sealed segments whose
//! events all lie below their streams' watermarks is retired: the writer first carries the
//! state born in them forward (snapshot records), syncs, and only then unlinks the files.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::sync::atomic::Ordering;

use crate::clock::duration_ms;
use crate::error::Result;
use crate::index::KvRead;
use crate::log::Segment;
use crate::mailbox::{Command, Reply};
use crate::shared::Shared;

/// Most states one carry-forward or forget group holds: a retirement is many small groups,
/// never one that grows with the live state.
pub(crate) const CARRY_GROUP_MAX: usize = 1024;

/// What one pass decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Watermarks to raise (stream, new watermark).
    pub raise: Vec<(u64, u64)>,
    /// Segments to retire, the LSN below which all their records lie, and the streams with
    /// events in them.
    pub retire: Option<(Vec<u64>, u64, Vec<u64>)>,
}

/// Decides what to evict and retire now. Pure apart from reading segments and the index.
pub(crate) fn plan(shared: &Shared) -> Result<Plan> {
    let cfg = &shared.config.retention;
    let all = shared.log.all();
    let Some((_, sealed)) = all.split_last() else {
        return Ok(Plan::default());
    };
    let sealed: Vec<Arc<Segment>> = sealed.iter().filter(|s| s.is_sealed()).cloned().collect();
    let now = shared.now_ms();
    let low_disk = shared.low_disk.load(Ordering::Acquire);
    let mut total: u64 = all.iter().map(|s| s.len()).sum();
    let mut plan = Plan::default();
    let mut wanted: BTreeMap<u64, u64> = BTreeMap::new();
    let mut retire = Vec::new();
    let mut retire_below = 0;
    let mut retired_streams = std::collections::BTreeSet::new();
    let bases: Vec<u64> = all.iter().map(|s| s.base_lsn()).collect();
    shared.summaries.keep_only(&bases);
    for (i, seg) in sealed.iter().enumerate() {
        let summary = shared.summaries.get(seg)?;
        let summary = &*summary;
        let too_old = cfg
            .max_age
            .is_some_and(|age| summary.newest_ms.saturating_add(duration_ms(age)) < now);
        let too_big = cfg.max_total_bytes.is_some_and(|max| total > max);
        let mut dead = true;
        for (stream, max_seq) in &summary.max_seq {
            // A stream that is no longer remembered (forgotten) keeps none of its events.
            let watermark = shared
                .index
                .stored_stream(*stream)?
                .map_or(u64::MAX, |s| s.meta.watermark);
            let raised = wanted.get(stream).copied().unwrap_or(0);
            if *max_seq >= watermark.max(raised) {
                if too_old || too_big {
                    wanted.insert(*stream, max_seq + 1);
                } else {
                    dead = false;
                }
            }
        }
        if !dead {
            break;
        }
        total = total.saturating_sub(seg.len());
        retire.push(seg.base_lsn());
        retired_streams.extend(summary.max_seq.keys().copied());
        retire_below = all.get(i + 1).map_or(0, |n| n.base_lsn());
        if low_disk {
            // Short of space: one segment at a time, so carrying its state forward never
            // needs more than a segment's worth of the reserve.
            break;
        }
    }
    plan.raise = wanted.into_iter().collect();
    if !retire.is_empty() {
        plan.retire = Some((retire, retire_below, retired_streams.into_iter().collect()));
    }
    Ok(plan)
}

/// Runs one pass, sending the writer what the plan needs: forget what is past the metadata
/// horizon, raise watermarks, carry the state born in the retirable segments forward in
/// bounded groups, and only then retire them. Returns the segments retired.
///
/// On a cluster's leader (`member`) the writer proposes what it plans, and the pass stops
/// after the carry-forward: each member unlinks its own segments once a snapshot covers
/// them (`member.rs`), so it returns 0.
///
/// # Errors
/// Write or index failures; a retirement refused because its state was not all carried.
pub(crate) fn run_pass(
    shared: &Shared,
    submit: &dyn Fn(Command) -> Result<Reply>,
    member: bool,
) -> Result<usize> {
    let _one = shared
        .retention_lock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    while let Reply::Count(n) = submit(Command::Forget {
        limit: CARRY_GROUP_MAX,
    })? {
        if n == 0 {
            break;
        }
    }
    let mut retired = 0;
    loop {
        let plan = plan(shared)?;
        for (stream, watermark) in &plan.raise {
            match submit(Command::Trim {
                session: None,
                stream: *stream,
                watermark: *watermark,
            }) {
                Ok(_) | Err(crate::Error::UnknownStream(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let Some((bases, below_lsn, streams)) = plan.retire else {
            return Ok(retired);
        };
        while let Reply::Count(n) = submit(Command::CarryForward {
            below_lsn,
            limit: CARRY_GROUP_MAX,
        })? {
            if n == 0 {
                break;
            }
        }
        if member {
            return Ok(retired);
        }
        let n = bases.len();
        submit(Command::Retire {
            below_lsn,
            bases,
            streams,
        })?;
        retired += n;
        if !shared.low_disk.load(Ordering::Acquire) {
            return Ok(retired);
        }
    }
}

#[cfg(test)]
mod tests;
