//! Keeps an AppendEntries call under a size limit. openraft sends up to
//! `max_payload_entries` (300) entries in one call whatever their size, and 0.10 has no error
//! that makes it send fewer: 300 groups of 256 KiB are 75 MiB, over the transport's message
//! limit, and a call refused for its size was retried unchanged for ever (a wiped member
//! never caught up). So the client sends the longest prefix that fits and answers openraft
//! `PartialSuccess` up to the prefix's last entry; openraft sends the rest next.

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};

use crate::types::{LogId, TypeConfig};

/// The most entry bytes one AppendEntries call carries: small enough that the follower's
/// write and fdatasync of them fit the call's deadline, far under the message limit.
pub const APPEND_BYTES_MAX: usize = 8 << 20;

/// Bytes one entry adds to a call besides its records (log id, payload tag, lengths).
const ENTRY_OVERHEAD_BYTES: usize = 64;

/// What to send for `rpc` under `limit` bytes of entries: `None` when it fits as it is, else
/// a request with the longest prefix of its entries that fits (at least one: a single entry
/// larger than the limit is sent alone, and the transport's own message limit decides).
pub fn prefix_to_send(
    rpc: &AppendEntriesRequest<TypeConfig>,
    limit: usize,
) -> Option<AppendEntriesRequest<TypeConfig>> {
    let mut total = 0usize;
    let mut fit = 0usize;
    for entry in &rpc.entries {
        total += entry_bytes(entry);
        if total > limit {
            break;
        }
        fit += 1;
    }
    if fit == rpc.entries.len() {
        return None;
    }
    let entries = rpc.entries[..fit.max(1)].to_vec();
    let last = entries.last().map(|e| e.log_id);
    Some(AppendEntriesRequest {
        vote: rpc.vote,
        prev_log_id: rpc.prev_log_id,
        // The follower commits up to min(leader's commit, what it holds): the same rule,
        // applied here so nothing past the prefix is ever named committed to it.
        leader_commit: match (rpc.leader_commit, last) {
            (Some(c), Some(l)) if c.index > l.index => Some(l),
            (c, _) => c,
        },
        entries,
    })
}

/// openraft's view of the follower's answer to a prefix ending at `last`: a full success is
/// a success up to `last` only.
pub fn answer_for_prefix(
    response: AppendEntriesResponse<TypeConfig>,
    last: Option<LogId>,
) -> AppendEntriesResponse<TypeConfig> {
    match response {
        AppendEntriesResponse::Success => AppendEntriesResponse::PartialSuccess(last),
        other => other,
    }
}

fn entry_bytes(entry: &crate::types::Entry) -> usize {
    let records = match &entry.payload {
        openraft::EntryPayload::Normal(p) => p.records.len(),
        openraft::EntryPayload::Membership(_) | openraft::EntryPayload::Blank => 0,
    };
    records + ENTRY_OVERHEAD_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Entry, Proposal, Vote};

    fn request(sizes: &[usize], commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: Some(LogId::new_term_index(3, 9)),
            leader_commit: Some(LogId::new_term_index(3, commit)),
            entries: sizes
                .iter()
                .enumerate()
                .map(|(i, n)| Entry {
                    log_id: LogId::new_term_index(3, 10 + i as u64),
                    payload: openraft::EntryPayload::Normal(Proposal {
                        records: vec![7; *n],
                    }),
                })
                .collect(),
        }
    }

    #[test]
    fn a_call_over_the_limit_sends_the_longest_prefix_that_fits() {
        let rpc = request(&[20_000; 10], 19);
        let sent = prefix_to_send(&rpc, 64 << 10).expect("200 KB is over 64 KiB");
        assert_eq!(sent.entries.len(), 3);
        assert_eq!(sent.prev_log_id, rpc.prev_log_id);
        assert_eq!(sent.vote, rpc.vote);
        assert_eq!(
            sent.leader_commit,
            Some(LogId::new_term_index(3, 12)),
            "nothing past the prefix may be named committed"
        );
        let last = sent.entries.last().map(|e| e.log_id);
        assert_eq!(
            answer_for_prefix(AppendEntriesResponse::Success, last),
            AppendEntriesResponse::PartialSuccess(Some(LogId::new_term_index(3, 12)))
        );
        assert_eq!(
            answer_for_prefix(AppendEntriesResponse::Conflict, last),
            AppendEntriesResponse::Conflict
        );
    }

    #[test]
    fn a_call_that_fits_is_sent_whole_and_a_huge_entry_alone() {
        assert!(prefix_to_send(&request(&[1_000; 10], 19), 64 << 10).is_none());
        assert!(prefix_to_send(&request(&[], 9), 64 << 10).is_none());
        let huge = prefix_to_send(&request(&[100_000, 10], 11), 64 << 10).expect("over");
        assert_eq!(huge.entries.len(), 1);
        assert_eq!(huge.leader_commit, Some(LogId::new_term_index(3, 10)));
        let low = prefix_to_send(&request(&[40_000; 3], 5), 64 << 10).expect("over");
        assert_eq!(
            low.leader_commit,
            Some(LogId::new_term_index(3, 5)),
            "a commit below the prefix stays"
        );
    }
}
