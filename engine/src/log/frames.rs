//! The one frame walker: every scan of a segment (recovery, replay, retention's summaries,
//! verify, the upgrade) goes through [`walk`], over a whole image in memory or a segment
//! read window by window. Reads of single runs use [`crate::log::Log`]'s positioned reads.

use bytes::Bytes;

use crate::error::{CorruptionKind, Result};
use crate::format::{
    FrameHeader, BODY_BYTES_MAX, FRAME_HEADER_BYTES, HDR_BASE_ENTRY, HDR_PREV_TERM,
    SEGMENT_HEADER_BYTES,
};
use crate::log::{Position, Segment};
use crate::record::{check_frame, tag, FrameError, Record};

/// Where frames are read from.
pub(crate) trait FrameSource {
    /// The bytes from `offset` on: at least `need` of them unless the source ends first
    /// (then all that is left).
    ///
    /// # Errors
    /// I/O failures of a file-backed source.
    fn at(&mut self, offset: u64, need: u64) -> Result<&[u8]>;
    /// Total bytes.
    fn len(&self) -> u64;
}

impl FrameSource for &[u8] {
    fn at(&mut self, offset: u64, _need: u64) -> Result<&[u8]> {
        Ok(usize::try_from(offset)
            .ok()
            .and_then(|o| self.get(o..))
            .unwrap_or_default())
    }

    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
}

/// How much of a segment one positional read fetches ahead: a run of frames then costs one
/// `pread` per window instead of two per frame.
pub(crate) const READ_AHEAD_BYTES: u64 = 256 * 1024;

/// A window of a segment's written bytes, read with positional reads (never through the
/// map, so a scan does not leave the segment resident). Bytes below a segment's written
/// length never change (the log is append-only), so a window stays valid for the whole read.
#[derive(Debug, Default)]
pub(crate) struct ReadAhead {
    start: u64,
    /// A fresh buffer per window: the events read from the previous one share it.
    bytes: Bytes,
    /// How much one window reads (at least what is needed): [`READ_AHEAD_BYTES`] when 0.
    size: u64,
}

impl ReadAhead {
    /// Windows of about `size` bytes (at least one frame, at most [`READ_AHEAD_BYTES`]): a
    /// read that knows roughly how much it wants does not fetch (nor pin, in the events
    /// sharing the window) a whole read-ahead window.
    pub(crate) fn sized(size: u64) -> Self {
        Self {
            size: size.clamp(FRAME_HEADER_BYTES as u64, READ_AHEAD_BYTES),
            ..Self::default()
        }
    }

    /// The bytes from `offset` on, at least `need` of them unless the segment ends first.
    pub(crate) fn at(&mut self, seg: &Segment, offset: u64, need: u64) -> Result<&[u8]> {
        let (bytes, from) = self.window(seg, offset, need)?;
        Ok(bytes.get(from..).unwrap_or_default())
    }

    /// The window holding `offset .. offset + need` and where `offset` is in it.
    pub(crate) fn window(
        &mut self,
        seg: &Segment,
        offset: u64,
        need: u64,
    ) -> Result<(&Bytes, usize)> {
        let end = self.start + self.bytes.len() as u64;
        if offset < self.start || offset.saturating_add(need) > end {
            let size = match self.size {
                0 => READ_AHEAD_BYTES,
                n => n,
            };
            let len = need.max(size).min(seg.len().saturating_sub(offset));
            self.bytes = seg.read_unmapped(offset, len)?.into();
            self.start = offset;
        }
        let from = usize::try_from(offset - self.start).unwrap_or(usize::MAX);
        Ok((&self.bytes, from))
    }
}

/// A segment read window by window.
pub(crate) struct Windowed<'a> {
    seg: &'a Segment,
    ahead: ReadAhead,
}

impl<'a> Windowed<'a> {
    pub(crate) fn new(seg: &'a Segment) -> Self {
        Self {
            seg,
            ahead: ReadAhead::default(),
        }
    }
}

impl FrameSource for Windowed<'_> {
    fn at(&mut self, offset: u64, need: u64) -> Result<&[u8]> {
        self.ahead.at(self.seg, offset, need)
    }

    fn len(&self) -> u64 {
        self.seg.len()
    }
}

