//! The records of one atomic group as a replicated entry carries them between nodes: a
//! leader's planner frames a group's records into a [`Proposal`], openraft carries its bytes,
//! and every replica writes them as the entry's frames. Layout (little-endian): `u32` record
//! count, then per record `u8` record type tag, `u32` body length, body (FORMAT.md's record
//! bodies). A proposal is checked before anything is written: every record must decode.

use crate::format::BODY_BYTES_MAX;
use crate::record::Record;

/// The encoded records of one atomic group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Proposal {
    bytes: Vec<u8>,
}

/// One record of a proposal, raw: its type tag and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposedRecord {
    /// The record type tag (FORMAT.md).
    pub tag: u8,
    /// The record body.
    pub body: Vec<u8>,
}

/// Why a proposal's bytes are not a group of records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposalError {
    /// The bytes end inside a field.
    #[error("the proposal ends inside record {0}")]
    Truncated(usize),
    /// Bytes are left after the last record.
    #[error("{0} bytes follow the proposal's last record")]
    Trailing(usize),
    /// A proposal must hold at least one record.
    #[error("the proposal holds no record")]
    Empty,
    /// A record body is larger than any record may be.
    #[error("record {index} has a {len}-byte body (at most {BODY_BYTES_MAX})")]
    TooLarge {
        /// Which record.
        index: usize,
        /// Its body length.
        len: u32,
    },
    /// A record does not decode.
    #[error("record {index} does not decode: {why}")]
    BadRecord {
        /// Which record.
        index: usize,
        /// Why.
        why: String,
    },
}

impl Proposal {
    /// A proposal from its wire bytes (checked when it is written or decoded).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self { bytes }
    }

    /// The wire bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The wire bytes, taken.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// A proposal of raw records (no check: see [`Proposal::records`]).
    pub fn from_records(records: &[ProposedRecord]) -> Self {
        Self::from_raw(records.iter().map(|r| (r.tag, r.body.clone())).collect())
    }

    pub(crate) fn from_raw(records: Vec<(u8, Vec<u8>)>) -> Self {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(
            &u32::try_from(records.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        for (tag, body) in records {
            bytes.push(tag);
            bytes.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
            bytes.extend_from_slice(&body);
        }
        Self { bytes }
    }

    /// The records this proposal holds, as its header says.
    fn count(&self) -> u32 {
        self.bytes
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    }

    /// The bytes of this proposal with `other`'s records appended (see [`Proposal::extend`]).
    pub(crate) fn merged_len(&self, other: &Self) -> usize {
        self.bytes.len() + other.bytes.len().saturating_sub(4)
    }

    /// Appends `other`'s records after this proposal's: one entry carrying consecutive
    /// groups (applied in order, refused whole).
    pub(crate) fn extend(&mut self, other: &Self) {
        if self.bytes.len() < 4 {
            self.bytes.clone_from(&other.bytes);
            return;
        }
        let count = self.count().saturating_add(other.count());
        self.bytes[..4].copy_from_slice(&count.to_le_bytes());
        self.bytes
            .extend_from_slice(other.bytes.get(4..).unwrap_or_default());
    }

    /// The raw records.
    ///
    /// # Errors
    /// The bytes are not a sequence of records (a record's body is not checked).
    pub fn records(&self) -> Result<Vec<ProposedRecord>, ProposalError> {
        let mut at = 0usize;
        let b = &self.bytes;
        let take = |at: &mut usize, n: usize, index: usize| -> Result<&[u8], ProposalError> {
            let s = b
                .get(*at..at.saturating_add(n))
                .ok_or(ProposalError::Truncated(index))?;
            *at += n;
            Ok(s)
        };
        let count = u32::from_le_bytes(
            take(&mut at, 4, 0)?
                .try_into()
                .map_err(|_| ProposalError::Truncated(0))?,
        );
        if count == 0 {
            return Err(ProposalError::Empty);
        }
        let mut out = Vec::new();
        for index in 0..count as usize {
            let tag = take(&mut at, 1, index)?[0];
            let len = u32::from_le_bytes(
                take(&mut at, 4, index)?
                    .try_into()
                    .map_err(|_| ProposalError::Truncated(index))?,
            );
            if len > BODY_BYTES_MAX {
                return Err(ProposalError::TooLarge { index, len });
            }
            let body = take(&mut at, len as usize, index)?.to_vec();
            out.push(ProposedRecord { tag, body });
        }
        if at != b.len() {
            return Err(ProposalError::Trailing(b.len() - at));
        }
        Ok(out)
    }

    /// The records, decoded: what the entry's frames will hold.
    pub(crate) fn decode(&self) -> Result<Vec<Record>, ProposalError> {
        self.records()?
            .into_iter()
            .enumerate()
            .map(|(index, r)| {
                Record::decode(r.tag, &r.body)
                    .map_err(|why| ProposalError::BadRecord { index, why })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tag;

    #[test]
    fn merged_proposals_hold_the_records_of_each_in_order() {
        let one = |body: &[u8]| {
            Proposal::from_raw(vec![(tag::MEMBERSHIP, body.to_vec()), (tag::BLANK, vec![])])
        };
        let (a, b) = (one(b"a"), one(b"bb"));
        let mut merged = a.clone();
        assert_eq!(
            merged.merged_len(&b),
            a.as_bytes().len() + b.as_bytes().len() - 4
        );
        merged.extend(&b);
        assert_eq!(merged.as_bytes().len(), a.merged_len(&b));
        let mut expected = a.records().unwrap();
        expected.extend(b.records().unwrap());
        assert_eq!(merged.records(), Ok(expected));
        let mut empty = Proposal::default();
        empty.extend(&a);
        assert_eq!(empty, a);
    }

    #[test]
    fn records_round_trip_and_bad_bytes_are_named() {
        let p = Proposal::from_records(&[
            ProposedRecord {
                tag: tag::BLANK,
                body: Vec::new(),
            },
            ProposedRecord {
                tag: tag::MEMBERSHIP,
                body: b"cfg".to_vec(),
            },
        ]);
        assert_eq!(p.decode().map(|r| r.len()), Ok(2));
        let same = Proposal::from_bytes(p.as_bytes().to_vec());
        assert_eq!(same, p);
        assert_eq!(
            Proposal::from_bytes(vec![0, 0, 0, 0]).records(),
            Err(ProposalError::Empty)
        );
        let mut cut = p.as_bytes().to_vec();
        cut.pop();
        assert_eq!(
            Proposal::from_bytes(cut).records(),
            Err(ProposalError::Truncated(1))
        );
        let mut long = p.as_bytes().to_vec();
        long.push(9);
        assert_eq!(
            Proposal::from_bytes(long).records(),
            Err(ProposalError::Trailing(1))
        );
        let bad = Proposal::from_raw(vec![(200, vec![1])]);
        assert!(matches!(
            bad.decode(),
            Err(ProposalError::BadRecord { index: 0, .. })
        ));
        let blank_with_body = Proposal::from_raw(vec![(tag::BLANK, vec![1])]);
        assert!(matches!(
            blank_with_body.decode(),
            Err(ProposalError::BadRecord { index: 0, .. })
        ));
    }
}
