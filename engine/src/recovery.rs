//! Opening a data directory: take its lock, open the log (upgrade, cut a torn unsynced
//! tail, start a new term), open the index (rebuilding it when it is stale, of another
//! version, or unreadable) and replay the log into it.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::apply::apply;
use crate::config::Config;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::{SyncPolicyTag, INDEX_DIR, LOCK_FILE};
use crate::fs::FileSystem;
use crate::index::{Index, Txn};
use crate::log::frames::{walk_groups, FrameSource, Windowed};
use crate::log::{Log, LogWriter, PreviousRun, Segment};
use crate::lost::{self, LostWrites, Remembered};

/// What opening the data directory did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files found.
    pub segments: u64,
    /// Records replayed into the index.
    pub records_replayed: u64,
    /// Bytes cut from a torn, never-synced tail of the last segment.
    pub bytes_truncated: u64,
    /// CRC-valid frames found after the torn part and cut with it (written after the last
    /// sync, so never acknowledged under `sync=always`).
    pub torn_frames_dropped: u64,
    /// The index was rebuilt from the whole log (missing, stale, ahead, of another version,
    /// or unreadable).
    pub index_rebuilt: bool,
    /// The format version the directory was upgraded from, if it was.
    pub upgraded_from: Option<u32>,
    /// Whether the previous run shut down cleanly (`None` for a new directory).
    pub previous_clean: Option<bool>,
    /// Open streams ended because the previous run may have lost acknowledged events
    /// (`interval`/`never` sync, no clean shutdown, machine restarted): their seqs could
    /// otherwise be issued twice.
    pub streams_fenced: u64,
    /// Records the index had applied that the log no longer holds (the index was ahead of
    /// the log). Under `sync=always` these were acknowledged: the disk lost synced writes.
    pub lost_records: u64,
    /// Sessions moved to a new epoch because the log lost one of their streams or epochs.
    pub sessions_fenced: u64,
    /// Running tasks failed (`EndCause::Fenced`) because the log lost acknowledged changes
    /// of theirs.
    pub tasks_fenced: u64,
    /// Time taken.
    pub elapsed: Duration,
    /// The last LSN in the log after recovery.
    pub last_lsn: u64,
}

impl std::fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} segments, last lsn {}, replayed {} records{}, truncated {} torn bytes",
            self.segments,
            self.last_lsn,
            self.records_replayed,
            if self.index_rebuilt {
                " (index rebuilt from the log)"
            } else {
                ""
            },
            self.bytes_truncated,
        )?;
        if let Some(v) = self.upgraded_from {
            write!(f, ", upgraded from format version {v}")?;
        }
        if self.previous_clean == Some(false) {
            f.write_str(", previous run did not shut down cleanly")?;
        }
        if self.lost_records > 0 {
            write!(
                f,
                ", {} records the index had applied are missing from the log",
                self.lost_records
            )?;
        }
        if self.sessions_fenced > 0 {
            write!(
                f,
                ", {} sessions moved to a new epoch (a stream or epoch was lost)",
                self.sessions_fenced
            )?;
        }
        if self.streams_fenced > 0 {
            write!(
                f,
                ", {} open streams ended (events may have been lost)",
                self.streams_fenced
            )?;
        }
        if self.tasks_fenced > 0 {
            write!(
                f,
                ", {} running tasks failed (acknowledged changes of theirs were lost)",
                self.tasks_fenced
            )?;
        }
        write!(f, ", in {} ms", self.elapsed.as_millis())
    }
}

/// Everything open needs, recovered.
pub(crate) struct Recovered {
    pub lock: File,
    pub index: Index,
    pub log: Arc<Log>,
    pub writer: LogWriter,
    pub previous: Option<PreviousRun>,
    /// Records the index remembered that the log lost, if any.
    pub lost: Option<LostWrites>,
    pub report: RecoveryReport,
}

/// Takes the data directory's advisory lock (one process per directory).
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

