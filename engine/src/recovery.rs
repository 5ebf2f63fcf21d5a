//! Opening a data directory: lock, header checks, torn-tail truncation, replay into the
//! index. Also the offline `verify` of every segment.

use std::fs::{File, OpenOptions};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::apply::apply;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::{
    decode_segment_header, parse_segment_name, FrameHeader, HeaderError, BODY_BYTES_MAX,
    FRAME_HEADER_BYTES, INDEX_DIR, LOCK_FILE, SEGMENT_HEADER_BYTES,
};
use crate::fs::FileSystem;
use crate::index::{Index, Txn};
use crate::log::{Position, SegmentSet};
use crate::record::{check_frame, decode_frame, FrameError, Record};
use crate::segment::{sync_dir, Segment};

/// What opening the data directory did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files found.
    pub segments: u64,
    /// Records replayed into the index.
    pub records_replayed: u64,
    /// Bytes cut from a torn tail of the last segment.
    pub bytes_truncated: u64,
    /// The index was rebuilt from the whole log (missing, stale, ahead or of another version).
    pub index_rebuilt: bool,
    /// Time taken.
    pub elapsed: Duration,
    /// The last LSN in the log after recovery.
    pub last_lsn: u64,
}

impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} segments, last lsn {}, replayed {} records{}, truncated {} torn bytes, in {} ms",
            self.segments,
            self.last_lsn,
            self.records_replayed,
            if self.index_rebuilt {
                " (index rebuilt from the log)"
            } else {
                ""
            },
            self.bytes_truncated,
            self.elapsed.as_millis()
        )
    }
}

/// How a scan of one segment's bytes ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanEnd {
    /// End offset of the last complete group.
    pub valid_end: u64,
    /// LSN of the last record of the last complete group (`base - 1` if none).
    pub last_lsn: u64,
    /// Records in complete groups.
    pub records: u64,
    /// Where and why scanning stopped before the end of the bytes, if it did.
    pub damage: Option<(u64, CorruptionKind)>,
    /// Where scanning stopped: the first frame that failed, or the end of the bytes.
    pub stop_offset: u64,
    /// The LSN the frame at `stop_offset` had to carry.
    pub stop_lsn: u64,
}

impl ScanEnd {
    /// True when the damage (if any) can be a torn write: no CRC-valid frame carrying the
    /// LSN expected at the stop, or a later one, follows it. Frames of the incomplete last
    /// group before the stop are torn too.
    pub(crate) fn is_torn_tail(&self, bytes: &[u8]) -> bool {
        self.damage.is_none()
            || !valid_frame_after(bytes, self.stop_offset, self.stop_lsn.saturating_sub(1))
    }
}

pub(crate) fn frame_corruption(e: FrameError) -> CorruptionKind {
    match e {
        FrameError::Truncated => CorruptionKind::BadLength(0),
        FrameError::BadLength(n) => CorruptionKind::BadLength(n),
        FrameError::Crc { got, expected } => CorruptionKind::Crc { got, expected },
        FrameError::BadBody(why) => CorruptionKind::BadBody(why),
    }
}

/// Walks the frames of a segment image, calling `on_group` with every complete group (frames
/// with their positions). Never panics on any bytes.
pub(crate) fn scan_segment(
    bytes: &[u8],
    base_lsn: u64,
    mut on_group: impl FnMut(&[(u64, Position, Record)]) -> Result<()>,
) -> Result<ScanEnd> {
    let mut offset = SEGMENT_HEADER_BYTES as u64;
    let mut end = ScanEnd {
        stop_offset: 0,
        stop_lsn: 0,
        valid_end: offset,
        last_lsn: base_lsn.saturating_sub(1),
        records: 0,
        damage: None,
    };
    let mut group: Vec<(u64, Position, Record)> = Vec::new();
    let mut expected_lsn = base_lsn;
    while (offset as usize) < bytes.len() {
        let rest = bytes.get(offset as usize..).unwrap_or_default();
        let frame = match decode_frame(rest) {
            Ok(f) => f,
            Err(e) => {
                end.damage = Some((offset, frame_corruption(e)));
                break;
            }
        };
        if frame.header.lsn != expected_lsn {
            end.damage = Some((
                offset,
                CorruptionKind::LsnGap {
                    expected: expected_lsn,
                    got: frame.header.lsn,
                },
            ));
            break;
        }
        let len = frame.header.frame_len();
        let pos = Position {
            segment: base_lsn,
            offset,
            len: u32::try_from(len).unwrap_or(u32::MAX),
        };
        group.push((frame.header.lsn, pos, frame.record));
        offset += len;
        expected_lsn += 1;
        if frame.header.group_left == 0 {
            on_group(&group)?;
            end.records += group.len() as u64;
            end.last_lsn = expected_lsn - 1;
            end.valid_end = offset;
            group.clear();
        }
    }
    end.stop_offset = offset;
    end.stop_lsn = expected_lsn;
    if end.damage.is_none() && !group.is_empty() {
        // The bytes ended inside a group: the rest of the group was never written.
        end.damage = Some((end.valid_end, CorruptionKind::BadLength(0)));
    }
    Ok(end)
}

