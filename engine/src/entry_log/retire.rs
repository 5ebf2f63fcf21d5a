//! What a member needs to drop the oldest segments of its log (retention on a cluster,
//! issue 19 item 4): the list of sealed segments with the entries they hold, the unlinking
//! of a prefix of them, and the `BASE` file: what a rebuild needs from before the log's
//! first entry.
//!
//! **Why `BASE`.** A member's index is rebuilt from its log at every start and after a
//! snapshot install. Apply refuses a committed entry whose records do not fit the state
//! before it (`validate.rs`); replaying the log through the same rules repeats every
//! refusal, but only from the log's first entry: once the oldest segments are gone, the
//! state born in them reaches the replay later, in carried-forward snapshot records, and
//! the rules would refuse events that were accepted. So a member records which entries its
//! apply refused, through which entry (`through`), before it unlinks a segment; a rebuild
//! then applies the entries up to `through` without the rules (as a single node's recovery
//! replays its log), skipping the refused ones, and checks the entries after `through` as
//! they were checked the first time. The cluster's membership, an entry too, may lie in a
//! retired segment: `BASE` keeps the last one applied. A snapshot carries both, and its
//! install writes them as the receiver's `BASE` (FORMAT.md, "Retention on a cluster").

use std::path::PathBuf;
use std::sync::Arc;

use super::{EntryId, EntryLog};
use crate::error::{CorruptionKind, Error, Result};
use crate::log::durable_file::{self, Read};
use crate::log::Segment;

/// The base's file.
pub(crate) const BASE_FILE: &str = "BASE";
/// `BASE`'s first bytes.
const BASE_MAGIC: &[u8; 8] = b"CLBASE01";

/// A membership entry's id and its configuration (opaque to the engine).
pub type Membership = (EntryId, Vec<u8>);

/// What a rebuild needs from before a member's first entry: the refusals among entries
/// `..= through`, and the last membership applied through it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogBase {
    /// The last entry the base accounts for (0: none; every entry is checked on replay).
    pub through: u64,
    /// The refused entries, ascending.
    pub refused: Vec<EntryId>,
    /// The last membership entry applied, with its configuration (opaque to the engine).
    pub membership: Option<Membership>,
}

impl LogBase {
    /// `BASE`'s bytes: magic, `through`, then [`encode_tail`]'s refusals and membership.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = BASE_MAGIC.to_vec();
        b.extend_from_slice(&self.through.to_le_bytes());
        encode_tail(&self.refused, self.membership.as_ref(), &mut b);
        b
    }

    /// Decodes [`LogBase::encode`]'s bytes (`None` if they are not that).
    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let mut r = Fields(b);
        (r.take(8)? == BASE_MAGIC).then_some(())?;
        let through = r.u64()?;
        let (refused, membership) = decode_tail(&mut r)?;
        r.0.is_empty().then_some(Self {
            through,
            refused,
            membership,
        })
    }

    /// Whether entry `index` is listed as refused.
    pub(crate) fn refused(&self, index: u64) -> bool {
        self.refused
            .binary_search_by_key(&index, |id| id.index)
            .is_ok()
    }
}

/// Appends the refusals (count, then term and index each) and the membership (a `u8` flag,
/// then term, index, `u32` length and the configuration) as `BASE` and a snapshot manifest
/// lay them out; integers little-endian.
pub(crate) fn encode_tail(refused: &[EntryId], membership: Option<&Membership>, b: &mut Vec<u8>) {
    b.extend_from_slice(&(refused.len() as u64).to_le_bytes());
    for id in refused {
        b.extend_from_slice(&id.term.to_le_bytes());
        b.extend_from_slice(&id.index.to_le_bytes());
    }
    match membership {
        None => b.push(0),
        Some((id, config)) => {
            b.push(1);
            b.extend_from_slice(&id.term.to_le_bytes());
            b.extend_from_slice(&id.index.to_le_bytes());
            b.extend_from_slice(
                &u32::try_from(config.len())
                    .unwrap_or(u32::MAX)
                    .to_le_bytes(),
            );
            b.extend_from_slice(config);
        }
    }
}

/// Reads what [`encode_tail`] wrote.
pub(crate) fn decode_tail(r: &mut Fields<'_>) -> Option<(Vec<EntryId>, Option<Membership>)> {
    let count = r.u64()?;
    let mut refused = Vec::new();
    for _ in 0..count {
        refused.push(EntryId {
            term: r.u64()?,
            index: r.u64()?,
        });
    }
    let membership = match r.take(1)? {
        [0] => None,
        [1] => {
            let id = EntryId {
                term: r.u64()?,
                index: r.u64()?,
            };
            let len = usize::try_from(u32::from_le_bytes(r.take(4)?.try_into().ok()?)).ok()?;
            Some((id, r.take(len)?.to_vec()))
        }
        _ => return None,
    };
    Some((refused, membership))
}

/// A reader of little-endian fields.
pub(crate) struct Fields<'a>(pub(crate) &'a [u8]);

impl<'a> Fields<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
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

    /// The base recorded in `BASE` (an empty one when it is missing).
    ///
    /// # Errors
    /// The file is damaged ([`CorruptionKind::BadBody`]: what the log no longer holds is
    /// unknown); I/O failures.
    pub(crate) fn base(&self) -> Result<LogBase> {
        let inner = self.lock();
        let damaged = || Error::Corruption {
            segment: inner.dir.join(BASE_FILE),
            offset: 0,
            kind: CorruptionKind::BadBody("the BASE file does not decode".into()),
        };
        match durable_file::read(inner.fs.as_ref(), &inner.dir, BASE_FILE)? {
            Read::Missing => Ok(LogBase::default()),
            Read::Body(b) => LogBase::decode(&b).ok_or_else(damaged),
            Read::Damaged => Err(damaged()),
        }
    }

    /// Records `base` durably in `BASE` (temp file, fsync, rename, directory fsync).
    ///
    /// # Errors
    /// I/O failures (the old file stands).
    pub(crate) fn save_base(&self, base: &LogBase) -> Result<()> {
        let inner = self.lock();
        durable_file::write(inner.fs.as_ref(), &inner.dir, BASE_FILE, &base.encode())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_base_round_trips_and_bad_bytes_are_refused() {
        let base = LogBase {
            through: 42,
            refused: vec![
                EntryId { term: 2, index: 7 },
                EntryId { term: 3, index: 40 },
            ],
            membership: Some((EntryId { term: 1, index: 1 }, b"members".to_vec())),
        };
        let b = base.encode();
        assert_eq!(LogBase::decode(&b), Some(base.clone()));
        assert!(base.refused(7) && base.refused(40) && !base.refused(8));
        assert_eq!(LogBase::decode(&b[..b.len() - 1]), None);
        let mut wrong = b.clone();
        wrong[0] ^= 1;
        assert_eq!(LogBase::decode(&wrong), None);
        let empty = LogBase::default();
        assert_eq!(LogBase::decode(&empty.encode()), Some(empty));
    }
}
