//! What a member needs to drop the oldest segments of its log (retention on a cluster,
//! issue 19 item 4): the list of sealed segments with the entries they hold, the unlinking
//! of a prefix of them, and the `REFUSED` file.
//!
//! **Why `REFUSED`.** A member's index is rebuilt from its log at every start and after a
//! snapshot install. Apply refuses a committed entry whose records do not fit the state
//! before it (`validate.rs`); replaying the log through the same rules repeats every
//! refusal, but only from the log's first entry: once the oldest segments are gone, the
//! state born in them reaches the replay later, in carried-forward snapshot records, and
//! the rules would refuse events that were accepted. So a member records which entries its
//! apply refused, through which entry (`through`), before it unlinks a segment; a rebuild
//! then applies the entries up to `through` without the rules (as a single node's recovery
//! replays its log), skipping the refused ones, and checks the entries after `through` as
//! they were checked the first time. A snapshot carries the refusals among its entries,
//! and its install writes them as the receiver's `REFUSED` (FORMAT.md, "REFUSED").

use std::path::PathBuf;
use std::sync::Arc;

use super::{EntryId, EntryLog};
use crate::error::{CorruptionKind, Error, Result};
use crate::log::durable_file::{self, Read};
use crate::log::Segment;

/// The refusals' file.
pub(crate) const REFUSED_FILE: &str = "REFUSED";
/// `REFUSED`'s first bytes.
const REFUSED_MAGIC: &[u8; 8] = b"CLREFUS1";

/// The entries a member's apply refused among entries `..= through` of its log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refusals {
    /// The last entry the list accounts for (0: none; every entry is checked on replay).
    pub through: u64,
    /// The refused entries, ascending.
    pub entries: Vec<EntryId>,
}

impl Refusals {
    /// `REFUSED`'s bytes: magic, `through`, count, then per entry its term and index; all
    /// u64 little-endian.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = REFUSED_MAGIC.to_vec();
        b.extend_from_slice(&self.through.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for id in &self.entries {
            b.extend_from_slice(&id.term.to_le_bytes());
            b.extend_from_slice(&id.index.to_le_bytes());
        }
        b
    }

