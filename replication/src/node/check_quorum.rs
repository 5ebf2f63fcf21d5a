//! Check-quorum, which openraft 0.10 lacks: one task per member keeps "leads with a quorum"
//! current, hands the lead over when a quorum stops answering, decides when the heartbeats it
//! silenced at the handover come back, and steps down when nobody took the lead.
//!
//! A leader that asked for a transfer is done in openraft 0.10: it sends no heartbeats,
//! forwards every write and read, and has no way to cancel the transfer or to step down (a
//! leader cannot start an election). If the chosen member cannot win (its own links cut),
//! that leader stays in place, refusing everything, until a higher term reaches it. So a
//! leader still in place [`STEP_DOWN_AFTER_TIMEOUTS`] quorum timeouts after its handover
//! votes, on itself, for its chosen successor in the next term: the vote makes it a
//! follower, and its own election timer then lets it campaign like any member.
//!
//! A leader cut off from its quorum stays `Leader` in openraft's eyes, and its metrics do not
//! change while nothing answers it; so the task samples them on every change and on a tick
//! (one ticker for the member, not one per follow: 10,000 idle follows wait on the watch, not
//! on 10,000 timers).

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver as _;
use openraft::raft::VoteRequest;

use super::{leads, RaftProposer};
use crate::state_machine::EngineStateMachine;
use crate::types::{NodeId, Raft, TypeConfig, Vote};

/// How many quorum timeouts a leader that handed its lead over stays in place before it steps
/// down: by then its followers had their election timeouts and the chosen successor its
/// campaign, so a leader still in place is one nobody else could replace.
const STEP_DOWN_AFTER_TIMEOUTS: u32 = 2;

/// Starts the task; the receiver says whether this member leads with a quorum now.
pub(super) fn watch_leading(
    raft: Raft<EngineStateMachine>,
    proposer: Arc<RaftProposer>,
) -> (
    tokio::sync::watch::Receiver<bool>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let tick = (proposer.quorum_timeout / 4).max(Duration::from_millis(10));
    let step_down_after = proposer.quorum_timeout * STEP_DOWN_AFTER_TIMEOUTS;
    let task = tokio::spawn(async move {
        let mut metrics = raft.metrics();
        // The term in which this leader handed its lead over and stopped its heartbeats, to
        // whom, and when.
        let mut silenced: Option<Handover> = None;
        loop {
            let (now, successor, leading, term) = {
                let m = metrics.borrow_watched();
                let now = proposer.leads_with_quorum(&m);
                let leading = leads(&m, proposer.id);
                // Still leader in openraft's eyes, but no quorum answered for its lease.
                let lost = !now && *tx.borrow() && leading;
                (
                    now,
                    lost.then(|| successor(&m, proposer.id)).flatten(),
                    leading,
                    m.current_term,
                )
            };
            let since = silenced.map(|h| (h.term, h.at.elapsed()));
            match after_silence(since, term, leading, now, step_down_after) {
                Silence::Keep => {}
                Silence::End => {
                    raft.runtime_config().heartbeat(true);
                    silenced = None;
                }
                Silence::StepDown => {
                    raft.runtime_config().heartbeat(true);
                    // `after_silence` steps down only a silenced leader.
                    if let Some(handover) = silenced.take() {
                        step_down(&raft, handover).await;
                    }
                }
            }
            if let Some(to) = successor {
                // A leader whose inbound links are cut still reaches its followers: its
                // heartbeats would keep their election timers from ever running out, so a
                // follower that did not hear the transfer could not replace it.
                raft.runtime_config().heartbeat(false);
                silenced = Some(Handover {
                    term,
                    to,
                    at: Instant::now(),
                });
                // Hand the lead over instead of waiting out the followers' leases: a leader
                // whose inbound links are cut still reaches them, and each one that hears
                // the transfer drops the lease at once (the chosen one elects at once, by
                // transfer, if its log is as long as this leader's). Without it a new leader
                // came only after this one's lease, the followers' and an election timeout,
                // 2.0-2.4 s with 400 ms elections.
                tracing::info!(
                    to,
                    "no quorum answered for the leader lease: handing the lead over"
                );
                if raft.trigger().transfer_leader(to).await.is_err() {
                    tx.send_replace(false);
                    return;
                }
            }
            tx.send_if_modified(|was| std::mem::replace(was, now) != now);
            if let Ok(Err(_)) = tokio::time::timeout(tick, metrics.changed()).await {
                // The Raft core ended: nothing leads here any more.
                tx.send_replace(false);
                return;
            }
        }
    });
    (rx, task)
}

/// What a member whose heartbeats may be silenced does with them now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Silence {
    /// Nothing to change: never silenced, or still waiting for another member to lead.
    Keep,
    /// Back on for good: a quorum answers, another member leads, or a newer term began.
    End,
    /// Still leading in the term it handed over in, long after the handover: nobody else
    /// could be elected, and openraft keeps a leader that asked for a transfer from serving
    /// in that term, so it steps down (and heartbeats come back for its next lead).
    StepDown,
}

