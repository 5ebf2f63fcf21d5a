//! A member that starts without a saved vote may have lost one: its data directory was wiped
//! or replaced while it was down. Raft needs a member to remember its vote, or it can vote
//! twice in one term and two leaders can commit different entries at the same index.
//!
//! The same holds for a member whose log lost entries it had acknowledged (a tail cut at
//! start): with the leader down, its vote could elect a member that missed them.
//!
//! [`VoteGuard`] closes both: until this member holds everything a leader had committed when
//! it reached it (the leader's vote is then saved in `VOTE`), it grants a vote or pre-vote
//! only to a candidate whose log ends at the cluster's first entry, which is what every
//! candidate of a cluster being formed has. A candidate of a running cluster has more, so
//! such a member takes no part in an election until a leader has caught it up. (What
//! remains: a term it voted in before the loss that is newer than the leader that reaches
//! it; with three members that needs a third candidate in that same term, which cannot
//! exist.)
//!
//! The guard survives a restart (review R10): a member that starts on an empty directory
//! writes the `AMNESIAC` mark (FORMAT.md) before Raft starts, and removes it only when the
//! guard lifts. A member that restarts with the mark keeps the guard on even though it has
//! a `VOTE` by then (the first heartbeat saved the leader's), so a member that restarts
//! while still catching up does not vote for a candidate lacking what it once acknowledged.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cursorlog_engine::EntryLog;
use openraft::async_runtime::WatchReceiver as _;
use openraft::storage::RaftStateMachine;
use openraft::ServerState;

use crate::types::{LogId, Raft, TypeConfig};

/// Whether this member may vote yet (see the module docs). Clones share the state.
#[derive(Debug, Clone, Default)]
pub struct VoteGuard {
    amnesiac: Arc<AtomicBool>,
    /// The highest commit a leader has told this member of since it started.
    seen_commit: Arc<Mutex<Option<LogId>>>,
    /// Where the guard is kept across restarts (the `AMNESIAC` mark), if anywhere.
    mark: Option<EntryLog>,
}

impl VoteGuard {
    /// A guard for a member that started without a saved vote (`amnesiac`), or with one.
    pub fn new(amnesiac: bool) -> Self {
        Self {
            amnesiac: Arc::new(AtomicBool::new(amnesiac)),
            seen_commit: Arc::default(),
            mark: None,
        }
    }

    /// The guard of the member whose log is `log`, kept across restarts: on when `fresh`
    /// (it starts without a saved vote: the mark is written, durably, before this returns)
    /// or when a previous start left the mark; the mark is removed when the guard lifts.
    ///
    /// # Errors
    /// The mark cannot be read or written.
    pub fn durable(log: &EntryLog, fresh: bool) -> cursorlog_engine::Result<Self> {
        if fresh {
            log.mark_amnesiac(true)?;
        }
        let amnesiac = fresh || log.amnesiac()?;
        if amnesiac && !fresh {
            tracing::info!(
                "this member restarted before it caught up with a leader (the AMNESIAC mark): \
                 it votes again once a leader has caught it up"
            );
        }
        Ok(Self {
            mark: Some(log.clone()),
            ..Self::new(amnesiac)
        })
    }

    /// The guard lifted: removes the mark, so a restart does not put it back.
    fn lifted(mark: Option<&EntryLog>) {
        if let Some(log) = mark {
            if let Err(e) = log.mark_amnesiac(false) {
                tracing::warn!(error = %e, "cannot remove the AMNESIAC mark: the vote guard \
                    returns at the next restart until a leader catches this member up again");
            }
        }
    }

    /// Why this member refuses a vote (or pre-vote) to a candidate whose log ends at
    /// `candidate_last`, or `None` when it may answer it as Raft says.
    ///
    /// While guarded, a candidate of a formed cluster is refused unless its log reaches the
    /// highest commit a leader told this member of (a log whose last id is at or past a
    /// committed id holds that entry): a member still catching up after the cluster formed
    /// does not block the election of a member that holds everything committed.
    pub fn refusal(&self, candidate_last: Option<&LogId>) -> Option<String> {
        let formed = candidate_last.is_some_and(|id| id.index > 0);
        if !formed || !self.amnesiac.load(Ordering::Acquire) {
            return None;
        }
        let seen = *self
            .seen_commit
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match (seen, candidate_last) {
            (Some(c), Some(last)) if *last >= c => None,
            _ => Some(
                "this member started without a saved vote (its data may have been lost): it \
                 votes once a leader has reached it, for a candidate holding what that leader \
                 committed"
                    .to_owned(),
            ),
        }
    }

    /// Whether the member still waits for a leader before it votes.
    pub fn waiting(&self) -> bool {
        self.amnesiac.load(Ordering::Acquire)
    }