/// Opens the index, or, when it cannot be read (a damaged store), moves it out of the way
/// and starts an empty one: it is derived, and replay rebuilds it from the log.
fn open_index(dir: &Path, cache_bytes: u64) -> Result<(Index, bool)> {
    let path = dir.join(INDEX_DIR);
    match Index::open(&path, cache_bytes) {
        Ok(index) => Ok((index, false)),
        Err(Error::Index(e)) => {
            tracing::warn!(error = %e, path = %path.display(), "the index cannot be read; rebuilding it from the log");
            std::fs::remove_dir_all(&path).map_err(Error::io(format!(
                "removing the damaged index {}",
                path.display()
            )))?;
            Ok((Index::open(&path, cache_bytes)?, true))
        }
        Err(e) => Err(e),
    }
}

/// Opens the data directory: the only path from disk to a running engine.
pub(crate) fn recover(fs: &Arc<dyn FileSystem>, config: &Config) -> Result<Recovered> {
    let started = Instant::now();
    let dir = &config.dir;
    std::fs::create_dir_all(dir).map_err(Error::io(format!(
        "creating data directory {}",
        dir.display()
    )))?;
    let lock = lock_dir(dir)?;
    refuse_cluster_member(dir)?;
    let opened = crate::log::open(fs, dir, config.sync, &config.clock)?;
    let mut report = RecoveryReport {
        segments: opened.segments,
        bytes_truncated: opened.bytes_truncated,
        torn_frames_dropped: opened.frames_dropped,
        upgraded_from: opened.upgraded_from,
        previous_clean: opened.previous.map(|p| p.clean),
        last_lsn: opened.last_lsn,
        ..RecoveryReport::default()
    };

    let (index, damaged) = open_index(dir, config.index_cache_bytes)?;
    report.index_rebuilt = damaged;
    let mut applied = index.applied_lsn()?;
    if !index.version_ok()? || opened.upgraded_from.is_some() {
        tracing::warn!(
            "index was written by another schema or format version; rebuilding it from the log"
        );
        index.clear()?;
        applied = 0;
        report.index_rebuilt = true;
    }
    let last_lsn = opened.last_lsn;
    let first_base = opened.log.all().first().map_or(1, |s| s.base_lsn());
    // An index ahead of the log remembers records the log lost: note what it knew before
    // it is rebuilt, to fence what was lost once the engine runs (see `lost`).
    let remembered = if applied > last_lsn && !report.index_rebuilt {
        Some((applied, Remembered::read(&index)?))
    } else {
        None
    };
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
    report.records_replayed = replay(&opened.log, &index, applied, last_lsn)?;
    index.flush()?;
    let lost = match &remembered {
        Some((applied_before, before)) => {
            let lost = lost::compare(before, &index, *applied_before, last_lsn)?;
            log_lost(&lost, opened.previous);
            report.lost_records = lost.records();
            Some(lost)
        }
        None => None,
    };
    report.elapsed = started.elapsed();
    Ok(Recovered {
        lock,
        index,
        log: opened.log,
        writer: opened.writer,
        previous: opened.previous,
        lost,
        report,
    })
}

/// Says what the log lost that the index remembered. Under `sync=always` every one of those
/// records had been fsynced and acknowledged: the disk did not keep what it said it kept.
fn log_lost(lost: &LostWrites, previous: Option<PreviousRun>) {
    let always = previous.is_none_or(|p| p.sync == SyncPolicyTag::Always);
    if always {
        tracing::error!(
            applied_lsn = lost.applied_lsn,
            last_lsn = lost.last_lsn,
            records = lost.records(),
            streams_ended = lost.streams_to_end.len(),
            sessions_moved_to_a_new_epoch = lost.sessions_to_advance.len(),
            streams_vanished = lost.streams_vanished,
            sessions_vanished = lost.sessions_vanished,
            tasks_failed = lost.tasks_to_end.len(),
            tasks_vanished = lost.tasks_vanished.len(),
            "ACKNOWLEDGED DATA LOST: the index had applied records the log no longer holds, \
             under sync=always (each was fsynced before it was acknowledged). The disk lost \
             synced writes (a device or controller that does not honour fsync, or a file \
             changed outside cursorlog). Streams that lost events are ended and sessions that \
             lost a stream or an epoch move to a new epoch, tasks that lost a change fail \
             (cause: fenced) and the ids of tasks whose creation was lost are skipped, so no id \
             is ever reused; check the disk's write cache settings and `cursorlog verify`."
        );
    } else {
        tracing::warn!(
            applied_lsn = lost.applied_lsn,
            last_lsn = lost.last_lsn,
            records = lost.records(),
            streams_ended = lost.streams_to_end.len(),
            sessions_moved_to_a_new_epoch = lost.sessions_to_advance.len(),
            tasks_failed = lost.tasks_to_end.len(),
            tasks_vanished = lost.tasks_vanished.len(),
            "the unsynced tail of the log was lost (sync=interval/never): the streams, \
             sessions and tasks that lost changes are fenced so no id is reused"
        );
    }
}

