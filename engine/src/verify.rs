//! Offline checks and repair of a data directory: `cursorlog verify [--repair]`.
//!
//! Verify reads every frame of every segment and reports, never writes. Repair cuts only
//! what recovery would cut anyway (a torn tail) unless the operator explicitly accepts the
//! loss of acknowledged records, and then says exactly what was dropped.

use std::path::{Path, PathBuf};

use crate::error::{CorruptionKind, Error, Result};
use crate::format::{decode_segment_header, legacy_v1, segment_version, INDEX_DIR};
use crate::fs::{FileSystem, StdFs};
use crate::log::frames::{classify_tail, walk_known, Step, TailDamage, WalkEnd};
use crate::log::{header_error, list_segments};
use crate::record::Record;

/// Walks a current-format segment image and says whether damage at its end is a torn,
/// unsynced write (what recovery cuts) rather than damage to synced data. A frame whose body
/// does not decode is damage here as it is in recovery's replay (which would refuse it); a
/// frame of a record type this build does not know is never torn (a newer build wrote it).
fn walk_image(bytes: &[u8], base: u64) -> Result<(WalkEnd, bool)> {
    let end = walk_known(&mut &bytes[..], base, |step| {
        if let Step::Frame(f) = step {
            if let Err(why) = Record::decode(f.header.record_type, f.body) {
                return Ok(Err(CorruptionKind::BadBody(why)));
            }
        }
        Ok(Ok(()))
    })?;
    let torn = matches!(
        classify_tail(bytes, &end),
        TailDamage::None | TailDamage::Unsynced { .. }
    );
    Ok((end, torn))
}

/// What `verify` found in one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentReport {
    /// The file.
    pub path: PathBuf,
    /// Base LSN from its name.
    pub base_lsn: u64,
    /// Records in complete groups.
    pub records: u64,
    /// File size.
    pub bytes: u64,
    /// Bytes of a torn tail (last segment only; recovery truncates them on open).
    pub torn_tail_bytes: u64,
    /// Corruption found, if any.
    pub error: Option<String>,
    /// The segment is of an older format version (it is upgraded the next time the
    /// directory is opened; its frames are checked then).
    pub legacy_version: Option<u32>,
}

/// What `verify` found in a data directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// One entry per segment, in LSN order.
    pub segments: Vec<SegmentReport>,
}

impl VerifyReport {
    /// True when no segment is corrupt (a torn tail is not corruption).
    pub fn ok(&self) -> bool {
        self.segments.iter().all(|s| s.error.is_none())
    }
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for s in &self.segments {
            let name = s
                .path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            match &s.error {
                Some(e) => writeln!(f, "CORRUPT {name}: {e}")?,
                None if s.legacy_version.is_some() => writeln!(f, "ok      {name}: format version {} (upgraded on next open), {} bytes", s.legacy_version.unwrap_or(0), s.bytes)?,
                None if s.torn_tail_bytes > 0 => writeln!(f, "ok      {name}: {} records, {} bytes, torn tail of {} bytes (truncated on next open)", s.records, s.bytes, s.torn_tail_bytes)?,
                None => writeln!(f, "ok      {name}: {} records, {} bytes", s.records, s.bytes)?,
            }
        }
        let bad = self.segments.iter().filter(|s| s.error.is_some()).count();
        write!(
            f,
            "{} segments checked, {} corrupt",
            self.segments.len(),
            bad
        )
    }
}

/// Checks every frame of every segment in `dir` without opening the engine (no lock is taken
/// and nothing is written).
///
/// # Errors
/// I/O failures listing or reading files; corruption is reported in the result.
pub fn verify_dir(dir: &Path) -> Result<VerifyReport> {
    verify_dir_with(&StdFs, dir)
}