    /// Decodes [`Refusals::encode`]'s bytes (`None` if they are not that).
    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let word = |i: usize| {
            b.get(8 + i * 8..16 + i * 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_le_bytes)
        };
        (b.get(..8)? == REFUSED_MAGIC).then_some(())?;
        let through = word(0)?;
        let count = usize::try_from(word(1)?).ok()?;
        (b.len() == 24usize.checked_add(count.checked_mul(16)?)?).then_some(())?;
        let entries = (0..count)
            .map(|i| {
                Some(EntryId {
                    term: word(2 + 2 * i)?,
                    index: word(3 + 2 * i)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self { through, entries })
    }

    /// Whether entry `index` is listed.
    pub(crate) fn refused(&self, index: u64) -> bool {
        self.entries
            .binary_search_by_key(&index, |id| id.index)
            .is_ok()
    }
}

/// A sealed segment of the log and the entries it holds.
#[derive(Debug, Clone)]
pub(crate) struct HeldSegment {
    pub segment: Arc<Segment>,
    /// Its first entry.
    pub first_entry: u64,
    /// The first entry of the segment after it (it holds entries `first_entry..next_entry`).
    pub next_entry: u64,
    /// The base LSN of the segment after it (its records lie below).
    pub next_lsn: u64,
}

impl EntryLog {
    /// The first entry the log holds a frame of (`None`: it holds none).
    pub fn first_entry(&self) -> Option<u64> {
        let inner = self.lock();
        let next = inner.writer.next().entry;
        inner
            .offsets
            .keys()
            .next()
            .copied()
            .filter(|first| *first < next)
    }

    /// The sealed segments, oldest first, each with the entries it holds (the active one,
    /// which is still written, is never among them).
    pub(crate) fn sealed_segments(&self) -> Vec<HeldSegment> {
        let inner = self.lock();
        let active = inner.writer.active();
        let all: Vec<(u64, &Arc<Segment>)> = inner
            .offsets
            .iter()
            .map(|(b, s)| (*b, &s.segment))
            .collect();
        all.windows(2)
            .take_while(|w| !Arc::ptr_eq(w[0].1, active))
            .map(|w| HeldSegment {
                segment: Arc::clone(w[0].1),
                first_entry: w[0].0,
                next_entry: w[1].0,
                next_lsn: w[1].1.base_lsn(),
            })
            .collect()
    }

    /// Unlinks the `count` oldest segments, which must be sealed and hold only purged
    /// entries (Raft needs them no more: a member that lacks them gets a snapshot). The
    /// caller made sure their state is carried forward. Returns the paths removed.
    ///
    /// # Errors
    /// A segment that is not sealed or holds an entry not purged ([`Error::Internal`]);
    /// I/O failures.
    pub(crate) fn retire_oldest(&self, count: usize) -> Result<Vec<PathBuf>> {
        let held = self.sealed_segments();
        let mut inner = self.lock();
        inner.check_usable()?;
        let purged = inner.purged.map_or(0, |p| p.id.index);
        let Some(last) = count.checked_sub(1).and_then(|i| held.get(i)) else {
            return Err(Error::Internal(format!(
                "retiring {count} segments of {} sealed",
                held.len()
            )));
        };
        if last.next_entry > purged + 1 {
            return Err(Error::Internal(format!(
                "retiring segments holding entries up to {}, but only entries up to {purged} \
                 are purged",
                last.next_entry - 1
            )));
        }
        let retired = &held[..count];
        let bases: Vec<u64> = retired.iter().map(|h| h.segment.base_lsn()).collect();
        let r = inner.log.purge_prefix(&bases);
        inner.poison_on_io(&r);
        let paths = r?;
        for h in retired {
            inner.offsets.remove(&h.first_entry);
        }
        Ok(paths)
    }

    /// The refusals recorded in `REFUSED` (none when it is missing).
    ///
    /// # Errors
    /// The file is damaged ([`CorruptionKind::BadBody`]: the refusals are unknown); I/O
    /// failures.
    pub(crate) fn refusals(&self) -> Result<Refusals> {
        let inner = self.lock();
        let damaged = || Error::Corruption {
            segment: inner.dir.join(REFUSED_FILE),
            offset: 0,
            kind: CorruptionKind::BadBody("the REFUSED file does not decode".into()),
        };
        match durable_file::read(inner.fs.as_ref(), &inner.dir, REFUSED_FILE)? {
            Read::Missing => Ok(Refusals::default()),
            Read::Body(b) => Refusals::decode(&b).ok_or_else(damaged),
            Read::Damaged => Err(damaged()),
        }
    }

    /// Records `refusals` durably in `REFUSED` (temp file, fsync, rename, directory fsync).
    ///
    /// # Errors
    /// I/O failures (the old file stands).
    pub(crate) fn save_refusals(&self, refusals: &Refusals) -> Result<()> {
        let inner = self.lock();
        durable_file::write(
            inner.fs.as_ref(),
            &inner.dir,
            REFUSED_FILE,
            &refusals.encode(),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn refusals_round_trip_and_reject_bad_bytes() {
        let r = Refusals {
            through: 42,
            entries: vec![
                EntryId { term: 2, index: 7 },
                EntryId { term: 3, index: 40 },
            ],
        };
        let b = r.encode();
        assert_eq!(Refusals::decode(&b), Some(r.clone()));
        assert!(r.refused(7) && r.refused(40) && !r.refused(8));
        assert_eq!(Refusals::decode(&b[..b.len() - 1]), None);
        let mut wrong = b.clone();
        wrong[0] ^= 1;
        assert_eq!(Refusals::decode(&wrong), None);
        let empty = Refusals::default();
        assert_eq!(Refusals::decode(&empty.encode()), Some(empty));
    }
}
