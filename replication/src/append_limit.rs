//! Keeps an AppendEntries call under a size limit. openraft sends up to
//! `max_payload_entries` (300) entries in one call whatever their size, and 0.10 has no error
//! that makes it send fewer: 300 groups of 256 KiB are 75 MiB, over the transport's message
//! limit, and a call refused for its size was retried unchanged for ever (a wiped member
//! never caught up). So the client sends the longest prefix that fits and answers openraft
//! `PartialSuccess` up to the prefix's last entry; openraft sends the rest next.
//!
//! The limit adapts to the peer ([`AppendBudget`]), and a call's deadline grows with its
//! bytes ([`append_deadline`]): on a loaded 2-core machine a follower took in about 1 MB/s, so
//! an 8 MiB call never finished inside a fixed 1 s deadline and the leader resent the same
//! 8 MiB for ever (a wiped member stopped catching up, 224 of 255 entries, for a minute).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};

use crate::types::{LogId, TypeConfig};

/// The most entry bytes one AppendEntries call carries: small enough that the follower's
/// write and fdatasync of them fit the call's deadline, far under the message limit.
pub const APPEND_BYTES_MAX: usize = 8 << 20;

/// The least a shrunk [`AppendBudget`] allows (a single larger entry is still sent alone).
pub const APPEND_BYTES_MIN: usize = 256 << 10;

/// The slowest rate at which a follower taking in entries still counts as making progress:
/// each call's deadline allows its bytes at this rate on top of the fixed minimum.
const APPEND_RATE_FLOOR_BYTES_PER_SEC: u64 = 2 << 20;

/// Bytes one entry adds to a call besides its records (log id, payload tag, lengths).
const ENTRY_OVERHEAD_BYTES: usize = 64;

/// How many entry bytes the next AppendEntries to one peer may carry. A call that failed
/// (timed out, or its connection broke) while carrying entries halves it, down to
/// [`APPEND_BYTES_MIN`]; one that was answered doubles it, up to the ceiling. A follower that
/// takes entries in slowly is then sent calls it can finish, rather than the same
/// too-large call again. Clones share the budget (one per peer, kept across openraft's
/// clients to it).
#[derive(Debug, Clone)]
pub struct AppendBudget {
    bytes: Arc<AtomicUsize>,
    ceiling: usize,
}

impl AppendBudget {
    /// A budget starting at, and never above, `ceiling` bytes.
    pub fn new(ceiling: usize) -> Self {
        let ceiling = ceiling.max(APPEND_BYTES_MIN);
        Self {
            bytes: Arc::new(AtomicUsize::new(ceiling)),
            ceiling,
        }
    }

    /// The entry bytes the next call may carry.
    pub fn limit(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// A call carrying `sent` entry bytes was answered: allow twice as much next.
    pub fn answered(&self, sent: usize) {
        if sent == 0 {
            return;
        }
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_mul(2).min(self.ceiling))
            });
    }

    /// [`AppendBudget::failed`], logging at INFO, with `peer` and `why`, when the budget
    /// shrinks.
    pub fn failed_to(&self, peer: crate::types::NodeId, sent: usize, why: &dyn std::fmt::Display) {
        let before = self.limit();
        self.failed(sent);
        if self.limit() < before {
            tracing::info!(
                peer,
                sent,
                limit = self.limit(),
                %why,
                "an AppendEntries request carrying entries failed: the next ones to this peer \
                 carry fewer bytes (doubling back as requests are answered)"
            );
        }
    }

    /// A call carrying `sent` entry bytes failed: allow half of what it carried next.
    pub fn failed(&self, sent: usize) {
        if sent == 0 {
            return;
        }
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some((b.min(sent) / 2).max(APPEND_BYTES_MIN))
            });
    }
}

/// The deadline of an AppendEntries call carrying `bytes` of entries: `base` plus the time
/// those bytes take at 2 MiB/s (the slowest rate still counted as progress).
pub fn append_deadline(base: Duration, bytes: usize) -> Duration {
    let per_sec = APPEND_RATE_FLOOR_BYTES_PER_SEC;
    base + Duration::from_millis((bytes as u64).saturating_mul(1000) / per_sec)
}

/// The entry bytes `rpc` carries (what its deadline and the budget count).
pub fn request_bytes(rpc: &AppendEntriesRequest<TypeConfig>) -> usize {
    rpc.entries.iter().map(entry_bytes).sum()
}

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
                    payload: openraft::EntryPayload::Normal(Proposal::new(vec![7; *n])),
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
    fn the_budget_halves_after_a_failed_call_and_doubles_back_after_answers() {
        let budget = AppendBudget::new(8 << 20);
        assert_eq!(budget.limit(), 8 << 20);
        budget.failed(8 << 20);
        assert_eq!(budget.limit(), 4 << 20);
        // A failed small call halves what it carried, not the budget.
        budget.failed(1 << 20);
        assert_eq!(budget.limit(), 512 << 10);
        for _ in 0..10 {
            budget.failed(512 << 10);
        }
        assert_eq!(budget.limit(), APPEND_BYTES_MIN, "never below the floor");
        // Heartbeats (no entries) say nothing about what a peer can take.
        budget.failed(0);
        budget.answered(0);
        assert_eq!(budget.limit(), APPEND_BYTES_MIN);
        for _ in 0..4 {
            budget.answered(APPEND_BYTES_MIN);
        }
        assert_eq!(budget.limit(), 4 << 20);
        for _ in 0..10 {
            budget.answered(4 << 20);
        }
        assert_eq!(budget.limit(), 8 << 20, "never above the ceiling");
        let shared = budget.clone();
        shared.failed(8 << 20);
        assert_eq!(budget.limit(), 4 << 20, "clones share one budget");
    }

    #[test]
    fn a_call_gets_time_for_its_bytes_on_top_of_the_base() {
        let base = Duration::from_secs(1);
        assert_eq!(append_deadline(base, 0), base);
        assert_eq!(append_deadline(base, 8 << 20), Duration::from_secs(5));
        assert_eq!(append_deadline(base, 1 << 20), Duration::from_millis(1500));
        assert_eq!(
            request_bytes(&request(&[1_000, 2_000], 11)),
            3_000 + 2 * ENTRY_OVERHEAD_BYTES
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
