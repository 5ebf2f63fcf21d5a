//! A member that starts without a saved vote may have lost one: its data directory was wiped
//! or replaced while it was down. Raft needs a member to remember its vote, or it can vote
//! twice in one term and two leaders can commit different entries at the same index.
//!
//! [`VoteGuard`] closes the common case: until a leader has reached this member (its vote is
//! then a leader's committed vote, saved in `VOTE`), it grants a vote or pre-vote only to a
//! candidate whose log ends at the cluster's first entry, which is what every candidate of a
//! cluster being formed has. A candidate of a running cluster has more, so a member that lost
//! its vote takes no part in an election until a leader has caught it up. (What remains: a
//! term it voted in before the loss that is newer than the leader that reaches it; with three
//! members that needs a third candidate in that same term, which cannot exist.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use openraft::async_runtime::WatchReceiver as _;
use openraft::storage::RaftStateMachine;

use crate::types::{LogId, Raft, TypeConfig};

/// Whether this member may vote yet (see the module docs). Clones share the state.
#[derive(Debug, Clone, Default)]
pub struct VoteGuard {
    amnesiac: Arc<AtomicBool>,
}

impl VoteGuard {
    /// A guard for a member that started without a saved vote (`amnesiac`), or with one.
    pub fn new(amnesiac: bool) -> Self {
        Self {
            amnesiac: Arc::new(AtomicBool::new(amnesiac)),
        }
    }

    /// Why this member refuses a vote (or pre-vote) to a candidate whose log ends at
    /// `candidate_last`, or `None` when it may answer it as Raft says.
    pub fn refusal(&self, candidate_last: Option<&LogId>) -> Option<String> {
        let formed = candidate_last.is_some_and(|id| id.index > 0);
        (formed && self.amnesiac.load(Ordering::Acquire)).then(|| {
            "this member started without a saved vote (its data may have been lost): it votes \
             once a leader has reached it"
                .to_owned()
        })
    }

    /// Whether the member still waits for a leader before it votes.
    pub fn waiting(&self) -> bool {
        self.amnesiac.load(Ordering::Acquire)
    }

    /// Lifts the guard once `raft`'s vote is a leader's committed vote (saved before openraft
    /// reports it), from a task on the current runtime.
    pub fn lift_when_led<SM>(&self, raft: &Raft<SM>)
    where
        SM: RaftStateMachine<TypeConfig>,
    {
        if !self.waiting() {
            return;
        }
        let amnesiac = Arc::clone(&self.amnesiac);
        let mut metrics = raft.metrics();
        tokio::spawn(async move {
            loop {
                let led = {
                    let m = metrics.borrow_watched();
                    m.vote.is_committed() && m.current_leader.is_some()
                };
                if led {
                    amnesiac.store(false, Ordering::Release);
                    tracing::info!("a leader reached this member: it votes again");
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
