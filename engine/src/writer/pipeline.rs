//! A leader's batches in flight: proposed, not settled yet (issue 19 item 8, throughput).
//!
//! The writer plans batch *n+1* against the state the batches in flight will leave (one
//! overlay for the whole *window* of batches planned that way, see `propose.rs`) and
//! proposes it without waiting for *n* to apply. Callers are still answered only once their
//! entries applied, and in the order the batches were proposed: a proposer may report
//! batch *n+1* first (its own task finished first), but it waits here until *n* settled.
//!
//! The rule that keeps a stale plan from being acknowledged is the one a single batch
//! always had, extended across the window: a request stands only if every group planned up
//! to its own (in its batch and in every batch of the window before it) applied. A batch's
//! groups are merged into entries (`sink.rs`): a group applied if its entry did, so the
//! first group that did not apply is the first group of the first entry that did not. A request
//! planned against an earlier request's group (a retry answered as a duplicate of an append
//! in flight, a session it found created) may have no group of its own, so its own outcome
//! says nothing; the first group of the window that did not apply fails every request
//! planned after it. Such a window is not planned on again: the writer waits until its
//! batches settled and starts the next window from the index.
//!
//! Every answer is held this way, errors included (a stale epoch, a seq conflict, an unknown
//! stream, a terminated stream or task, a full queue) and answers that wrote nothing (an
//! existing session's `OpenSession`, an empty dequeue, `routed: false`): each is a claim
//! about the state it was planned against, so it is false if a batch before it did not
//! apply, or if this member was no longer the leader when it planned (issue 30 item 1,
//! review R3/R4). Hence the second rule: a batch's answers go out only once leadership was
//! confirmed *after* the batch was planned: one of its entries committed in this term, or,
//! for a batch with no entry, a ReadIndex round the proposer started after planning it
//! (`Proposer::propose` with no entries). Otherwise every answer of the batch is the
//! retryable error of how the confirmation failed (`NotLeader` with the leader's address,
//! or `NotConfirmed`).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::{Acks, Effect};
use crate::error::Error;
use crate::mailbox::{Reply, ReplyTo};
use crate::propose::{Proposed, Settle};
use crate::shared::Shared;

/// Most batches in flight at once. A Raft round has three stages that can overlap: the
/// leader's append (`fdatasync`), the followers' append (network and `fdatasync`), and the
/// commit with its apply. One batch in each stage keeps them all busy; more only split the
/// producers into smaller batches (each paying its own `fdatasync`s) and hold more
/// requests behind a failure.
pub(super) const IN_FLIGHT_MAX: usize = 3;

/// A request planned into a batch: its answer (a reply or a planned error) if the window's
/// groups up to its own apply, and which of the window's groups, and of its batch's effects
/// and leases, are its.
#[derive(Debug)]
pub(super) struct Planned {
    pub(super) reply: ReplyTo,
    pub(super) answer: Result<Reply, Error>,
    /// The window's groups planned up to and including this request's own (numbered from
    /// the window's first): `groups.end` is what it depends on.
    pub(super) groups: Range<usize>,
    pub(super) effects: Range<usize>,
    pub(super) leased: Range<usize>,
}

/// A proposed batch, until it settles.
#[derive(Debug)]
pub(super) struct Batch {
    pub(super) planned: Vec<Planned>,
    /// The window's groups each of this batch's entries holds, one range per entry, in
    /// order.
    pub(super) entries: Vec<Range<usize>>,
    /// What its requests change outside the index, published for those that stand.
    pub(super) effects: Vec<Effect>,
    /// Streams whose lease its requests armed (ended for those that do not stand).
    pub(super) leased: Vec<u64>,
    /// Where the answers go.
    pub(super) answers: Answers,
}

/// Where a settled batch's answers go (the writer's acknowledging thread), usable from
/// whichever thread the proposer reports on.
#[derive(Debug)]
pub(super) struct Answers {
    pub(super) shared: Arc<Shared>,
    pub(super) acker: Option<Sender<Acks>>,
    pub(super) in_flight: Arc<AtomicUsize>,
}

impl Answers {
    /// Delivers answers of requests whose entries applied (as `Writer::acknowledge`).
    fn acknowledge(&self, acks: Acks) {
        let acks = match &self.acker {
            Some(acker) => {
                let n = acks.len();
                self.in_flight.fetch_add(n, Ordering::AcqRel);
                match acker.send(acks) {
                    Ok(()) => return,
                    Err(std::sync::mpsc::SendError(acks)) => {
                        self.in_flight.fetch_sub(n, Ordering::AcqRel);
                        acks
                    }
                }
            }
            None => acks,
        };
        for (to, reply) in acks {
            to.send(Ok(reply));
        }
    }