/// [`verify_dir`] through a given file system.
///
/// # Errors
/// As [`verify_dir`].
pub fn verify_dir_with(fs: &dyn FileSystem, dir: &Path) -> Result<VerifyReport> {
    let found = list_segments(fs, dir)?;
    let mut report = VerifyReport::default();
    let mut expected_base: Option<u64> = None;
    let count = found.len();
    for (i, (base, path)) in found.into_iter().enumerate() {
        let bytes = fs
            .read(&path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        let mut seg = SegmentReport {
            path: path.clone(),
            base_lsn: base,
            records: 0,
            bytes: bytes.len() as u64,
            torn_tail_bytes: 0,
            error: None,
            legacy_version: None,
        };
        let is_tail = i + 1 == count;
        if segment_version(&bytes) == Ok(legacy_v1::VERSION) {
            seg.legacy_version = Some(legacy_v1::VERSION);
            expected_base = None;
            report.segments.push(seg);
            continue;
        }
        match decode_segment_header(&bytes) {
            Err(e) => seg.error = Some(header_error(&path, e).to_string()),
            Ok(h) if h.base_lsn != base => {
                seg.error = Some(format!(
                    "header names lsn {} but the file name says {base}",
                    h.base_lsn
                ))
            }
            Ok(_) => {
                let (end, torn) = walk_image(&bytes, base)?;
                seg.records = end.records;
                if let Some(prev_end) = expected_base.filter(|e| *e != base) {
                    seg.error = Some(format!("lsn gap: previous segment ends before {prev_end}, this one starts at {base}"));
                }
                match end.damage {
                    Some((offset, kind)) if !is_tail || !torn => {
                        let newer = matches!(kind, CorruptionKind::UnknownRecordType(_));
                        let kind = if is_tail && !newer {
                            CorruptionKind::DamageBeforeValidRecords
                        } else {
                            kind
                        };
                        seg.error = Some(
                            Error::Corruption {
                                segment: path.clone(),
                                offset,
                                kind,
                            }
                            .to_string(),
                        );
                    }
                    Some(_) => seg.torn_tail_bytes = bytes.len() as u64 - end.valid_end,
                    None => {}
                }
                // Continuity is only checkable from an intact segment: after a damaged one,
                // the next segment's base cannot be judged (and must not be blamed).
                expected_base = seg.error.is_none().then_some(end.last_lsn + 1);
            }
        }
        if seg.error.is_some() {
            expected_base = None;
        }
        report.segments.push(seg);
    }
    Ok(report)
}

/// What `repair` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Segments cut short: (file, new length, bytes removed).
    pub truncated: Vec<(PathBuf, u64, u64)>,
    /// Whole segments deleted (they followed a damaged sealed segment).
    pub deleted: Vec<PathBuf>,
    /// Complete, CRC-valid records that were dropped (only with `accept_loss`).
    pub records_dropped: u64,
    /// The index was removed so the next open rebuilds it from the repaired log.
    pub index_removed: bool,
}

impl std::fmt::Display for RepairReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.truncated.is_empty() && self.deleted.is_empty() {
            return f.write_str("nothing to repair");
        }
        for (path, len, cut) in &self.truncated {
            writeln!(
                f,
                "truncated {} to {len} bytes ({cut} bytes removed)",
                path.display()
            )?;
        }
        for path in &self.deleted {
            writeln!(f, "deleted {}", path.display())?;
        }
        write!(f, "{} valid records dropped", self.records_dropped)?;
        if self.index_removed {
            write!(f, "; index removed (rebuilt on next open)")?;
        }
        Ok(())
    }
}

/// Repairs `dir` (which must not be open: it takes the directory's lock, so an engine or
/// server using it makes this fail with [`Error::Locked`]): a torn tail of the last segment
/// is truncated.
/// Damage that would drop acknowledged records — in a sealed segment, or followed by valid
/// records — is refused unless `accept_loss`; then the log is cut at the first damaged frame
/// (later segments are deleted) and the index is removed to be rebuilt. A record of a type
/// this build does not know (a newer build wrote it) is always refused, never cut.
///
/// # Errors
/// [`Error::Corruption`] describing the damage when it cannot be repaired without loss and
/// `accept_loss` is false, or naming a record of an unknown type
/// ([`CorruptionKind::UnknownRecordType`]) whatever `accept_loss` says; I/O failures.
pub fn repair_dir(dir: &Path, accept_loss: bool) -> Result<RepairReport> {
    repair_dir_with(&StdFs, dir, accept_loss)
}