    /// Lifts the guard if `raft` becomes the leader (elected, it holds every committed
    /// entry), from a task on the current runtime. Without it, a member formed the cluster
    /// and led ever since could refuse the one vote a successor needs.
    pub fn lift_when_leading<SM>(&self, raft: &Raft<SM>)
    where
        SM: RaftStateMachine<TypeConfig>,
    {
        if !self.waiting() {
            return;
        }
        let amnesiac = Arc::clone(&self.amnesiac);
        let mark = self.mark.clone();
        let mut metrics = raft.metrics();
        tokio::spawn(async move {
            loop {
                if !amnesiac.load(Ordering::Acquire) {
                    return;
                }
                if metrics.borrow_watched().state == ServerState::Leader {
                    amnesiac.store(false, Ordering::Release);
                    Self::lifted(mark.as_ref());
                    tracing::info!("elected leader: this member votes again");
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Called with each AppendEntries this member accepted: `holds` is the last entry it now
    /// holds from that leader, `leader_commit` the leader's commit index then. Lifts the
    /// guard once the member holds everything the leader had committed: from then on it
    /// cannot help elect a candidate that lacks an entry it once acknowledged.
    pub fn accepted_append(&self, holds: Option<u64>, leader_commit: Option<LogId>) {
        if let Some(c) = leader_commit {
            let mut seen = self
                .seen_commit
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if seen.is_none_or(|s| c > s) {
                *seen = Some(c);
            }
        }
        let leader_commit = leader_commit.map(|c| c.index);
        let caught_up = leader_commit.is_none_or(|c| holds.is_some_and(|h| h >= c));
        if caught_up && self.amnesiac.swap(false, Ordering::AcqRel) {
            Self::lifted(self.mark.as_ref());
            tracing::info!(
                leader_commit,
                "caught up with the leader's committed entries: this member votes again"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &std::path::Path) -> EntryLog {
        EntryLog::open(cursorlog_engine::EntryLogConfig {
            dir: dir.to_path_buf(),
            segment_bytes_max: 1 << 20,
        })
        .expect("open the log")
    }

    #[test]
    fn the_guard_survives_a_restart_until_it_lifts() {
        let dir = tempfile::tempdir().expect("dir");
        let log = open(dir.path());
        let guard = VoteGuard::durable(&log, true).expect("fresh start");
        assert!(guard.waiting());
        // A heartbeat saved the leader's vote; the member restarts before it caught up.
        guard.accepted_append(Some(3), Some(LogId::new_term_index(2, 40)));
        drop((guard, log));
        let log = open(dir.path());
        let guard = VoteGuard::durable(&log, false).expect("restart with a VOTE");
        assert!(
            guard.waiting(),
            "the mark keeps the guard on despite the VOTE"
        );
        assert!(guard.refusal(Some(&LogId::new_term_index(2, 17))).is_some());
        guard.accepted_append(Some(40), Some(LogId::new_term_index(2, 40)));
        assert!(!guard.waiting());
        drop((guard, log));
        let log = open(dir.path());
        let guard = VoteGuard::durable(&log, false).expect("restart after catching up");
        assert!(!guard.waiting(), "lifted for good once caught up");
        assert!(!log.amnesiac().expect("read"));
    }

    #[test]
    fn an_amnesiac_member_refuses_only_candidates_of_a_formed_cluster() {
        let guard = VoteGuard::new(true);
        assert!(guard.refusal(None).is_none(), "an empty candidate log");
        assert!(
            guard.refusal(Some(&LogId::new_term_index(0, 0))).is_none(),
            "a cluster being formed: its candidates hold only the first membership"
        );
        let why = guard.refusal(Some(&LogId::new_term_index(3, 17)));
        assert!(why.is_some_and(|w| w.contains("without a saved vote")));
        assert!(VoteGuard::new(false)
            .refusal(Some(&LogId::new_term_index(3, 17)))
            .is_none());
    }

    #[test]
    fn while_catching_up_it_votes_only_for_a_candidate_holding_what_a_leader_committed() {
        let guard = VoteGuard::new(true);
        guard.accepted_append(Some(12), Some(LogId::new_term_index(2, 30)));
        assert!(guard.waiting());
        assert!(guard.refusal(Some(&LogId::new_term_index(2, 29))).is_some());
        assert!(guard.refusal(Some(&LogId::new_term_index(2, 30))).is_none());
        assert!(
            guard.refusal(Some(&LogId::new_term_index(3, 5))).is_none(),
            "a later term's entry is written by a leader that held entry 30"
        );
        assert!(guard.refusal(Some(&LogId::new_term_index(1, 90))).is_some());
    }

    #[test]
    fn the_guard_lifts_only_once_the_member_holds_what_the_leader_committed() {
        let guard = VoteGuard::new(true);
        guard.accepted_append(None, Some(LogId::new_term_index(2, 40)));
        guard.accepted_append(Some(39), Some(LogId::new_term_index(2, 40)));
        assert!(
            guard.waiting(),
            "entry 40 was committed and is not here yet"
        );
        guard.accepted_append(Some(40), Some(LogId::new_term_index(2, 40)));
        assert!(!guard.waiting());
        let fresh = VoteGuard::new(true);
        fresh.accepted_append(None, None);
        assert!(!fresh.waiting(), "nothing committed yet: nothing to miss");
    }
}