/// One CRC-checked frame found by [`walk`].
#[derive(Debug)]
pub(crate) struct FrameRef<'a> {
    /// Byte offset of the frame in its segment.
    pub offset: u64,
    /// Its header.
    pub header: FrameHeader,
    /// Its body (not yet decoded).
    pub body: &'a [u8],
}

/// How a walk of one segment's frames ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WalkEnd {
    /// End offset of the last complete group.
    pub valid_end: u64,
    /// LSN of the last record of the last complete group (`base - 1` if none).
    pub last_lsn: u64,
    /// Entry index of the last complete group (the header's `base_entry - 1` if none).
    pub last_entry: u64,
    /// Term of that entry (the header's `prev_term` if none).
    pub last_term: u64,
    /// Records in complete groups.
    pub records: u64,
    /// Where and why the walk stopped before the end of the bytes, if it did (an
    /// incomplete last group counts, at its start).
    pub damage: Option<(u64, CorruptionKind)>,
    /// The highest `synced_through` any frame walked claims.
    pub synced_through: u64,
}

/// What [`walk`] hands its visitor.
#[derive(Debug)]
pub(crate) enum Step<'a> {
    /// A frame whose length, CRC and LSN checked.
    Frame(FrameRef<'a>),
    /// The frame before was the last of its group.
    GroupEnd,
}

/// Walks the frames of one segment from its header on: checks each frame's length, CRC,
/// LSN (consecutive from `base_lsn`), entry (consecutive per group from the header's
/// `base_entry`, the same in every frame of a group) and term (the same in a group, never
/// below the entry before's, starting from the header's `prev_term`) and hands each to `visit`, then a
/// [`Step::GroupEnd`] after the last frame of each group. Stops at the first frame that
/// does not check, or that `visit` rejects (`Err(kind)` inside `Ok`: e.g. a body that does
/// not decode): that frame is damage like a bad CRC. Never panics on any bytes.
///
/// # Errors
/// I/O failures of the source; errors `visit` returns.
pub(crate) fn walk<S: FrameSource>(
    src: &mut S,
    base_lsn: u64,
    mut visit: impl FnMut(Step<'_>) -> Result<std::result::Result<(), CorruptionKind>>,
) -> Result<WalkEnd> {
    let header_end = SEGMENT_HEADER_BYTES as u64;
    // The header was checked by whoever opened the segment; the walk needs its entry start.
    let (base_entry, prev_term) = {
        let h = src.at(0, header_end)?;
        (le_u64_at(h, HDR_BASE_ENTRY), le_u64_at(h, HDR_PREV_TERM))
    };
    let mut end = WalkEnd {
        valid_end: header_end,
        last_lsn: base_lsn.saturating_sub(1),
        last_entry: base_entry.saturating_sub(1),
        last_term: prev_term,
        records: 0,
        damage: None,
        synced_through: header_end,
    };
    let mut offset = header_end;
    let mut expected_lsn = base_lsn;
    let mut in_group = 0u64;
    let mut group_term = None;
    let total = src.len();
    while offset < total {
        let head = src.at(offset, FRAME_HEADER_BYTES as u64)?;
        let Some(len) = frame_len_in(head) else {
            end.damage = Some((offset, bad_length(head)));
            break;
        };
        let bytes = src.at(offset, len)?;
        let header = match check_frame(bytes) {
            Ok(h) => h,
            Err(e) => {
                end.damage = Some((offset, frame_corruption(e)));
                break;
            }
        };
        if header.lsn != expected_lsn {
            end.damage = Some((
                offset,
                CorruptionKind::LsnGap {
                    expected: expected_lsn,
                    got: header.lsn,
                },
            ));
            break;
        }
        if header.entry != end.last_entry + 1 {
            end.damage = Some((
                offset,
                CorruptionKind::EntryGap {
                    expected: end.last_entry + 1,
                    got: header.entry,
                },
            ));
            break;
        }
        // The group's first frame sets its term; the rest must repeat it.
        let least_term = group_term.unwrap_or(end.last_term);
        if header.term < least_term || group_term.is_some_and(|t| t != header.term) {
            end.damage = Some((
                offset,
                CorruptionKind::TermBackwards {
                    previous: least_term,
                    got: header.term,
                },
            ));
            break;
        }
        group_term = Some(header.term);
        let body = bytes
            .get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + header.body_len as usize)
            .unwrap_or_default();
        if let Err(kind) = visit(Step::Frame(FrameRef {
            offset,
            header,
            body,
        }))? {
            end.damage = Some((offset, kind));
            break;
        }
        // A frame can only vouch for bytes before itself (see `claim`).
        end.synced_through = end.synced_through.max(claim(header.synced_through, offset));
        offset += len;
        expected_lsn += 1;
        in_group += 1;
        if header.group_left == 0 {
            if let Err(kind) = visit(Step::GroupEnd)? {
                end.damage = Some((offset, kind));
                break;
            }
            end.records += in_group;
            in_group = 0;
            end.last_lsn = expected_lsn - 1;
            end.last_entry = header.entry;
            end.last_term = header.term;
            group_term = None;
            end.valid_end = offset;
        }
    }
    if end.damage.is_none() && in_group > 0 {
        // The bytes ended inside a group: the rest of the group was never written.
        end.damage = Some((end.valid_end, CorruptionKind::BadLength(0)));
    }
    Ok(end)
}

