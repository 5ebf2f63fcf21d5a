//! Reading entries back: the entry→offset table of each segment (built on first use by
//! walking it), and an entry's frames read and checked (CRC, entry index, one term).

use std::sync::Arc;

use bytes::Bytes;

use super::{EntryId, EntryPayload, Inner, LogEntry, Proposal};
use crate::error::{CorruptionKind, Error, Result};
use crate::format::{FrameHeader, FRAME_HEADER_BYTES};
use crate::log::frames::{walk, ReadAhead, Step, Windowed};
use crate::log::{Position, Segment};
use crate::record::check_frame;

impl Inner {
    /// The segment holding entry `index` and the offset of its first frame (the segment's
    /// offsets built first if need be); `None` if the log does not hold it.
    pub(super) fn locate(&mut self, index: u64) -> Result<Option<(Arc<Segment>, u64)>> {
        let next = self.writer.next().entry;
        if index == 0 || index >= next {
            return Ok(None);
        }
        let Some((&base, entries)) = self.offsets.range_mut(..=index).next_back() else {
            return Ok(None);
        };
        if entries.offsets.is_none() {
            entries.offsets = Some(entry_offsets(&entries.segment, base)?);
        }
        let offsets = entries.offsets.as_deref().unwrap_or_default();
        let at = usize::try_from(index - base).unwrap_or(usize::MAX);
        Ok(offsets.get(at).map(|&o| (Arc::clone(&entries.segment), o)))
    }

    /// The entries with indexes in `from..to` that the log holds.
    /// Purged entries are not returned (openraft asks only for what it did not purge).
    pub(super) fn read(&mut self, from: u64, to: u64) -> Result<Vec<LogEntry>> {
        let first = self.purged.map_or(1, |p| p.id.index + 1);
        let (from, to) = (from.max(first), to.min(self.writer.next().entry));
        // The same answer as `EntryLog::read_cached`'s.
        if let Some(cached) = self.tail.entries(from, to) {
            return Ok(cached);
        }
        self.each_entry(from, to, read_entry)
    }

    /// The entries with indexes in `from..to` that the log holds, frame by frame with
    /// their LSNs and positions (what applying them to the index needs). Purged entries
    /// are returned too while their segments are kept: a purge only says Raft no longer
    /// needs them as log entries; the engine's state is still built from them.
    pub(super) fn read_placed(
        &mut self,
        from: u64,
        to: u64,
    ) -> Result<Vec<(EntryId, Vec<PlacedFrame>)>> {
        let to = to.min(self.writer.next().entry);
        if let Some(cached) = self.tail.placed(from, to) {
            return Ok(cached);
        }
        self.each_entry(from, to, read_frames)
    }

    /// `read_one` over each entry the log holds with an index in `from..to`, given its
    /// segment, a read-ahead window shared by the entries of one segment, its first frame's
    /// offset and its index.
    fn each_entry<T>(
        &mut self,
        from: u64,
        to: u64,
        read_one: impl Fn(&Segment, &mut ReadAhead, u64, u64) -> Result<T>,
    ) -> Result<Vec<T>> {
        let first = self.offsets.keys().next().copied().unwrap_or(1);
        let mut out = Vec::new();
        let mut ahead = ReadAhead::default();
        let mut current: Option<u64> = None;
        for index in from.max(first)..to.min(self.writer.next().entry) {
            let Some((segment, offset)) = self.locate(index)? else {
                // Every index from the first held to the last is in some segment: a miss is
                // a segment gone from the middle of the log, never an answer to shorten.
                return Err(self.hole(index));
            };
            if current != Some(segment.base_lsn()) {
                ahead = ReadAhead::default();
                current = Some(segment.base_lsn());
            }
            out.push(read_one(&segment, &mut ahead, offset, index)?);
        }
        Ok(out)
    }