/// Replays every segment that may hold records after `applied` into the index. Any damage
/// in them is corruption of acknowledged data (the tail's torn part was cut at open).
fn replay(log: &Log, index: &Index, applied: u64, last_lsn: u64) -> Result<u64> {
    let segments = log.all();
    let mut replayed = 0;
    for (i, seg) in segments.iter().enumerate() {
        let next_base = segments.get(i + 1).map_or(last_lsn + 1, |n| n.base_lsn());
        if next_base <= applied + 1 {
            continue;
        }
        // Positional reads, window by window: no segment is mapped (a fault is an error).
        let next_entry = match segments.get(i + 1) {
            Some(n) => Some(n.header()?),
            None => None,
        };
        replayed += replay_segment(
            seg,
            &mut Windowed::new(seg),
            next_base,
            next_entry.map(|h| (h.base_entry, h.prev_term)),
            index,
            applied,
        )?;
    }
    Ok(replayed)
}

/// Replays one segment, checking it ends exactly where the next one begins: at the LSN,
/// and (`next_entry`, when there is a next segment) at the entry and term its header names.
fn replay_segment<S: FrameSource>(
    seg: &Segment,
    src: &mut S,
    next_base: u64,
    next_entry: Option<(u64, u64)>,
    index: &Index,
    applied: u64,
) -> Result<u64> {
    const CHUNK: usize = 8192;
    let mut txn = Txn::new(index);
    let mut in_txn = 0usize;
    let mut last = applied;
    let mut replayed = 0;
    let end = walk_groups(src, seg.base_lsn(), |group| {
        for (i, (lsn, pos, record)) in group.iter().enumerate() {
            if *lsn > applied {
                let prev = i.checked_sub(1).and_then(|p| group.get(p)).map(|g| &g.2);
                apply(&mut txn, *lsn, *pos, record, record.continues_run(prev))?;
                in_txn += 1;
                replayed += 1;
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
    if let Some((offset, kind)) = end.damage {
        return Err(seg.corruption(offset, kind));
    }
    if end.last_lsn + 1 != next_base {
        return Err(seg.corruption(
            end.valid_end,
            // The next segment should start where this one ends; it starts elsewhere.
            CorruptionKind::LsnGap {
                expected: end.last_lsn + 1,
                got: next_base,
            },
        ));
    }
    if let Some((base_entry, prev_term)) = next_entry {
        if end.last_entry + 1 != base_entry {
            return Err(seg.corruption(
                end.valid_end,
                CorruptionKind::EntryGap {
                    expected: end.last_entry + 1,
                    got: base_entry,
                },
            ));
        }
        if end.last_term != prev_term {
            return Err(seg.corruption(
                end.valid_end,
                CorruptionKind::TermBackwards {
                    previous: end.last_term,
                    got: prev_term,
                },
            ));
        }
    }
    Ok(replayed)
}

/// Refuses, before anything is written, a data directory that a member of a replicated
/// cluster wrote (it has a saved vote): a single-node open would append to that log without
/// consensus, and the members' logs would differ.
fn refuse_cluster_member(dir: &std::path::Path) -> Result<()> {
    let vote = dir.join(crate::format::VOTE_FILE);
    if vote.exists() {
        return Err(Error::UnsupportedFormat {
            path: vote,
            reason: "this data directory belongs to a member of a replicated cluster: start it \
                     with --node-id and --peers (a single-node open would write to it without \
                     the cluster)"
                .into(),
        });
    }
    Ok(())
}