/// Whether this build knows a frame's record type. A frame whose CRC checks with a type it
/// does not know was written by a newer build: [`CorruptionKind::UnknownRecordType`], which
/// is never a torn write and never cut (FORMAT.md, "Downgrades and unknown record types").
pub(crate) fn known_type(record_type: u8) -> std::result::Result<(), CorruptionKind> {
    if tag::is_known(record_type) {
        Ok(())
    } else {
        Err(CorruptionKind::UnknownRecordType(record_type))
    }
}

/// [`walk`], with a frame of a record type this build does not know reported as
/// [`CorruptionKind::UnknownRecordType`] before `visit` sees it. Every walk that decides what
/// a segment holds, or what of it to cut, goes through this one.
///
/// # Errors
/// As [`walk`].
pub(crate) fn walk_known<S: FrameSource>(
    src: &mut S,
    base_lsn: u64,
    mut visit: impl FnMut(Step<'_>) -> Result<std::result::Result<(), CorruptionKind>>,
) -> Result<WalkEnd> {
    walk(src, base_lsn, |step| {
        if let Step::Frame(f) = &step {
            if let Err(kind) = known_type(f.header.record_type) {
                return Ok(Err(kind));
            }
        }
        visit(step)
    })
}

/// [`walk_known`], with each complete group's records decoded and handed to `on_group` with
/// their LSNs and positions (a body that does not decode is damage, like a bad CRC).
///
/// # Errors
/// As [`walk`].
pub(crate) fn walk_groups<S: FrameSource>(
    src: &mut S,
    base_lsn: u64,
    mut on_group: impl FnMut(&[(u64, Position, Record)]) -> Result<()>,
) -> Result<WalkEnd> {
    let mut group: Vec<(u64, Position, Record)> = Vec::new();
    walk_known(src, base_lsn, |step| {
        match step {
            Step::Frame(f) => match Record::decode(f.header.record_type, f.body) {
                Ok(record) => {
                    let pos = Position {
                        segment: base_lsn,
                        offset: f.offset,
                        len: u32::try_from(f.header.frame_len()).unwrap_or(u32::MAX),
                    };
                    group.push((f.header.lsn, pos, record));
                }
                Err(why) => return Ok(Err(CorruptionKind::BadBody(why))),
            },
            Step::GroupEnd => {
                on_group(&group)?;
                group.clear();
            }
        }
        Ok(Ok(()))
    })
}

/// The little-endian u64 at `at` in `b` (0 where `b` is too short).
fn le_u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The frame length a frame header at the start of `b` claims, if it is within bounds.
pub(crate) fn frame_len_in(b: &[u8]) -> Option<u64> {
    let raw = b.get(..FRAME_HEADER_BYTES)?.try_into().ok()?;
    let header = FrameHeader::read(raw);
    (header.body_len <= BODY_BYTES_MAX).then(|| header.frame_len())
}

fn bad_length(head: &[u8]) -> CorruptionKind {
    let claimed = head
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, |b| u64::from(u32::from_le_bytes(b)));
    CorruptionKind::BadLength(if head.len() < FRAME_HEADER_BYTES {
        0
    } else {
        claimed
    })
}

