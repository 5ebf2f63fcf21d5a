//! The leader side of a replicated node's writer: a batch is planned exactly as a single
//! node plans it, then proposed as one entry per planned group instead of written, and each
//! caller is answered from how its entries settled (see `crate::propose`).

use std::ops::Range;
use std::sync::atomic::Ordering;

use super::{Acks, Effect, Sink, Writer, KEPT_BUFFER_BYTES_MAX};
use crate::error::Error;
use crate::index::Txn;
use crate::mailbox::{Command, Request};
use crate::propose::Proposed;

/// A request planned into this batch: its answer if its entries apply, and which of the
/// batch's groups, effects and leases are its.
struct Planned {
    reply: crate::mailbox::ReplyTo,
    answer: crate::mailbox::Reply,
    groups: Range<usize>,
    effects: Range<usize>,
    leased: Range<usize>,
}

impl Writer {
    /// Plans `batch`, proposes its groups and answers each request once its entries settled.
    pub(super) fn propose(&mut self, batch: Vec<Request>) {
        // A sync has nothing to wait for: an entry is durable before it is applied. It needs
        // no leadership either (a follower's engine closes with one).
        let (syncs, batch): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .partition(|r| matches!(r.cmd, Command::Sync));
        for r in syncs {
            r.reply.send(Ok(crate::mailbox::Reply::Done));
        }
        if batch.is_empty() {
            return;
        }
        let Sink::Proposals(proposals) = &mut self.log else {
            return self.fail_all(batch, || {
                Error::Internal("a single node's writer asked to propose".into())
            });
        };
        proposals.start_batch();
        if let Err(outcome) = proposals.proposer.prepare() {
            return self.fail_all(batch, || error_of(&outcome));
        }
        let index = self.shared.index.clone();
        // No cache of decoded streams between batches: the index changes under the writer
        // (apply runs on openraft's state machine), so the overlay starts from it each time.
        let mut txn = Txn::new(&index);
        let mut buf = self.start_group();
        let mut planned: Vec<Planned> = Vec::with_capacity(batch.len());
        for Request { cmd, reply, .. } in batch {
            if matches!(
                cmd,
                Command::Retire { .. } | Command::CarryForward { .. } | Command::Forget { .. }
            ) {
                reply.send(Err(Error::NotConfirmed(
                    "retention does not run on a replicated node yet".into(),
                )));
                continue;
            }
            let groups = self.group_count();
            let (effects, leased) = (self.effects.len(), self.leased.len());
            let answer = self.plan(cmd, &mut txn, &mut buf);
            if self.overlay_broken || matches!(answer, Err(Error::Index(_))) {
                // The overlay may be half-applied: nothing of the batch is proposed.
                self.overlay_broken = false;
                self.log.rewind(self.log.next());
                self.disarm_group_leases();
                let e = match answer {
                    Err(e) => e,
                    Ok(_) => Error::Internal("a request half-applied to the index".into()),
                };
                self.poison(&e);
                reply.send(Err(e));
                for p in planned {
                    p.reply.send(Err(Error::Poisoned));
                }
                return;
            }
            match answer {
                Ok(answer) => planned.push(Planned {
                    reply,
                    answer,
                    groups: groups..self.group_count(),
                    effects: effects..self.effects.len(),
                    leased: leased..self.leased.len(),
                }),
                Err(e) => reply.send(Err(e)),
            }
        }
        drop(txn);
        if buf.capacity() <= KEPT_BUFFER_BYTES_MAX {
            self.buf = buf;
        }
        let (entries, proposer) = match &mut self.log {
            Sink::Proposals(p) => (p.take(), std::sync::Arc::clone(&p.proposer)),
            Sink::Segments(_) => return,
        };
        let outcomes = if entries.is_empty() {
            Vec::new()
        } else {
            proposer.propose(entries)
        };
        self.settle(planned, &outcomes);
    }

    /// Answers the planned requests from their entries' outcomes; publishes the effects of
    /// those that applied and ends the leases of streams whose opening did not.
    fn settle(&mut self, planned: Vec<Planned>, outcomes: &[Proposed]) {
        let mut effects = std::mem::take(&mut self.effects)
            .into_iter()
            .map(Some)
            .collect::<Vec<Option<Effect>>>();
        let leased = std::mem::take(&mut self.leased);
        let mut acks: Acks = Vec::with_capacity(planned.len());
        let mut kept = Vec::new();
        // A request was planned against the state the batch's earlier groups leave (a retry
        // answered as a duplicate of an append planned just before it has no group of its
        // own): it stands only if every group up to its own applied, not just its own.
        let first_failed = (0..outcomes.len().max(self_groups(&planned)))
            .map(|g| (g, outcomes.get(g).cloned().unwrap_or(MISSING)))
            .find(|(_, o)| !matches!(o, Proposed::Applied));
        for p in planned {
            let failed = first_failed
                .as_ref()
                .filter(|(g, _)| *g < p.groups.end)
                .map(|(_, o)| o.clone());
            match failed {
                None => {
                    kept.extend(effects[p.effects].iter_mut().filter_map(Option::take));
                    acks.push((p.reply, p.answer));
                }
                Some(outcome) => {
                    for stream in &leased[p.leased] {
                        self.shared.leases.remove(*stream);
                    }
                    p.reply.send(Err(error_of(&outcome)));
                }
            }
        }
        self.effects = kept;
        // Followers were woken by apply; the effects outside the index are the leader's.
        self.touched.clear();
        self.after_commit();
        self.shared
            .counters
            .commit_batches
            .fetch_add(1, Ordering::Relaxed);
        self.acknowledge(acks);
    }

    /// The groups planned so far in this batch.
    fn group_count(&self) -> usize {
        match &self.log {
            Sink::Proposals(p) => p.len(),
            Sink::Segments(_) => 0,
        }
    }
}

/// How many groups the planned requests hold in all.
fn self_groups(planned: &[Planned]) -> usize {
    planned.iter().map(|p| p.groups.end).max().unwrap_or(0)
}

/// The outcome of an entry the proposer did not report (a bug guard: it reports one each).
const MISSING: Proposed = Proposed::Unknown(String::new());

/// The caller's error for an entry that did not apply.
fn error_of(outcome: &Proposed) -> Error {
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
