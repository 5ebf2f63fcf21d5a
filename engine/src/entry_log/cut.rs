//! Cutting the log back: a deposed leader's uncommitted suffix (`truncate_after`: cut the
//! active segment, or unlink whole later segments newest first, never touching a sealed
//! one), and a committed prefix (`purge_through`: `PURGED` written durably; the segments
//! stay, see [`Inner::finish_purge`]; a purge past the last entry starts the log again
//! after it, at the LSN recorded in `PURGED`). A crash part way through either leaves
//! a log the next open finishes ([`Inner::finish_purge`]).

use std::sync::Arc;

use super::read::frame_header;
use super::{EntryId, Inner, PURGED_FILE};
use crate::error::{Error, Result};
use crate::log::durable_file;
use crate::log::frames::ReadAhead;
use crate::log::{LogPoint, Segment};

impl Inner {
    /// Replaces the active segment (whose entries, if any, are purged or were never
    /// written) with an empty one starting at `to`.
    pub(super) fn restart_active(&mut self, to: LogPoint) -> Result<()> {
        let active = Arc::clone(self.writer.active());
        let key = self
            .offsets
            .iter()
            .find(|(_, s)| Arc::ptr_eq(&s.segment, &active))
            .map(|(k, _)| *k);
        active.seal()?;
        self.log.remove_suffix(&[active.base_lsn()])?;
        if let Some(k) = key {
            self.offsets.remove(&k);
        }
        self.tail.clear();
        self.writer.restart_at(to)?;
        self.track_active();
        Ok(())
    }

    pub(super) fn truncate_after(&mut self, keep: Option<u64>) -> Result<()> {
        let next = self.writer.next();
        let cut = keep.map_or(1, |k| k + 1);
        if cut >= next.entry {
            return Ok(());
        }
        if cut <= self.committed_index() {
            return Err(Error::Internal(format!(
                "truncating after entry {} would remove committed entries (committed {})",
                cut - 1,
                self.committed_index()
            )));
        }
        let later: Vec<u64> = self.offsets.range(cut..).map(|(b, _)| *b).collect();
        let holder = self
            .offsets
            .range(..cut)
            .next_back()
            .map(|(b, s)| (*b, Arc::clone(&s.segment)));
        match holder {
            Some((base, seg)) if Arc::ptr_eq(&seg, self.writer.active()) => {
                // The cut is inside the active segment: cut it there.
                let (_, offset) = self.locate(cut)?.ok_or_else(|| {
                    Error::Internal(format!("entry {cut} is not in the active segment"))
                })?;
                let to = self.point_of(&seg, base, offset, cut)?;
                self.writer.cut_active(offset, to)?;
                if let Some(o) = self.offsets.get_mut(&base).and_then(|s| s.offsets.as_mut()) {
                    o.truncate(usize::try_from(cut - base).unwrap_or(usize::MAX));
                }
                Ok(())
            }
            Some((base, seg)) => {
                // The cut falls after a sealed segment: only whole later segments may go.
                let first_later = later.first().copied().unwrap_or(u64::MAX);
                if first_later != cut {
                    return Err(Error::Internal(format!(
                        "truncating after entry {} would cut the sealed segment {} (entries from {base})",
                        cut - 1,
                        seg.path().display()
                    )));
                }
                self.drop_segments_from(cut)
            }
            None => self.drop_segments_from(cut),
        }
    }

    /// Unlinks every segment whose entries start at or after `cut` (newest first), then
    /// starts a new active segment where the first of them began.
    fn drop_segments_from(&mut self, cut: u64) -> Result<()> {
        let doomed: Vec<(u64, Arc<Segment>)> = self
            .offsets
            .range(cut..)
            .map(|(b, s)| (*b, Arc::clone(&s.segment)))
            .collect();
        let Some((_, first)) = doomed.first() else {
            return Ok(());
        };
        let header = first.header()?;
        let to = LogPoint {
            lsn: header.base_lsn,
            entry: header.base_entry,
            prev_term: header.prev_term,
        };
        let bases: Vec<u64> = doomed.iter().map(|(_, s)| s.base_lsn()).collect();
        // The active segment goes too: release its descriptor before unlinking.
        self.writer.active().seal()?;
        self.log.remove_suffix(&bases)?;
        for (b, _) in &doomed {
            self.offsets.remove(b);
        }
        self.tail.truncate_after(cut.saturating_sub(1));
        self.writer.restart_at(to)?;
        self.track_active();
        Ok(())
    }

