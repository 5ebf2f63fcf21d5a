//! The records of one atomic group as a replicated entry carries them between nodes: a
//! leader's planner frames a group's records into a [`Proposal`], openraft carries its bytes,
//! and every replica writes them as the entry's frames. Layout (little-endian): `u32` record
//! count, then per record `u8` record type tag, `u32` body length, body (FORMAT.md's record
//! bodies). A proposal is checked before anything is written: every record must decode.

use bytes::Bytes;

use crate::format::BODY_BYTES_MAX;

/// The encoded records of one atomic group. The bytes are shared, not copied, between the
/// writer that built them, openraft, the log's tail cache and the messages to followers
/// (issue 31, "a leader that costs little more than a single node").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Proposal {
    bytes: Bytes,
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

/// The bytes a record takes in a proposal besides its body: its tag and body length.
pub(crate) const RECORD_HEAD_BYTES: usize = 5;

/// A proposal being built record by record (the leader's writer builds each entry's
/// proposal once, straight from its planned frames).
#[derive(Debug)]
pub(crate) struct ProposalBuilder {
    bytes: Vec<u8>,
    count: u32,
}

impl ProposalBuilder {
    /// An empty proposal with room for `capacity` bytes.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let mut bytes = Vec::with_capacity(capacity.max(4));
        bytes.extend_from_slice(&0u32.to_le_bytes());
        Self { bytes, count: 0 }
    }

    /// Appends one record.
    pub(crate) fn push(&mut self, tag: u8, body: &[u8]) {
        self.bytes.push(tag);
        self.bytes
            .extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
        self.bytes.extend_from_slice(body);
        self.count = self.count.saturating_add(1);
    }

    /// The proposal's length in bytes so far.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The proposal built.
    pub(crate) fn finish(mut self) -> Proposal {
        self.bytes[..4].copy_from_slice(&self.count.to_le_bytes());
        Proposal {
            bytes: Bytes::from(self.bytes),
        }
    }
}

impl Proposal {
    /// A proposal from its wire bytes (checked when it is written or decoded). A `Vec` or
    /// [`Bytes`] is taken as it is, without a copy.
    pub fn from_bytes(bytes: impl Into<Bytes>) -> Self {
        Self {
            bytes: bytes.into(),
        }
    }

    /// The wire bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The wire bytes, taken (shared, not copied).
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// A proposal of raw records (no check: see [`Proposal::records`]).
    pub fn from_records(records: &[ProposedRecord]) -> Self {
        Self::from_raw(records.iter().map(|r| (r.tag, r.body.as_slice())))
    }

    pub(crate) fn from_raw<B: AsRef<[u8]>>(records: impl IntoIterator<Item = (u8, B)>) -> Self {
        let mut b = ProposalBuilder::with_capacity(64);
        for (tag, body) in records {
            b.push(tag, body.as_ref());
        }
        b.finish()
    }

    /// The records as tag and body, each body a slice of these bytes (no copy).
    ///
    /// # Errors
    /// The bytes are not a sequence of records (a record's body is not checked).
    pub(crate) fn raw(&self) -> Result<Vec<(u8, Bytes)>, ProposalError> {
        let b = &self.bytes;
        let mut out = Vec::new();
        let mut at = 0usize;
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
            let start = at;
            take(&mut at, len as usize, index)?;
            out.push((tag, b.slice(start..at)));
        }
        if at != b.len() {
            return Err(ProposalError::Trailing(b.len() - at));
        }
        Ok(out)
    }

    /// The raw records.
    ///
    /// # Errors
    /// The bytes are not a sequence of records (a record's body is not checked).
    pub fn records(&self) -> Result<Vec<ProposedRecord>, ProposalError> {
        Ok(self
            .raw()?
            .into_iter()
            .map(|(tag, body)| ProposedRecord {
                tag,
                body: body.to_vec(),
            })
            .collect())
    }

    /// The records, decoded: what the entry's frames will hold.
    #[cfg(test)]
    pub(crate) fn decode(&self) -> Result<Vec<crate::record::Record>, ProposalError> {
        self.raw()?
            .into_iter()
            .enumerate()
            .map(|(index, (tag, body))| {
                crate::record::Record::decode(tag, &body)
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
    fn a_built_proposal_holds_the_records_pushed_in_order() {
        let mut b = ProposalBuilder::with_capacity(0);
        b.push(tag::MEMBERSHIP, b"a");
        b.push(tag::BLANK, b"");
        b.push(tag::MEMBERSHIP, b"bb");
        assert_eq!(b.len(), 4 + 3 * RECORD_HEAD_BYTES + 3);
        let built = b.finish();
        let raw = Proposal::from_raw(vec![
            (tag::MEMBERSHIP, b"a".to_vec()),
            (tag::BLANK, vec![]),
            (tag::MEMBERSHIP, b"bb".to_vec()),
        ]);
        assert_eq!(built, raw);
        assert_eq!(built.records().unwrap().len(), 3);
        let bodies: Vec<Vec<u8>> = built
            .raw()
            .unwrap()
            .into_iter()
            .map(|(_, b)| b.to_vec())
            .collect();
        assert_eq!(bodies, vec![b"a".to_vec(), vec![], b"bb".to_vec()]);
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
