//! Opening the log: upgrade an older format, find where the log really ends, cut a torn
//! unsynced tail (and only that), say how the previous run ended, and start a new term in a
//! new active segment.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::clock::Clock;
use crate::config::SyncPolicy;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::{
    decode_segment_header, parse_segment_name, segment_version, HeaderError, SegmentHeader,
    SyncPolicyTag, BOOT_ID_BYTES, FORMAT_VERSION, SEGMENT_HEADER_BYTES,
};
use crate::fs::FileSystem;
use crate::log::frames::{classify_tail, walk_known, Step, TailDamage};
use crate::log::{sync_dir, upgrade, CleanMark, Log, LogPoint, LogWriter, Segment};
use crate::record::tag;

/// How the run that wrote the log before this open ended, as far as the log can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PreviousRun {
    /// It closed cleanly, everything synced: it left the clean-close mark and the log
    /// ends exactly where the mark says (or, written by format version 2 or older, its last
    /// record was the shutdown marker).
    pub clean: bool,
    /// The sync policy it wrote with.
    pub sync: SyncPolicyTag,
    /// The machine restarted since it created its last segment (or that is unknown), so
    /// writes it had not synced may be lost, beyond what the tail shows.
    pub rebooted: bool,
}

impl PreviousRun {
    /// True when acknowledged records of the previous run may be missing from the log: it
    /// acknowledged writes before syncing them (`interval`/`never`), did not shut down
    /// cleanly, and the machine lost its page cache (a reboot) since.
    pub(crate) fn may_have_lost_acknowledged(&self) -> bool {
        !self.clean && self.sync != SyncPolicyTag::Always && self.rebooted
    }
}