/// True when a frame that checks, with an LSN above `after_lsn`, starts anywhere at or past
/// `from`: then damage at `from` is not a torn tail.
pub(crate) fn valid_frame_after(bytes: &[u8], from: u64, after_lsn: u64) -> bool {
    let start = usize::try_from(from).unwrap_or(usize::MAX);
    (start.saturating_add(1)..bytes.len().saturating_sub(FRAME_HEADER_BYTES - 1)).any(|at| {
        let Some(rest) = bytes.get(at..) else {
            return false;
        };
        let Some(raw) = rest
            .get(..FRAME_HEADER_BYTES)
            .and_then(|s| <&[u8; FRAME_HEADER_BYTES]>::try_from(s).ok())
        else {
            return false;
        };
        let h = FrameHeader::read(raw);
        h.lsn > after_lsn
            && h.lsn < after_lsn.saturating_add(1 << 32)
            && h.body_len <= BODY_BYTES_MAX
            && check_frame(rest).is_ok()
    })
}

pub(crate) fn header_error(path: &Path, e: HeaderError) -> Error {
    let kind = match e {
        HeaderError::Short => CorruptionKind::BadLength(0),
        HeaderError::BadMagic => CorruptionKind::BadMagic,
        HeaderError::UnknownVersion(v) => CorruptionKind::UnknownVersion(v),
        HeaderError::Crc { got, expected } => CorruptionKind::Crc { got, expected },
    };
    Error::Corruption {
        segment: path.to_path_buf(),
        offset: 0,
        kind,
    }
}

