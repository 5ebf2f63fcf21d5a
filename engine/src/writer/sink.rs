//! Where the writer's planned groups go: a single node's segment log ([`LogWriter`]), or, on
//! a replicated node's leader, a batch of proposals for consensus ([`Proposals`]).
//!
//! The planner (`plan.rs`) is the same for both: it asks the sink for the LSN its next
//! record gets (a stream id is the LSN of its `StreamOpened`) and where a frame will lie. A
//! proposing sink *predicts* LSNs: the log's next LSN when the batch starts, plus the
//! records planned since (in this batch and in the batches still in flight before it: see
//! `pipeline.rs`). The apply rules check the prediction on every replica (`StreamIdNotLsn`),
//! so a wrong one refuses the entry, never corrupts state.
//!
//! A proposing sink merges a batch's groups into as few entries as it can: consecutive
//! groups share an entry up to [`Proposer::entry_bytes_max`] bytes of proposal (a group
//! larger than that is an entry of its own). openraft's work is per entry (log ids,
//! replication bookkeeping, an apply call, a responder each), and a batch at 50 producers
//! holds 20–50 groups. Apply checks an entry's records in order against the state the ones
//! before left, so merged groups apply as consecutive groups would, except that one refused
//! record refuses its whole entry: `pipeline.rs` answers every request of it from that.

use std::ops::Range;
use std::sync::Arc;

use crate::entry_log::{EntryLog, Proposal, ProposalBuilder, RECORD_HEAD_BYTES};
use crate::error::{Error, Result};
use crate::format::{FrameHeader, FRAME_HEADER_BYTES};
use crate::log::{LogPoint, LogWriter, WriteError};
use crate::propose::Proposer;
use crate::record::FrameStamp;

use super::pipeline::Pipeline;

/// A leader's batch of planned groups, not yet proposed.
#[derive(Debug)]
pub(crate) struct Proposals {
    pub(crate) proposer: Arc<dyn Proposer>,
    /// The batches proposed and not settled yet.
    pub(super) pipeline: Arc<Pipeline>,
    log: EntryLog,
    /// The LSN the next planned record is predicted to get.
    next_lsn: u64,
    /// The entries of this batch so far: their proposals (being built), and which of the
    /// batch's groups (numbered from its first) each holds.
    entries: Vec<(ProposalBuilder, Range<usize>)>,
    /// The most proposal bytes an entry of several groups holds.
    entry_bytes_max: usize,
}

impl Proposals {
    pub(crate) fn new(proposer: Arc<dyn Proposer>, log: EntryLog) -> Self {
        let next_lsn = log.next_lsn();
        let entry_bytes_max = proposer.entry_bytes_max();
        Self {
            proposer,
            pipeline: Arc::default(),
            log,
            next_lsn,
            entries: Vec::new(),
            entry_bytes_max,
        }
    }

    /// Starts a window of pipelined batches: everything proposed before is settled, so the
    /// log's next LSN is where its first record lands (unless an entry of openraft's own, a
    /// blank or a membership change, slips in first: then the apply rules refuse what
    /// depended on it).
    pub(crate) fn start_window(&mut self) {
        self.entries.clear();
        self.next_lsn = self.log.next_lsn();
    }

    /// Starts a batch in the current window: its records are predicted to follow those of
    /// the window's batches before it.
    pub(crate) fn start_batch(&mut self) {
        self.entries.clear();
        self.entry_bytes_max = self.proposer.entry_bytes_max();
    }

    /// The entries of this batch, taken: their proposals, and which of the batch's groups
    /// each holds (consecutive ranges from 0, one per entry, in order).
    pub(crate) fn take(&mut self) -> (Vec<Proposal>, Vec<Range<usize>>) {
        std::mem::take(&mut self.entries)
            .into_iter()
            .map(|(entry, groups)| (entry.finish(), groups))
            .unzip()
    }

    /// How many groups this batch planned so far.
    pub(crate) fn len(&self) -> usize {
        self.entries.last().map_or(0, |(_, groups)| groups.end)
    }

    /// Adds the next planned group, of `count` records framed as `frames`: to the last
    /// entry while it fits under the cap, else as a new entry. Each body is copied once,
    /// from the frames into the entry's proposal (the frames were just encoded by the
    /// planner: their CRCs are not checked again).
    fn push_group(&mut self, frames: &[u8], count: usize) -> Result<()> {
        let records = planned_records(frames, count)?;
        // The group's records as a proposal of their own would take this many bytes.
        let bytes = 4 + records
            .iter()
            .map(|(_, body)| RECORD_HEAD_BYTES + body.len())
            .sum::<usize>();
        let n = self.len();
        let fits = matches!(self.entries.last(),
            Some((entry, _)) if entry.len() + bytes - 4 <= self.entry_bytes_max);
        if !fits {
            self.entries
                .push((ProposalBuilder::with_capacity(bytes), n..n));
        }
        if let Some((entry, groups)) = self.entries.last_mut() {
            groups.end = n + 1;
            for (tag, body) in records {
                entry.push(tag, body);
            }
        }
        Ok(())
    }
}