    /// The log point of entry `index`, whose first frame is at `offset` of `seg` (whose
    /// first entry is `base`).
    fn point_of(&mut self, seg: &Segment, base: u64, offset: u64, index: u64) -> Result<LogPoint> {
        let mut ahead = ReadAhead::default();
        let head = frame_header(seg, &mut ahead, offset)?;
        let prev_term = if index > base {
            let (_, prev_offset) = self
                .locate(index - 1)?
                .ok_or_else(|| Error::Internal(format!("entry {} is not stored", index - 1)))?;
            frame_header(seg, &mut ahead, prev_offset)?.term
        } else {
            seg.header()?.prev_term
        };
        Ok(LogPoint {
            lsn: head.lsn,
            entry: index,
            prev_term,
        })
    }

    pub(super) fn purge_through(&mut self, through: EntryId) -> Result<()> {
        if self.purged.is_some_and(|p| p.id.index >= through.index) {
            return Ok(());
        }
        let next = self.writer.next();
        // The LSN entry `through + 1` has (or gets): a restart after the purge, or after a
        // crash part way through it, goes on there.
        let lsn_after = if through.index + 1 >= next.entry {
            next.lsn
        } else {
            match self.locate(through.index + 1)? {
                Some((seg, offset)) => frame_header(&seg, &mut ReadAhead::default(), offset)?.lsn,
                None => next.lsn,
            }
        };
        let purged = Purged {
            id: through,
            lsn_after,
        };
        // Recorded before any segment goes: a crash part way is finished by the next open.
        durable_file::write(self.fs.as_ref(), &self.dir, PURGED_FILE, &purged.encode())?;
        self.purged = Some(purged);
        self.finish_purge()
    }

    /// When the log ends before the purged entry (a purge past the end, or a crash part way
    /// through one or through a truncation after it), drops what it holds and starts it
    /// again after the purged entry. Idempotent: the open calls it too.
    ///
    /// Sealed segments are **not** deleted by a purge: on a cluster member the engine's
    /// state is built from every retained segment (a snapshot *is* those segments, see
    /// `snapshot.rs`), so a segment goes only when retention has carried its state forward
    /// (`member.rs`, which unlinks only purged segments). A purge marks the entries
    /// as no longer needed by Raft: a follower that lacks them gets the snapshot.
    pub(super) fn finish_purge(&mut self) -> Result<()> {
        let Some(p) = self.purged else {
            return Ok(());
        };
        let next = self.writer.next();
        if next.entry < p.id.index + 1 {
            // Every entry the log holds is purged and the log ends before the purged entry:
            // what it holds cannot continue into what follows (a gap), so it goes whole,
            // oldest first, and the log goes on after the purged entry.
            let active = Arc::clone(self.writer.active());
            let sealed: Vec<(u64, u64)> = self
                .offsets
                .iter()
                .filter(|(_, s)| !Arc::ptr_eq(&s.segment, &active))
                .map(|(b, s)| (*b, s.segment.base_lsn()))
                .collect();
            if !sealed.is_empty() {
                let lsns: Vec<u64> = sealed.iter().map(|(_, l)| *l).collect();
                self.log.purge_prefix(&lsns)?;
                for (b, _) in sealed {
                    self.offsets.remove(&b);
                }
            }
            self.restart_active(LogPoint {
                lsn: if p.lsn_after > 0 {
                    p.lsn_after
                } else {
                    next.lsn
                },
                entry: p.id.index + 1,
                prev_term: p.id.term,
            })?;
        }
        Ok(())
    }
}

/// What was purged: the last purged entry and the LSN the entry after it has (or gets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Purged {
    pub id: EntryId,
    pub lsn_after: u64,
}

impl Purged {
    /// `PURGED`'s bytes: term, index, LSN after, each u64 LE (FORMAT.md).
    pub(super) fn encode(&self) -> Vec<u8> {
        [self.id.term, self.id.index, self.lsn_after]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    pub(super) fn decode(b: &[u8]) -> Option<Self> {
        let field = |i: usize| {
            b.get(i * 8..i * 8 + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_le_bytes)
        };
        (b.len() == 24).then_some(())?;
        Some(Self {
            id: EntryId {
                term: field(0)?,
                index: field(1)?,
            },
            lsn_after: field(2)?,
        })
    }
}