/// A handover this leader asked for: in which term, to whom, when.
#[derive(Debug, Clone, Copy)]
struct Handover {
    term: u64,
    to: NodeId,
    at: Instant,
}

/// Makes this leader, whose handover nobody took, a follower: it grants, on itself, a vote
/// for its chosen successor in the next term (a vote it would grant that member anyway, as
/// a transfer's; a later request from that member is still checked against its log). Its
/// own election timer then runs as any follower's.
async fn step_down(raft: &Raft<EngineStateMachine>, handover: Handover) {
    let Ok(last_log_id) = raft.with_raft_state(|s| s.log_ids.last().cloned()).await else {
        return;
    };
    let mut vote = VoteRequest::new(Vote::new(handover.term + 1, handover.to), last_log_id);
    vote.leadership_transfer = true;
    tracing::info!(
        term = handover.term,
        to = handover.to,
        "nobody took the lead handed over: stepping down (openraft keeps a leader that asked \
         for a transfer from serving in its term)"
    );
    if let Err(e) = raft.vote(vote).await {
        tracing::warn!(error = %e, "stepping down failed");
    }
}

/// What a member that stopped its heartbeats when it handed its lead over in term `t`,
/// `elapsed` ago (`silenced`), does now.
///
/// The setting outlives the term, and only heartbeat answers renew openraft's quorum clock:
/// a member elected again in a later term before this task saw it step down stayed silent,
/// could never confirm its quorum, refused every call and let its followers' election timers
/// run out, term after term (a 300-fault history run's final phase: terms past 1,100). The
/// same held *within* the term: a handover the successor could not act on (its own links
/// cut, as the harness does to force another member's lead) left the leader in place for as
/// long as nobody else could win, refusing every call even where it reached a quorum.
fn after_silence(
    silenced: Option<(u64, Duration)>,
    term: u64,
    leading: bool,
    with_quorum: bool,
    step_down_after: Duration,
) -> Silence {
    match silenced {
        None => Silence::Keep,
        Some((t, _)) if with_quorum || !leading || term != t => Silence::End,
        Some((_, elapsed)) if elapsed >= step_down_after => Silence::StepDown,
        Some(_) => Silence::Keep,
    }
}

/// The voter other than `id` that acknowledged the most of the leader's log (the lowest id
/// among equals), to hand the lead to; `None` when `id` is the only voter.
fn successor(m: &openraft::RaftMetrics<TypeConfig>, id: NodeId) -> Option<NodeId> {
    let matched = |v: &NodeId| {
        m.replication
            .as_ref()
            .and_then(|r| r.get(v).cloned().flatten())
            .map(|l| l.index)
    };
    m.membership_config
        .voter_ids()
        .filter(|v| *v != id)
        .max_by(|a, b| matched(a).cmp(&matched(b)).then(b.cmp(a)))
}

#[cfg(test)]
mod tests {
    use super::{after_silence, Silence};
    use std::time::Duration;

    const PROBE: Duration = Duration::from_millis(1800);
    const SOON: Duration = Duration::from_millis(100);

    #[test]
    fn heartbeats_come_back_in_any_later_term_and_only_stay_off_in_the_silenced_one() {
        // Never silenced: nothing to turn back on.
        assert_eq!(after_silence(None, 7, true, false, PROBE), Silence::Keep);
        // Still leading in the term it handed over, still without a quorum, soon after:
        // stay silent (its heartbeats would keep the followers from electing anybody else).
        assert_eq!(
            after_silence(Some((5, SOON)), 5, true, false, PROBE),
            Silence::Keep
        );
        // A quorum answers again, or another member leads.
        assert_eq!(
            after_silence(Some((5, SOON)), 5, true, true, PROBE),
            Silence::End
        );
        assert_eq!(
            after_silence(Some((5, SOON)), 6, false, false, PROBE),
            Silence::End
        );
        // Elected again in a later term before the watch saw it step down: only heartbeats
        // renew the quorum clock, so without them it could never confirm its lead.
        assert_eq!(
            after_silence(Some((5, SOON)), 7, true, false, PROBE),
            Silence::End
        );
    }

    #[test]
    fn a_handover_nobody_took_ends_in_a_step_down() {
        // Still the leader of the same term long after handing over: nobody else could be
        // elected, so it steps down and campaigns like any member.
        assert_eq!(
            after_silence(Some((5, PROBE)), 5, true, false, PROBE),
            Silence::StepDown
        );
        assert_eq!(
            after_silence(Some((5, PROBE * 2)), 5, true, false, PROBE),
            Silence::StepDown
        );
        // Not before the followers and the successor had their chance.
        assert_eq!(
            after_silence(Some((5, PROBE - SOON)), 5, true, false, PROBE),
            Silence::Keep
        );
    }
}