/// The corruption kind of a frame that does not check.
pub(crate) fn frame_corruption(e: FrameError) -> CorruptionKind {
    match e {
        FrameError::Truncated => CorruptionKind::BadLength(0),
        FrameError::BadLength(n) => CorruptionKind::BadLength(n),
        FrameError::Crc { got, expected } => CorruptionKind::Crc { got, expected },
        FrameError::BadBody(why) => CorruptionKind::BadBody(why),
    }
}

/// What damage at the end of the last segment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TailDamage {
    /// No damage.
    None,
    /// Bytes written after the last sync that a crash tore, in any pattern (a prefix, or
    /// any subset of sectors): never acknowledged under `sync=always`. Cut at `valid_end`.
    Unsynced {
        /// CRC-valid frames found after the damage (dropped with it).
        valid_frames_after: u64,
    },
    /// A frame claims the bytes at or after `valid_end` were synced: this is damage to
    /// durable data, not a torn write. Recovery refuses it.
    Synced {
        /// The highest synced offset any surviving frame claims.
        synced_through: u64,
    },
    /// A frame whose CRC checks carries a record type this build does not know (the walk
    /// found [`CorruptionKind::UnknownRecordType`]): a newer build's record, never a torn
    /// write, wherever it is. Recovery, verify and repair refuse it and never cut it.
    UnknownRecordType(u8),
}

/// Classifies the damage a walk of the tail segment found: it is a torn unsynced write
/// unless some CRC-valid frame, before or after the damage, says the bytes there had been
/// synced (`synced_through` beyond the last complete group's end), or the damage is a frame
/// of a record type this build does not know (never torn).
pub(crate) fn classify_tail(bytes: &[u8], end: &WalkEnd) -> TailDamage {
    let damage_at = match end.damage {
        None => return TailDamage::None,
        Some((_, CorruptionKind::UnknownRecordType(t))) => return TailDamage::UnknownRecordType(t),
        Some((at, _)) => at,
    };
    let (after, synced_after) = valid_frames_after(bytes, damage_at, end.last_lsn);
    let synced = end.synced_through.max(synced_after);
    if synced > end.valid_end {
        TailDamage::Synced {
            synced_through: synced,
        }
    } else {
        TailDamage::Unsynced {
            valid_frames_after: after,
        }
    }
}

/// What a frame at `offset` claiming `synced_through` vouches for. A writer only ever
/// claims bytes written before the frame, so a frame claiming more is not a frame this
/// writer wrote (CRC-32 is no defence against a client who picks the bytes: a forged frame
/// can sit inside an event's payload) and its claim is ignored. See FORMAT.md, invariant 3,
/// for what a forged claim below its own offset can still do.
fn claim(synced_through: u64, offset: u64) -> u64 {
    if synced_through <= offset {
        synced_through
    } else {
        0
    }
}

/// CRC-valid frames with an LSN above `after_lsn` that start anywhere after `from`: their
/// count and the highest `synced_through` they claim (see [`claim`]). A
/// frame is skipped whole once found, so frames inside a valid frame's payload are never
/// seen.
pub(crate) fn valid_frames_after(bytes: &[u8], from: u64, after_lsn: u64) -> (u64, u64) {
    let start = usize::try_from(from).unwrap_or(usize::MAX);
    let mut count = 0;
    let mut synced = 0;
    let mut at = start.saturating_add(1);
    while at + FRAME_HEADER_BYTES <= bytes.len() {
        let Some(rest) = bytes.get(at..) else { break };
        let Some(raw) = rest
            .get(..FRAME_HEADER_BYTES)
            .and_then(|s| <&[u8; FRAME_HEADER_BYTES]>::try_from(s).ok())
        else {
            break;
        };
        let h = FrameHeader::read(raw);
        if h.lsn > after_lsn
            && h.lsn < after_lsn.saturating_add(1 << 32)
            && h.body_len <= BODY_BYTES_MAX
            && check_frame(rest).is_ok()
        {
            count += 1;
            synced = synced.max(claim(h.synced_through, at as u64));
            at += usize::try_from(h.frame_len()).unwrap_or(1);
        } else {
            at += 1;
        }
    }
    (count, synced)
}

#[cfg(test)]
mod tests;