/// [`repair_dir`] through a given file system.
///
/// # Errors
/// As [`repair_dir`].
pub fn repair_dir_with(fs: &dyn FileSystem, dir: &Path, accept_loss: bool) -> Result<RepairReport> {
    // Truncating a segment under a running engine would cut files it serves.
    let _lock = crate::recovery::lock_dir(dir)?;
    let found = list_segments(fs, dir)?;
    let mut report = RepairReport::default();
    let count = found.len();
    // The LSN the next segment must start at, as the previous intact one ends.
    let mut expected_base: Option<u64> = None;
    for (i, (base, path)) in found.iter().enumerate() {
        let bytes = fs
            .read(path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        let is_tail = i + 1 == count;
        let (cut_at, kind) = match decode_segment_header(&bytes) {
            Err(e) => (0, header_kind(path, e)),
            // A header that names another LSN than the file, or a segment that does not
            // start where the previous one ended (a segment file is missing): open refuses
            // both, so nothing from here on is reachable.
            Ok(h) if h.base_lsn != *base => (
                0,
                CorruptionKind::LsnGap {
                    expected: *base,
                    got: h.base_lsn,
                },
            ),
            Ok(_) if expected_base.is_some_and(|e| e != *base) => (
                0,
                CorruptionKind::LsnGap {
                    expected: expected_base.unwrap_or(*base),
                    got: *base,
                },
            ),
            Ok(_) => {
                let (end, torn) = walk_image(&bytes, *base)?;
                expected_base = Some(end.last_lsn + 1);
                match end.damage {
                    None => continue,
                    Some((offset, kind)) => {
                        let lossy = !is_tail || !torn;
                        // A newer build's record is never cut, even at the cost of loss the
                        // operator accepts: that build reads the directory as it is.
                        let newer = matches!(kind, CorruptionKind::UnknownRecordType(_));
                        if newer || (lossy && !accept_loss) {
                            return Err(Error::Corruption {
                                segment: path.clone(),
                                offset,
                                kind,
                            });
                        }
                        if lossy {
                            report.records_dropped +=
                                count_valid_after(&bytes, end.valid_end, end.last_lsn);
                        }
                        (end.valid_end, kind)
                    }
                }
            }
        };
        let gap = matches!(kind, CorruptionKind::LsnGap { .. });
        if gap {
            // Every record of this segment is complete and valid, yet unreachable.
            if !accept_loss {
                return Err(Error::Corruption {
                    segment: path.clone(),
                    offset: 0,
                    kind,
                });
            }
            report.records_dropped +=
                count_valid_after(&bytes, crate::format::SEGMENT_HEADER_BYTES as u64, 0);
        }
        if cut_at == 0 && !is_tail && !accept_loss {
            return Err(Error::Corruption {
                segment: path.clone(),
                offset: 0,
                kind,
            });
        }
        let removed = bytes.len() as u64 - cut_at;
        if cut_at == 0 {
            fs.remove(path)
                .map_err(Error::io(format!("removing {}", path.display())))?;
            report.deleted.push(path.clone());
        } else {
            let file = fs
                .open(path)
                .map_err(Error::io(format!("opening {}", path.display())))?;
            file.set_len_and_sync(cut_at)
                .map_err(Error::io(format!("truncating {}", path.display())))?;
            report.truncated.push((path.clone(), cut_at, removed));
        }
        // Everything after the cut is unreachable: later segments go too.
        for (_, later) in found.iter().skip(i + 1) {
            let later_bytes = fs
                .read(later)
                .map_err(Error::io(format!("reading {}", later.display())))?;
            report.records_dropped +=
                count_valid_after(&later_bytes, crate::format::SEGMENT_HEADER_BYTES as u64, 0);
            fs.remove(later)
                .map_err(Error::io(format!("removing {}", later.display())))?;
            report.deleted.push(later.clone());
        }
        fs.sync_dir(dir)
            .map_err(Error::io(format!("syncing {}", dir.display())))?;
        if report.records_dropped > 0 || !report.deleted.is_empty() {
            let index = dir.join(INDEX_DIR);
            if index.exists() {
                std::fs::remove_dir_all(&index)
                    .map_err(Error::io(format!("removing {}", index.display())))?;
                report.index_removed = true;
            }
        }
        break;
    }
    Ok(report)
}

fn header_kind(path: &Path, e: crate::format::HeaderError) -> CorruptionKind {
    match header_error(path, e) {
        Error::Corruption { kind, .. } => kind,
        _ => CorruptionKind::BadMagic,
    }
}

/// Counts CRC-valid frames with LSNs above `after_lsn` from `from` on (what a lossy repair
/// drops), skipping damaged bytes.
fn count_valid_after(bytes: &[u8], from: u64, after_lsn: u64) -> u64 {
    let mut n = 0;
    let mut at = usize::try_from(from).unwrap_or(usize::MAX);
    while at < bytes.len() {
        match bytes.get(at..).map(crate::record::check_frame) {
            Some(Ok(h)) if h.lsn > after_lsn => {
                n += 1;
                at += usize::try_from(h.frame_len()).unwrap_or(usize::MAX);
            }
            _ => at += 1,
        }
    }
    n
}