/// The writer's destination.
#[derive(Debug)]
pub(crate) enum Sink {
    /// A single node: groups are written and synced here.
    Segments(LogWriter),
    /// A replicated node's leader: groups are proposed.
    Proposals(Proposals),
}

impl Sink {
    /// The LSN the next record gets (predicted, when proposing).
    pub(crate) fn next_lsn(&self) -> u64 {
        match self {
            Self::Segments(log) => log.next_lsn(),
            Self::Proposals(p) => p.next_lsn,
        }
    }

    /// Where the next group goes.
    pub(crate) fn next(&self) -> LogPoint {
        match self {
            Self::Segments(log) => log.next(),
            Self::Proposals(p) => LogPoint {
                lsn: p.next_lsn,
                entry: 0,
                prev_term: 0,
            },
        }
    }

    /// Forgets the groups planned after `to`. A proposing sink forgets its whole batch (the
    /// writer fails the batch whenever it rewinds).
    pub(crate) fn rewind(&mut self, to: LogPoint) {
        match self {
            Self::Segments(log) => log.rewind(to),
            Self::Proposals(p) => {
                p.entries.clear();
                p.next_lsn = to.lsn;
            }
        }
    }

    /// The segment and offset the first frame of a group planned next will have. A proposal
    /// has no place yet: its frames are placed relative to the group buffer (segment 0),
    /// which only the batch's own planning reads.
    pub(crate) fn frame_origin(&self) -> (u64, u64) {
        match self {
            Self::Segments(log) => (log.active().base_lsn(), log.active().len()),
            Self::Proposals(_) => (0, 0),
        }
    }

    /// The frame header of record `i` of a group of `count`.
    pub(crate) fn stamp(&self, i: usize, count: usize) -> FrameStamp {
        match self {
            Self::Segments(log) => log.stamp(i, count),
            Self::Proposals(p) => FrameStamp {
                lsn: p.next_lsn + i as u64,
                entry: 0,
                term: 0,
                group_left: u32::try_from(count.saturating_sub(i + 1)).unwrap_or(u32::MAX),
                synced_through: 0,
            },
        }
    }

    /// Moves past a planned group of `count` records whose frames are `frames` (a proposing
    /// sink keeps them as the group's proposal).
    pub(crate) fn advance(&mut self, count: usize, frames: &[u8]) -> Result<()> {
        match self {
            Self::Segments(log) => {
                log.advance(count);
                Ok(())
            }
            Self::Proposals(p) => {
                p.push_group(frames, count)?;
                p.next_lsn += count as u64;
                Ok(())
            }
        }
    }

    pub(crate) fn has_unsynced(&self) -> bool {
        match self {
            Self::Segments(log) => log.has_unsynced(),
            Self::Proposals(_) => false,
        }
    }

    pub(crate) fn sync(&mut self) -> Result<()> {
        match self {
            Self::Segments(log) => log.sync(),
            Self::Proposals(_) => Ok(()),
        }
    }

    pub(crate) fn close_cleanly(&mut self) -> Result<()> {
        match self {
            Self::Segments(log) => log.close_cleanly(),
            // A replicated node's log is closed by its entry log (openraft's storage).
            Self::Proposals(_) => Ok(()),
        }
    }

    pub(crate) fn rotate_if_full(&mut self, max_bytes: u64) -> std::result::Result<(), WriteError> {
        match self {
            Self::Segments(log) => log.rotate_if_full(max_bytes),
            Self::Proposals(_) => Ok(()),
        }
    }

    pub(crate) fn write(&mut self, frames: &[u8]) -> std::result::Result<(), WriteError> {
        match self {
            Self::Segments(log) => log.write(frames),
            Self::Proposals(_) => Err(WriteError::Fatal(Error::Internal(
                "a replicated node's writer wrote instead of proposing".into(),
            ))),
        }
    }
}

/// The records of one planned group from its encoded frames (header, then body, each): tag
/// and body, the body a slice of `frames`.
fn planned_records(frames: &[u8], count: usize) -> Result<Vec<(u8, &[u8])>> {
    let mut records = Vec::with_capacity(count);
    let mut at = 0usize;
    while at < frames.len() {
        let header = frames
            .get(at..at + FRAME_HEADER_BYTES)
            .and_then(|h| h.try_into().ok())
            .map(FrameHeader::read)
            .ok_or_else(|| Error::Internal("a planned frame header is cut short".into()))?;
        debug_assert!(crate::record::check_frame(&frames[at..]).is_ok());
        let body_at = at + FRAME_HEADER_BYTES;
        let end = body_at + header.body_len as usize;
        let body = frames
            .get(body_at..end)
            .ok_or_else(|| Error::Internal("a planned frame is cut short".into()))?;
        records.push((header.record_type, body));
        at = end;
    }
    if records.len() != count {
        return Err(Error::Internal(format!(
            "a planned group of {count} records holds {} frames",
            records.len()
        )));
    }
    Ok(records)
}