/// A log ready to append to.
#[derive(Debug)]
pub(crate) struct Opened {
    pub log: Arc<Log>,
    pub writer: LogWriter,
    /// LSN of the last record (0 for an empty log).
    pub last_lsn: u64,
    /// How the previous run ended; `None` for a new log.
    pub previous: Option<PreviousRun>,
    /// Segment files found.
    pub segments: u64,
    /// Bytes cut from a torn unsynced tail.
    pub bytes_truncated: u64,
    /// CRC-valid frames found beyond the tail's damage and cut with it (unsynced).
    pub frames_dropped: u64,
    /// The format version the directory was upgraded from, if it was.
    pub upgraded_from: Option<u32>,
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

/// The corruption a bad segment header is.
pub(crate) fn header_error(path: &Path, e: HeaderError) -> Error {
    let kind = match e {
        HeaderError::Short => CorruptionKind::BadLength(0),
        HeaderError::BadMagic => CorruptionKind::BadMagic,
        HeaderError::UnknownVersion(v) => CorruptionKind::UnknownVersion(v),
        HeaderError::Crc { got, expected } => CorruptionKind::Crc { got, expected },
        HeaderError::BadField(f) => CorruptionKind::BadBody(format!("segment header field {f}")),
    };
    Error::Corruption {
        segment: path.to_path_buf(),
        offset: 0,
        kind,
    }
}

/// Opens (creating) the log in `dir`. The caller holds the directory lock.
///
/// # Errors
/// Corruption of synced data (naming file and offset), a bad header, I/O failures.
pub(crate) fn open(
    fs: &Arc<dyn FileSystem>,
    dir: &Path,
    policy: SyncPolicy,
    clock: &Arc<dyn Clock>,
) -> Result<Opened> {
    let boot_id = fs.boot_id();
    let upgraded = upgrade::upgrade_if_needed(fs.as_ref(), dir, clock.as_ref(), boot_id)?;
    let upgraded_from = upgraded.map(|u| u.from);
    // Read and removed before anything else can change the log.
    let clean_mark = CleanMark::take(fs.as_ref(), dir)?;
    let mut found = list_segments(fs.as_ref(), dir)?;

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
    let log = Arc::new(Log::new(Arc::clone(fs), dir.to_path_buf()));
    let this_boot = boot_id.unwrap_or([0; BOOT_ID_BYTES]);
    let run = Run {
        policy,
        boot_id: this_boot,
        clock,
    };
    let Some((tail_base, tail_path)) = found.last().cloned() else {
        let start = LogPoint {
            lsn: 1,
            entry: 1,
            prev_term: 0,
        };
        let writer = run.start_segment(&log, start, 1)?;
        return Ok(Opened {
            log,
            writer,
            last_lsn: 0,
            previous: None,
            segments: 0,
            bytes_truncated: 0,
            frames_dropped: 0,
            upgraded_from,
        });
    };

    // Tail first: find where the log really ends and how the previous run ended. A frame of
    // a record type this build does not know stops the walk (a newer build wrote it): it is
    // refused below, never cut as a torn tail.
    let tail_bytes = fs
        .read(&tail_path)
        .map_err(Error::io(format!("reading {}", tail_path.display())))?;
    let tail_header = read_header(&tail_path, &tail_bytes, tail_base)?;
    let mut last_type = None;
    let mut group_last_type = None;
    let end = walk_known(&mut tail_bytes.as_slice(), tail_base, |step| {
        match step {
            Step::Frame(f) => group_last_type = Some(f.header.record_type),
            Step::GroupEnd => last_type = group_last_type,
        }
        Ok(Ok(()))
    })?;
    let mut bytes_truncated = 0;
    let mut frames_dropped = 0;
    match classify_tail(&tail_bytes, &end) {
        TailDamage::None => {}
        TailDamage::UnknownRecordType(record_type) => {
            let offset = end.damage.as_ref().map_or(end.valid_end, |(at, _)| *at);
            tracing::error!(
                path = %tail_path.display(), offset, record_type,
                "a record of a type this build does not know (written by a newer build): \
                 refusing to open rather than cut it"
            );
            // Nothing changed the log: put back the mark taken above, so that the newer
            // build finds the directory exactly as it left it.
            if let Some(mark) = clean_mark {
                mark.write(fs.as_ref(), dir)?;
            }
            return Err(Error::Corruption {
                segment: tail_path,
                offset,
                kind: CorruptionKind::UnknownRecordType(record_type),
            });
        }
        TailDamage::Synced { synced_through } => {
            let (offset, kind) = end
                .damage
                .clone()
                .unwrap_or((end.valid_end, CorruptionKind::BadLength(0)));
            tracing::error!(
                path = %tail_path.display(), offset, %kind, synced_through,
                "damage in data that had been synced: refusing to cut it off"
            );
            return Err(Error::Corruption {
                segment: tail_path,
                offset,
                kind: CorruptionKind::DamageBeforeValidRecords,
            });
        }
        TailDamage::Unsynced { valid_frames_after } => {
            let (offset, kind) = end
                .damage
                .clone()
                .unwrap_or((end.valid_end, CorruptionKind::BadLength(0)));
            bytes_truncated = tail_bytes.len() as u64 - end.valid_end;
            frames_dropped = valid_frames_after;
            tracing::warn!(
                path = %tail_path.display(), offset, %kind, bytes = bytes_truncated,
                frames_after = valid_frames_after,
                "cutting the torn tail of a write that was never synced (never acknowledged under sync=always)"
            );
        }
    }
    // An upgrade that cut a torn tail may have cut a later run's write after the record.
    let legacy_mark = last_type == Some(tag::SHUTDOWN) && !upgraded.is_some_and(|u| u.tail_cut);
    let previous = PreviousRun {
        // Clean means "everything acknowledged since is in the log": the log ends exactly
        // where the clean close's mark says, and nothing after it was torn away (a torn
        // group after it is a later run's write that a crash cut short).
        clean: bytes_truncated == 0
            && (clean_mark.is_some_and(|m| {
                m == CleanMark {
                    segment: tail_base,
                    len: tail_bytes.len() as u64,
                    last_lsn: end.last_lsn,
                    last_entry: end.last_entry,
                }
            }) || legacy_mark),
        sync: tail_header.sync,
        rebooted: boot_id.is_none() || boot_id != Some(tail_header.boot_id),
    };

    // Sealed segments: mapped, no descriptor. Their headers are checked; their frames are
    // checked when replayed (recovery) and on every read.
    for (base, path) in found.iter().take(found.len() - 1) {
        let len = fs
            .len(path)
            .map_err(Error::io(format!("reading {}", path.display())))?;
        let seg = Segment::open_sealed(Arc::clone(fs), path.clone(), *base, len)?;
        seg.with_bytes(0, SEGMENT_HEADER_BYTES as u64, |h| {
            read_header(path, h, *base)
        })??;
        log.insert(Arc::new(seg));
    }

    let tail = Segment::open_active(
        Arc::clone(fs),
        tail_path.clone(),
        tail_base,
        tail_bytes.len() as u64,
    )?;
    if bytes_truncated > 0 {
        tail.truncate(end.valid_end)?;
    }
    let next = LogPoint {
        lsn: end.last_lsn + 1,
        entry: end.last_entry + 1,
        prev_term: end.last_term,
    };
    // The writer goes on in the old tail when its header still describes this run (same
    // sync policy, same boot of the machine): what recovery needs to know about how the
    // frames in a segment were written stays true. Otherwise the old tail is sealed and the
    // run starts a new segment (and term); an old tail without frames is replaced.
    //
    // A tail that ends in a version-2 shutdown record is never continued under a policy
    // that acknowledges before syncing: this run's acknowledged but unsynced appends would
    // sit after the record, and a power loss that took them would leave a log that still
    // ends "clean", so nothing would be fenced and their seqs would be issued again. In a
    // new segment, a lost tail leaves no record at the end: not clean. (Today's mark is a
    // file, removed above before anything is written, so it never outlives a change.)
    let continues_clean_mark = legacy_mark && policy != SyncPolicy::Always;
    // Under `always` the boot does not matter (nothing acknowledged was unsynced, and the
    // boot id only serves to detect lost unsynced writes): the tail is continued across a
    // reboot, so a replicated log's uncommitted suffix stays in the active segment, the only
    // one ever cut.
    let same_run = tail_header.sync == SyncPolicyTag::of(policy)
        && (policy == SyncPolicy::Always || boot_id.is_some_and(|b| b == tail_header.boot_id))
        && !continues_clean_mark;
    if same_run {
        // The tail may hold bytes the killed run wrote but never synced (still in the page
        // cache, which outlived the process). Every frame this run writes claims the bytes
        // before it are durable (`synced_through`), and readers are served what the index
        // replays from them: make that true before either happens.
        tail.sync_data()?;
        let tail = Arc::new(tail);
        log.insert(Arc::clone(&tail));
        let writer = LogWriter::new(
            log.clone(),
            tail,
            next,
            // A replicated log's entries carry their leaders' terms, above the header's.
            tail_header.term.max(end.last_term),
            policy,
            this_boot,
            Arc::clone(clock),
        );
        return Ok(Opened {
            log,
            writer,
            last_lsn: end.last_lsn,
            previous: Some(previous),
            segments: found.len() as u64,
            bytes_truncated,
            frames_dropped,
            upgraded_from,
        });
    }
    let term = tail_header.term.max(end.last_term) + 1;
    if end.valid_end > SEGMENT_HEADER_BYTES as u64 {
        tail.seal()?;
        log.insert(Arc::new(tail));
    } else {
        drop(tail);
        fs.remove(&tail_path)
            .map_err(Error::io(format!("removing {}", tail_path.display())))?;
        sync_dir(fs.as_ref(), dir)?;
    }
    let writer = run.start_segment(&log, next, term)?;
    Ok(Opened {
        log,
        writer,
        last_lsn: end.last_lsn,
        previous: Some(previous),
        segments: found.len() as u64,
        bytes_truncated,
        frames_dropped,
        upgraded_from,
    })
}

/// What this run writes its segments' headers with.
struct Run<'a> {
    policy: SyncPolicy,
    boot_id: [u8; BOOT_ID_BYTES],
    clock: &'a Arc<dyn Clock>,
}