/// Segment files in the directory, by base LSN.
pub(crate) fn list_segments(fs: &dyn FileSystem, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = fs
        .list(dir)
        .map_err(Error::io(format!("listing {}", dir.display())))?;
    for (name, path) in entries {
        if let Some(base) = parse_segment_name(&name) {
            out.push((base, path));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Everything open needs, recovered.
pub(crate) struct Recovered {
    pub lock: File,
    pub index: Index,
    pub segments: SegmentSet,
    pub active: Arc<Segment>,
    pub next_lsn: u64,
    pub report: RecoveryReport,
}

pub(crate) fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(Error::io(format!("opening lock file {}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::io("locking the data directory")(e)),
    }
}

/// Opens the data directory: the only path from disk to a running engine.
pub(crate) fn recover(fs: &Arc<dyn FileSystem>, dir: &Path) -> Result<Recovered> {
    let started = Instant::now();
    std::fs::create_dir_all(dir).map_err(Error::io(format!(
        "creating data directory {}",
        dir.display()
    )))?;
    let lock = lock_dir(dir)?;
    let mut found = list_segments(fs.as_ref(), dir)?;
    let mut report = RecoveryReport::default();

    // The last segment may be a torn creation (header never fully written): it holds nothing.
    while let Some((_, path)) = found.last() {
        let len = fs
            .len(path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        if len >= SEGMENT_HEADER_BYTES as u64 {
            break;
        }
        tracing::warn!(path = %path.display(), len, "removing a segment whose header was never completed");
        fs.remove(path)
            .map_err(Error::io(format!("removing {}", path.display())))?;
        sync_dir(fs.as_ref(), dir)?;
        found.pop();
    }
    if found.is_empty() {
        let seg = Segment::create(Arc::clone(fs), dir, 1)?;
        found.push((1, seg.path().to_path_buf()));
    }
    report.segments = found.len() as u64;

    let index = Index::open(&dir.join(INDEX_DIR))?;
    let mut applied = index.applied_lsn()?;
    if !index.version_ok()? {
        tracing::warn!("index was written by another schema version; rebuilding it from the log");
        index.clear()?;
        applied = 0;
        report.index_rebuilt = true;
    }

    // Tail first: find where the log really ends.
    let (tail_base, tail_path) = found.last().cloned().ok_or(Error::Closed)?;
    let tail_bytes = fs
        .read(&tail_path)
        .map_err(Error::io(format!("reading {}", tail_path.display())))?;
    let header_base =
        decode_segment_header(&tail_bytes).map_err(|e| header_error(&tail_path, e))?;
    if header_base != tail_base {
        return Err(Error::Corruption {
            segment: tail_path,
            offset: 0,
            kind: CorruptionKind::LsnGap {
                expected: tail_base,
                got: header_base,
            },
        });
    }
    let tail_end = scan_segment(&tail_bytes, tail_base, |_| Ok(()))?;
    if let Some((offset, kind)) = &tail_end.damage {
        if !tail_end.is_torn_tail(&tail_bytes) {
            return Err(Error::Corruption {
                segment: tail_path,
                offset: *offset,
                kind: CorruptionKind::DamageBeforeValidRecords,
            });
        }
        tracing::warn!(path = %tail_path.display(), offset, %kind, "truncating torn tail");
    }
    let last_lsn = tail_end.last_lsn;
    let first_base = found.first().map_or(1, |f| f.0);
    if applied > last_lsn || (applied + 1 < first_base) {
        tracing::warn!(
            applied,
            last_lsn,
            first_base,
            "index does not match the log; rebuilding it from the log"
        );
        index.clear()?;
        applied = 0;
        report.index_rebuilt = true;
    }
    if applied == 0 && last_lsn > 0 {
        // An empty index over a non-empty log: everything is replayed from the log.
        report.index_rebuilt = true;
    }

    let segments = SegmentSet::default();
    let count = found.len();
    let mut active = None;
    for (i, (base, path)) in found.iter().enumerate() {
        let is_tail = i + 1 == count;
        let next_base = found.get(i + 1).map_or(u64::MAX, |n| n.0);
        if is_tail {
            let seg = Segment::open(Arc::clone(fs), path.clone(), *base, tail_bytes.len() as u64)?;
            if tail_end.valid_end < tail_bytes.len() as u64 {
                report.bytes_truncated = tail_bytes.len() as u64 - tail_end.valid_end;
                seg.truncate(tail_end.valid_end)?;
            }
            if tail_end.last_lsn > applied {
                report.records_replayed += replay(&index, &tail_bytes, *base, applied)?;
            }
            let seg = Arc::new(seg);
            segments.insert(Arc::clone(&seg));
            active = Some(seg);
        } else {
            let len = fs
                .len(path)
                .map_err(Error::io(format!("reading {}", path.display())))?;
            let seg = Segment::open(Arc::clone(fs), path.clone(), *base, len)?;
            seg.seal()?;
            let needs_replay = next_base > applied + 1;
            seg.with_bytes(0, SEGMENT_HEADER_BYTES as u64, decode_segment_header)?
                .map_err(|e| header_error(path, e))?;
            if needs_replay {
                let n = seg.with_bytes(0, len, |bytes| -> Result<u64> {
                    let end = sealed_scan(path, bytes, *base, &index, applied)?;
                    if end.last_lsn + 1 != next_base {
                        return Err(Error::Corruption {
                            segment: path.clone(),
                            offset: end.valid_end,
                            kind: CorruptionKind::LsnGap {
                                expected: next_base,
                                got: end.last_lsn + 1,
                            },
                        });
                    }
                    Ok(end.records)
                })??;
                report.records_replayed += n;
            }
            segments.insert(Arc::new(seg));
        }
    }
    let active = active.ok_or(Error::Closed)?;
    index.flush()?;
    report.last_lsn = last_lsn;
    report.elapsed = started.elapsed();
    Ok(Recovered {
        lock,
        index,
        segments,
        active,
        next_lsn: last_lsn + 1,
        report,
    })
}

/// Replays a sealed segment; any damage in it is corruption of acknowledged data.
fn sealed_scan(
    path: &Path,
    bytes: &[u8],
    base: u64,
    index: &Index,
    applied: u64,
) -> Result<ScanEnd> {
    let mut replayed = 0;
    let end = replay_groups(index, bytes, base, applied, &mut replayed)?;
    if let Some((offset, kind)) = end.damage.clone() {
        return Err(Error::Corruption {
            segment: path.to_path_buf(),
            offset,
            kind,
        });
    }
    Ok(ScanEnd {
        records: replayed,
        ..end
    })
}

fn replay(index: &Index, bytes: &[u8], base: u64, applied: u64) -> Result<u64> {
    let mut replayed = 0;
    replay_groups(index, bytes, base, applied, &mut replayed)?;
    Ok(replayed)
}

/// Applies every complete group with LSNs above `applied`, committing in chunks.
fn replay_groups(
    index: &Index,
    bytes: &[u8],
    base: u64,
    applied: u64,
    replayed: &mut u64,
) -> Result<ScanEnd> {
    const CHUNK: usize = 8192;
    let mut txn = Txn::new(index);
    let mut in_txn = 0usize;
    let mut last = applied;
    let end = scan_segment(bytes, base, |group| {
        for (i, (lsn, pos, record)) in group.iter().enumerate() {
            if *lsn > applied {
                let prev = i.checked_sub(1).and_then(|p| group.get(p)).map(|g| &g.2);
                apply(&mut txn, *lsn, *pos, record, record.continues_run(prev))?;
                in_txn += 1;
                *replayed += 1;
                last = *lsn;
            }
        }
        if in_txn >= CHUNK {
            let full = std::mem::replace(&mut txn, Txn::new(index));
            index.commit(full, last);
            if index.memtable_len() >= crate::index::MEMTABLE_ENTRIES_MAX {
                index.flush_memtable()?;
            }
            in_txn = 0;
        }
        Ok(())
    })?;
    if in_txn > 0 {
        index.commit(txn, last);
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::encode_segment_header;
    use crate::record::{encode_frame, EventBody};
    use proptest::prelude::*;

    fn segment(events: usize) -> Vec<u8> {
        let mut bytes = encode_segment_header(1).to_vec();
        for i in 0..events {
            let r = Record::Event(EventBody {
                stream: 1,
                seq: i as u64 + 1,
                at_ms: 0,
                kind: "k".into(),
                correlation: None,
                payload: vec![7; i % 40],
            });
            encode_frame(&r, i as u64 + 1, 0, &mut bytes).unwrap();
        }
        bytes
    }

    #[test]
    fn a_clean_segment_scans_to_its_end() {
        let bytes = segment(20);
        let end = scan_segment(&bytes, 1, |_| Ok(())).unwrap();
        assert_eq!((end.records, end.last_lsn, end.damage), (20, 20, None));
        assert_eq!(end.valid_end, bytes.len() as u64);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_after_a_header_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut bytes = encode_segment_header(1).to_vec();
            bytes.extend_from_slice(&tail);
            let end = scan_segment(&bytes, 1, |_| Ok(())).unwrap();
            prop_assert!(end.valid_end <= bytes.len() as u64);
            let _ = valid_frame_after(&bytes, end.valid_end, end.last_lsn);
        }

        #[test]
        fn mutated_segments_yield_a_valid_prefix_or_named_damage(
            at in 32usize..2000, value: u8, cut in 0usize..2100,
        ) {
            let clean = segment(30);
            let mut bytes = clean.clone();
            if let Some(b) = bytes.get_mut(at) { *b = value; }
            bytes.truncate(cut.max(32));
            let end = scan_segment(&bytes, 1, |_| Ok(())).unwrap();
            // Whatever was kept is byte-identical to the clean segment's prefix.
            let kept = usize::try_from(end.valid_end).unwrap();
            prop_assert_eq!(&bytes[..kept], &clean[..kept]);
            prop_assert!(end.damage.is_some() || kept == bytes.len());
        }
    }
}