    /// The error for entry `index` missing between the first and the last held: the
    /// segment that held it is gone, or the next one does not start where this one ends.
    fn hole(&self, index: u64) -> Error {
        let (segment, offset) = self
            .offsets
            .range(..=index)
            .next_back()
            .map_or((self.dir.clone(), 0), |(_, s)| {
                (s.segment.path().to_path_buf(), s.segment.len())
            });
        Error::Corruption {
            segment,
            offset,
            kind: CorruptionKind::EntryGap {
                expected: index,
                got: self
                    .offsets
                    .range(index..)
                    .next()
                    .map_or(self.writer.next().entry, |(b, _)| *b),
            },
        }
    }
}

/// The offsets of the first frame of every complete entry in `seg`, whose first entry is
/// `base` (the walk checks every frame's entry and term against the header's).
fn entry_offsets(seg: &Segment, base: u64) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut group_start = None;
    let end = walk(&mut Windowed::new(seg), seg.base_lsn(), |step| {
        match step {
            Step::Frame(f) => {
                group_start.get_or_insert(f.offset);
            }
            Step::GroupEnd => out.extend(group_start.take()),
        }
        Ok(Ok(()))
    })?;
    if let Some((offset, kind)) = end.damage {
        if offset < seg.len() && seg.is_sealed() {
            return Err(seg.corruption(offset, kind));
        }
    }
    debug_assert_eq!(end.last_entry + 1, base + out.len() as u64);
    Ok(out)
}

/// The header of the frame at `offset`, checked with its body.
pub(super) fn frame_header(
    seg: &Segment,
    ahead: &mut ReadAhead,
    offset: u64,
) -> Result<FrameHeader> {
    let head = ahead.at(seg, offset, FRAME_HEADER_BYTES as u64)?;
    let len = crate::log::frames::frame_len_in(head)
        .ok_or_else(|| seg.corruption(offset, CorruptionKind::BadLength(0)))?;
    let bytes = ahead.at(seg, offset, len)?;
    check_frame(bytes).map_err(|e| seg.corruption(offset, crate::log::frames::frame_corruption(e)))
}

/// Reads the entry whose first frame is at `offset`.
/// One stored frame of an entry: its LSN, where it is, its record type and body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PlacedFrame {
    pub lsn: u64,
    pub position: Position,
    pub tag: u8,
    pub body: Bytes,
}

/// Reads the frames of the entry whose first frame is at `offset`, checking that each
/// carries the entry's index and one term.
fn read_frames(
    seg: &Segment,
    ahead: &mut ReadAhead,
    mut offset: u64,
    index: u64,
) -> Result<(EntryId, Vec<PlacedFrame>)> {
    let mut frames = Vec::new();
    let mut term = None;
    loop {
        let header = frame_header(seg, ahead, offset)?;
        if header.entry != index || term.is_some_and(|t| t != header.term) {
            return Err(seg.corruption(
                offset,
                CorruptionKind::EntryGap {
                    expected: index,
                    got: header.entry,
                },
            ));
        }
        term = Some(header.term);
        let bytes = ahead.at(seg, offset, header.frame_len())?;
        let body = bytes
            .get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + header.body_len as usize)
            .unwrap_or_default();
        frames.push(PlacedFrame {
            lsn: header.lsn,
            position: Position {
                segment: seg.base_lsn(),
                offset,
                len: u32::try_from(header.frame_len()).unwrap_or(u32::MAX),
            },
            tag: header.record_type,
            body: Bytes::copy_from_slice(body),
        });
        offset += header.frame_len();
        if header.group_left == 0 {
            break;
        }
    }
    let id = EntryId {
        term: term.unwrap_or(0),
        index,
    };
    Ok((id, frames))
}

/// Reads the entry whose first frame is at `offset`.
pub(super) fn read_entry(
    seg: &Segment,
    ahead: &mut ReadAhead,
    offset: u64,
    index: u64,
) -> Result<LogEntry> {
    let (id, frames) = read_frames(seg, ahead, offset, index)?;
    let payload = match frames.as_slice() {
        [f] if f.tag == crate::record::tag::BLANK => EntryPayload::Blank,
        [f] if f.tag == crate::record::tag::MEMBERSHIP => EntryPayload::Membership(f.body.to_vec()),
        _ => EntryPayload::Records(Proposal::from_raw(
            frames.into_iter().map(|f| (f.tag, f.body)),
        )),
    };
    Ok(LogEntry { id, payload })
}