    /// Publishes what the requests that stand changed outside the index (as
    /// `Writer::after_commit`; followers were woken by apply).
    fn publish(&self, effects: Vec<Effect>) {
        let shared = &self.shared;
        let now = shared.now_ms();
        for effect in effects {
            match effect {
                Effect::SessionLive(s) => shared.activity.insert(&s, now),
                Effect::SessionGone(s) => shared.activity.remove(&s),
                Effect::StreamEnded(id) => shared.leases.remove(id),
                Effect::ExpiredIdle => {
                    shared
                        .counters
                        .sessions_expired_idle
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The batches in flight, shared by the writer (which adds them and waits for room) and
/// the proposer's reports (which settle them).
#[derive(Debug, Default)]
pub(crate) struct Pipeline {
    flight: Mutex<Flight>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Flight {
    /// Proposed batches, oldest first, with their outcomes once reported.
    batches: VecDeque<(u64, Batch, Option<Vec<Proposed>>)>,
    next_id: u64,
    /// The first group of the window that did not apply, and how it settled.
    failed: Option<(usize, Proposed)>,
}

impl Pipeline {
    fn lock(&self) -> MutexGuard<'_, Flight> {
        self.flight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a batch about to be proposed; its report goes to the returned [`Settle`].
    pub(super) fn push(self: &Arc<Self>, batch: Batch) -> Settle {
        let id = {
            let mut flight = self.lock();
            let id = flight.next_id;
            flight.next_id += 1;
            flight.batches.push_back((id, batch, None));
            id
        };
        let pipeline = Arc::clone(self);
        Settle::new(move |outcomes| pipeline.report(id, outcomes))
    }

    /// Batch `id`'s outcomes: settles it and every batch after it already reported, in
    /// the order they were proposed.
    fn report(&self, id: u64, outcomes: Vec<Proposed>) {
        let mut flight = self.lock();
        if let Some(slot) = flight.batches.iter_mut().find(|(i, ..)| *i == id) {
            slot.2 = Some(outcomes);
        }
        while flight.batches.front().is_some_and(|(.., o)| o.is_some()) {
            let Some((_, batch, outcomes)) = flight.batches.pop_front() else {
                break;
            };
            settle(&mut flight.failed, batch, &outcomes.unwrap_or_default());
        }
        drop(flight);
        self.changed.notify_all();
    }

    /// How many batches are in flight.
    pub(super) fn len(&self) -> usize {
        self.lock().batches.len()
    }

    /// Whether a group of the current window did not apply.
    pub(super) fn window_failed(&self) -> bool {
        self.lock().failed.is_some()
    }

    /// Waits until fewer than `n` batches are in flight.
    pub(super) fn wait_below(&self, n: usize) {
        let mut flight = self.lock();
        while flight.batches.len() >= n {
            flight = self
                .changed
                .wait(flight)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits until every batch settled, and starts a new window: its groups depend on
    /// nothing before (they are planned against the index).
    pub(super) fn start_window(&self) {
        self.wait_below(1);
        self.lock().failed = None;
    }
}

/// The outcome of an entry the proposer did not report (a bug guard: it reports one each).
const MISSING: Proposed = Proposed::Unknown(String::new());

/// Answers a settled batch's requests: a request stands only if every group of the window
/// up to its own applied and the batch confirmed this member's leadership after it was
/// planned (see the module's doc); publishes the effects of those that stand and ends the
/// leases of streams whose opening did not.
fn settle(failed: &mut Option<(usize, Proposed)>, batch: Batch, outcomes: &[Proposed]) {
    if failed.is_none() {
        *failed = batch
            .entries
            .iter()
            .zip(outcomes.iter().chain(std::iter::repeat(&MISSING)))
            .find(|(_, o)| !matches!(o, Proposed::Applied))
            .map(|(groups, o)| (groups.start, o.clone()));
    }
    let confirmed = confirmation(batch.entries.is_empty(), outcomes);
    let Batch {
        planned,
        effects,
        leased,
        answers,
        ..
    } = batch;
    let mut effects: Vec<Option<Effect>> = effects.into_iter().map(Some).collect();
    let mut acks: Acks = Vec::with_capacity(planned.len());
    let mut kept = Vec::new();
    for p in planned {
        let refused = failed
            .as_ref()
            .filter(|(g, _)| *g < p.groups.end)
            .map(|(_, outcome)| outcome)
            .or(confirmed.as_ref().err());
        match refused {
            None => {
                kept.extend(effects[p.effects].iter_mut().filter_map(Option::take));
                match p.answer {
                    Ok(answer) => acks.push((p.reply, answer)),
                    Err(e) => p.reply.send(Err(e)),
                }
            }
            Some(outcome) => {
                for stream in &leased[p.leased] {
                    answers.shared.leases.remove(*stream);
                }
                p.reply.send(Err(error_of(outcome)));
            }
        }
    }
    answers.publish(kept);
    answers
        .shared
        .counters
        .commit_batches
        .fetch_add(1, Ordering::Relaxed);
    answers.acknowledge(acks);
}

/// Whether a batch confirmed this member's leadership after it was planned: `Ok` if one of
/// its entries committed (applied, or refused by the apply rules: either way a quorum took
/// an entry of this term proposed after the plan), or, for a batch with no entry, if the
/// proposer's ReadIndex round succeeded (reported as no outcome, or `Applied`); otherwise
/// the outcome that says why not.
fn confirmation(no_entries: bool, outcomes: &[Proposed]) -> Result<(), Proposed> {
    let committed = |o: &Proposed| matches!(o, Proposed::Applied | Proposed::Refused(_));
    if no_entries {
        return match outcomes.first() {
            None | Some(Proposed::Applied) => Ok(()),
            Some(other) => Err(other.clone()),
        };
    }
    if outcomes.iter().any(committed) {
        return Ok(());
    }
    Err(outcomes.first().cloned().unwrap_or(MISSING))
}

/// The caller's error for an entry that did not apply.
pub(super) fn error_of(outcome: &Proposed) -> Error {
    match outcome {
        Proposed::Applied => Error::Internal("an applied entry reported as failed".into()),
        Proposed::Refused(why) => Error::NotConfirmed(format!("the entry was refused: {why}")),
        Proposed::NotLeader { leader } => Error::NotLeader {
            leader: leader.clone(),
        },
        Proposed::Unknown(why) if why.is_empty() => {
            Error::NotConfirmed("the cluster did not report the entry's outcome".into())
        }
        Proposed::Unknown(why) => Error::NotConfirmed(why.clone()),
    }
}
