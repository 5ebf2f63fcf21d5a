//! How a replicated node's writer hands what it planned to consensus (issue 19 item 2, the
//! leader side of "apply after commit").
//!
//! The leader's writer plans requests exactly as a single node's does (same checks, same
//! precise errors), but instead of writing a group it encodes it as a [`Proposal`], merges
//! the batch's groups into as few entries as [`Proposer::entry_bytes_max`] allows, and hands
//! them to a [`Proposer`] (the replication crate's, over openraft). The proposer
//! reports, through the batch's [`Settle`], once every entry was applied by this node's state
//! machine, or refused there, or could not be committed. The engine answers the callers from
//! that: a planned answer is given only for an entry that was applied, which the apply rules
//! (`validate.rs`) accept only if the state it was planned against is the state it met.
//!
//! The writer does not wait for a batch to settle before it plans the next one: it plans it
//! against the state the batches in flight will leave and proposes it behind them (a few at
//! a time, see `writer/pipeline.rs`), so one Raft round overlaps the next batch's.

use crate::entry_log::Proposal;

/// The default most proposal bytes one entry of several groups holds: well under a call's
/// limit on the transport (`APPEND_BYTES_MAX`, 8 MiB, in the replication crate), so one
/// large entry does not hold back the ones behind it.
pub const ENTRY_BYTES_MAX: usize = 4 << 20;

/// Carries a leader's planned entries to the cluster. Implemented by the replication crate;
/// called from the engine's writer thread (a plain thread: blocking is expected).
pub trait Proposer: Send + Sync + std::fmt::Debug {
    /// Called before each batch is planned. `Ok` with the term this node leads in, once it
    /// is the leader and has applied every entry committed before its own term's first entry
    /// (so the state it plans against is the cluster's latest); otherwise the outcome every
    /// request of the batch gets ([`Proposed::NotLeader`] with a hint, usually).
    ///
    /// The writer plans batches against the ones still in flight only while the term stays
    /// the same: a node leads at most once per term, so a new term means the batches before
    /// it may have been replaced, and the writer waits for them to settle first.
    ///
    /// # Errors
    /// How to answer the batch when this node cannot plan it.
    fn prepare(&self) -> Result<u64, Proposed>;

    /// Whether this node leads now, as far as it knows (cheap: no round trip). Only the
    /// leader decides lease and idle expiries; a stale `true` is harmless, since what it
    /// proposes is refused by consensus or by the apply rules.
    fn leads(&self) -> bool;

    /// The most proposal bytes the writer merges into one entry: a batch's consecutive
    /// groups share an entry while it stays under this; a group larger than it is an entry
    /// of its own.
    fn entry_bytes_max(&self) -> usize {
        ENTRY_BYTES_MAX
    }

    /// Proposes `entries` (each the records of one or more consecutive planned groups; all
    /// of an entry's apply or none do), in this order, as consecutive log entries following those of
    /// every batch proposed before (the writer planned them against those), and reports one
    /// outcome per entry, in the same order, through `settle` once each is settled.
    ///
    /// It should return once the entries are queued for the log, not wait for them to
    /// apply (it may: a blocking proposer just disables pipelining). `entries` may be empty
    /// (a batch whose answers need no entry: errors, an existing session's `OpenSession`, an
    /// empty dequeue): its answers are still claims about the cluster's state, so the
    /// proposer confirms this node's leadership with a round started after this call
    /// (ReadIndex) and settles with no outcome when it holds, or with one outcome saying why
    /// not ([`Proposed::NotLeader`], [`Proposed::Unknown`]).
    fn propose(&self, entries: Vec<Proposal>, settle: Settle);
}

/// How one proposed entry settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proposed {
    /// Committed and applied: the planned answer stands.
    Applied,
    /// Committed, but the apply rules refused it (the state it was planned against changed:
    /// a leader change, an entry landing at another LSN than predicted). It changed nothing.
    Refused(String),
    /// This node is not the leader (any more): `leader` is the one it knows of, if any.
    NotLeader {
        /// The leader's client address (`host:port`), if known.
        leader: Option<String>,
    },
    /// The outcome is unknown (the node lost leadership or stopped while the entry was in
    /// flight): it may still commit. Retry idempotently.
    Unknown(String),
}

/// Where a proposer reports how a batch's entries settled (see [`Proposer::propose`]).
/// Dropped without a report (a proposer that gave up on the batch, a runtime shutting
/// down), it reports every entry as [`Proposed::Unknown`], so no caller waits forever.
pub struct Settle {
    report: Option<Box<dyn FnOnce(Vec<Proposed>) + Send>>,
}

impl Settle {
    /// A report going to `report` (the writer's pipeline).
    pub(crate) fn new(report: impl FnOnce(Vec<Proposed>) + Send + 'static) -> Self {
        Self {
            report: Some(Box::new(report)),
        }
    }

    /// Reports the outcomes of the batch's entries, one per entry in order (fewer: the
    /// rest are unknown).
    pub fn settle(mut self, outcomes: Vec<Proposed>) {
        if let Some(report) = self.report.take() {
            report(outcomes);
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(report) = self.report.take() {
            report(Vec::new());
        }
    }
}

impl std::fmt::Debug for Settle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settle")
            .field("reported", &self.report.is_none())
            .finish()
    }
}
