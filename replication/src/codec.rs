//! The one place that turns openraft's messages into wire bytes and back.
//!
//! Format: [postcard](https://docs.rs/postcard) 1.x over openraft's serde derives. postcard is
//! a compact binary serde format (varint integers, length-prefixed byte strings): a
//! [`Proposal`](crate::Proposal)'s records travel as a length and the raw bytes, not as a
//! JSON array of numbers (JSON would send each byte as up to four characters plus a comma).
//! It is chosen over bincode because the workspace pins bincode `=2.0.1` without its serde
//! feature and keeps it behind the engine's own codec (the log format); the Raft wire format is
//! a separate concern and should not move when the log format does. postcard needs no
//! `deserialize_any`, and openraft's wire types use no `untagged`/`flatten` serde attributes, so
//! everything openraft sends round-trips (the tests below check each message kind).
//!
//! Compatibility: postcard is not self-describing, so both ends must run the same openraft
//! version and the same [`TypeConfig`]. The exact openraft pin
//! (Cargo.toml) is what keeps this true within one release of cursorlog; a rolling upgrade
//! across an openraft bump needs a version field here first.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::types::{TypeConfig, Vote};

/// A message that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// Encoding failed (a serde impl refused the value).
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// The message kind.
        what: &'static str,
        /// postcard's error.
        #[source]
        source: postcard::Error,
    },
    /// The bytes are not a valid message of the expected kind.
    #[error("cannot decode {what}: {source}")]
    Decode {
        /// The message kind.
        what: &'static str,
        /// postcard's error.
        #[source]
        source: postcard::Error,
    },
    /// The bytes hold a valid message followed by more bytes.
    #[error("cannot decode {what}: {extra} bytes after the message")]
    Trailing {
        /// The message kind.
        what: &'static str,
        /// How many bytes were left over.
        extra: usize,
    },
}

/// Encodes `value`; `what` names it in the error.
///
/// # Errors
/// [`CodecError::Encode`].
pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    postcard::to_stdvec(value).map_err(|source| CodecError::Encode { what, source })
}

/// Decodes exactly one `T` from `bytes`; `what` names it in the error.
///
/// # Errors
/// [`CodecError::Decode`], or [`CodecError::Trailing`] when bytes are left over.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|source| CodecError::Decode { what, source })?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(CodecError::Trailing {
            what,
            extra: rest.len(),
        })
    }
}

/// The first chunk of a snapshot stream: who sends it and which snapshot it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotHead {
    /// The sending leader's vote.
    pub vote: Vote,
    /// The snapshot's last log id and membership.
    pub meta: openraft::type_config::alias::SnapshotMetaOf<TypeConfig>,
}

#[cfg(test)]
mod tests {
    use openraft::entry::RaftEntry as _;
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};

    use super::*;
    use crate::types::{Entry, LogId, Proposal};

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new_term_index(term, index)
    }

    fn entry(term: u64, index: u64, records: Vec<u8>) -> Entry {
        Entry::new_normal(log_id(term, index), Proposal::new(records))
    }

    #[test]
    fn append_entries_round_trips_and_payload_bytes_travel_raw() {
        let records = vec![0xAB_u8; 4096];
        let req = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: Some(log_id(3, 9)),
            entries: vec![
                entry(3, 10, records.clone()),
                Entry::new_blank(log_id(3, 11)),
                Entry::new_membership(
                    log_id(3, 12),
                    openraft::Membership::new(
                        vec![[1, 2, 3].into()],
                        (1..=4)
                            .map(|id| (id, crate::RaftNode::new(format!("127.0.0.1:{id}"))))
                            .collect::<std::collections::BTreeMap<_, _>>(),
                    )
                    .unwrap(),
                ),
            ],
            leader_commit: Some(log_id(3, 8)),
        };
        let bytes = encode("append", &req).unwrap();
        // 4096 payload bytes plus about a hundred bytes of framing and membership: raw, not one number per byte.
        assert!(
            bytes.len() < records.len() + 128,
            "{} bytes for a {}-byte payload",
            bytes.len(),
            records.len()
        );
        let back: AppendEntriesRequest<TypeConfig> = decode("append", &bytes).unwrap();
        assert_eq!(back.vote, req.vote);
        assert_eq!(back.prev_log_id, req.prev_log_id);
        assert_eq!(back.leader_commit, req.leader_commit);
        assert_eq!(back.entries, req.entries);
    }

    #[test]
    fn responses_and_votes_round_trip() {
        let resp = AppendEntriesResponse::<TypeConfig>::Conflict;
        let back: AppendEntriesResponse<TypeConfig> =
            decode("resp", &encode("resp", &resp).unwrap()).unwrap();
        assert_eq!(back, resp);

        let vote_req = VoteRequest::<TypeConfig>::new(Vote::new(4, 2), Some(log_id(3, 11)));
        let back: VoteRequest<TypeConfig> =
            decode("vote", &encode("vote", &vote_req).unwrap()).unwrap();
        assert_eq!(back, vote_req);

        let vote_resp = VoteResponse::<TypeConfig>::new(Vote::new(4, 2), Some(log_id(3, 11)), true);
        let back: VoteResponse<TypeConfig> =
            decode("vote resp", &encode("vote resp", &vote_resp).unwrap()).unwrap();
        assert_eq!(back, vote_resp);
    }

    #[test]
    fn trailing_bytes_and_garbage_are_refused() {
        let mut bytes = encode("vote", &Vote::new(1, 1)).unwrap();
        bytes.push(0);
        assert!(matches!(
            decode::<Vote>("vote", &bytes),
            Err(CodecError::Trailing { extra: 1, .. })
        ));
        assert!(matches!(
            decode::<AppendEntriesRequest<TypeConfig>>("append", &[0xff; 3]),
            Err(CodecError::Decode { .. })
        ));
    }

    /// `Proposal.records` is encoded as one byte string (serde_bytes), and its bytes are the
    /// ones a member of the build before wrote (a sequence of u8): old and new members read
    /// each other's entries, so a cluster upgrades one member at a time.
    #[test]
    fn proposal_bytes_are_the_wire_bytes_of_a_plain_byte_sequence() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Before {
            records: Vec<u8>,
        }
        let records: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let new = encode("new", &Proposal::new(records.clone())).unwrap();
        let old = encode(
            "old",
            &Before {
                records: records.clone(),
            },
        )
        .unwrap();
        assert_eq!(new, old);
        assert_eq!(decode::<Proposal>("old", &old).unwrap().records, records);
        assert_eq!(decode::<Before>("new", &new).unwrap().records, records);
    }
}