impl Run<'_> {
    /// Creates the active segment of a new term at `start` and a writer for it.
    fn start_segment(&self, log: &Arc<Log>, start: LogPoint, term: u64) -> Result<LogWriter> {
        let header = SegmentHeader {
            base_lsn: start.lsn,
            term,
            sync: SyncPolicyTag::of(self.policy),
            boot_id: self.boot_id,
            created_at_ms: self.clock.now_ms(),
            base_entry: start.entry,
            prev_term: start.prev_term,
        };
        let active = Arc::new(Segment::create(Arc::clone(log.fs()), log.dir(), &header)?);
        log.insert(Arc::clone(&active));
        Ok(LogWriter::new(
            Arc::clone(log),
            active,
            start,
            term,
            self.policy,
            self.boot_id,
            Arc::clone(self.clock),
        ))
    }
}

/// Checks a current-format segment header against the base LSN its name gives.
fn read_header(path: &Path, bytes: &[u8], base: u64) -> Result<SegmentHeader> {
    match segment_version(bytes) {
        Ok(FORMAT_VERSION) => {}
        Ok(v) => return Err(header_error(path, HeaderError::UnknownVersion(v))),
        Err(e) => return Err(header_error(path, e)),
    }
    let header = decode_segment_header(bytes).map_err(|e| header_error(path, e))?;
    if header.base_lsn != base {
        return Err(Error::Corruption {
            segment: path.to_path_buf(),
            offset: 0,
            kind: CorruptionKind::LsnGap {
                expected: base,
                got: header.base_lsn,
            },
        });
    }
    Ok(header)
}
