//! The log's tail, kept in memory: the entries written last, as they were given (their
//! proposals' bytes shared, not copied), with where their frames lie.
//!
//! Why (issue 31, the review's "Leader CPU per event"): openraft reads every new entry back
//! once per follower to send it (`try_get_log_entries`), and a replica's apply reads the
//! entries it applies; each read was a `pread`, a CRC check of every frame and two copies of
//! every body. Entries still in the tail are answered from it instead. What the tail answers
//! is exactly what reading the segment back answers (the frames are written from these
//! bytes), so it is a cache and nothing else: every call that cuts, replaces or restarts the
//! log empties it or cuts it alike.

use std::collections::VecDeque;

use bytes::Bytes;

use super::read::PlacedFrame;
use super::{EntryId, LogEntry};
use crate::format::FRAME_HEADER_BYTES;
use crate::log::Position;

/// At most this many bytes of proposals are kept (the last few batches at any load).
const TAIL_BYTES_MAX: usize = 8 << 20;
/// At most this many entries are kept.
const TAIL_ENTRIES_MAX: usize = 4096;

/// The entries written last, consecutive, the last of them the log's last entry.
#[derive(Debug, Default)]
pub(super) struct Tail {
    entries: VecDeque<Cached>,
    bytes: usize,
}

/// One entry of the tail.
#[derive(Debug)]
struct Cached {
    entry: LogEntry,
    /// Its records, as tag and body (slices of the proposal's bytes).
    records: Vec<(u8, Bytes)>,
    /// The base LSN of the segment holding it.
    segment: u64,
    /// The offset of its first frame in that segment.
    offset: u64,
    /// Its first record's LSN.
    lsn: u64,
    /// The bytes it holds.
    bytes: usize,
}

impl Tail {
    /// Forgets every entry.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Adds `entry`, the log's new last entry (written as `records`, its first frame at
    /// `offset` of segment `segment`, its first record with LSN `lsn`). An entry that does
    /// not follow the last one kept empties the tail first.
    pub(super) fn push(
        &mut self,
        entry: &LogEntry,
        records: Vec<(u8, Bytes)>,
        segment: u64,
        offset: u64,
        lsn: u64,
    ) {
        if self
            .entries
            .back()
            .is_some_and(|last| last.entry.id.index + 1 != entry.id.index)
        {
            self.clear();
        }
        let bytes = records.iter().map(|(_, b)| b.len()).sum::<usize>() + 64;
        self.entries.push_back(Cached {
            entry: entry.clone(),
            records,
            segment,
            offset,
            lsn,
            bytes,
        });
        self.bytes += bytes;
        while self.bytes > TAIL_BYTES_MAX || self.entries.len() > TAIL_ENTRIES_MAX {
            match self.entries.pop_front() {
                Some(c) => self.bytes -= c.bytes,
                None => break,
            }
        }
    }

    /// Forgets the entries after `keep` (a cut suffix).
    pub(super) fn truncate_after(&mut self, keep: u64) {
        while self.entries.back().is_some_and(|c| c.entry.id.index > keep) {
            if let Some(c) = self.entries.pop_back() {
                self.bytes -= c.bytes;
            }
        }
    }

    /// Forgets the entries up to `through` (a purged prefix).
    pub(super) fn drop_through(&mut self, through: u64) {
        while self
            .entries
            .front()
            .is_some_and(|c| c.entry.id.index <= through)
        {
            if let Some(c) = self.entries.pop_front() {
                self.bytes -= c.bytes;
            }
        }
    }

    /// The cached entries `from..to`, when the tail holds `from` (it then holds every
    /// entry after it the log holds); `None` otherwise.
    fn range(&self, from: u64, to: u64) -> Option<impl Iterator<Item = &Cached>> {
        let first = self.entries.front()?.entry.id.index;
        if from < first {
            return None;
        }
        let skip = usize::try_from(from - first).ok()?;
        let take = usize::try_from(to.saturating_sub(from)).unwrap_or(usize::MAX);
        Some(self.entries.iter().skip(skip).take(take))
    }

    /// [`super::Inner::read`]'s answer from the tail, if it holds `from`.
    pub(super) fn entries(&self, from: u64, to: u64) -> Option<Vec<LogEntry>> {
        Some(self.range(from, to)?.map(|c| c.entry.clone()).collect())
    }

    /// [`super::Inner::read_placed`]'s answer from the tail, if it holds `from`.
    pub(super) fn placed(&self, from: u64, to: u64) -> Option<Vec<(EntryId, Vec<PlacedFrame>)>> {
        Some(self.range(from, to)?.map(Cached::placed).collect())
    }
}

impl Cached {
    /// The entry's frames, as reading them back from the segment gives them.
    fn placed(&self) -> (EntryId, Vec<PlacedFrame>) {
        let mut offset = self.offset;
        let frames = self
            .records
            .iter()
            .enumerate()
            .map(|(i, (tag, body))| {
                let len = (FRAME_HEADER_BYTES + body.len()) as u64;
                let frame = PlacedFrame {
                    lsn: self.lsn + i as u64,
                    position: Position {
                        segment: self.segment,
                        offset,
                        len: u32::try_from(len).unwrap_or(u32::MAX),
                    },
                    tag: *tag,
                    body: body.clone(),
                };
                offset += len;
                frame
            })
            .collect();
        (self.entry.id, frames)
    }
}
