//! How a replicated node's writer hands what it planned to consensus (issue 19 item 2, the
//! leader side of "apply after commit").
//!
//! The leader's writer plans requests exactly as a single node's does (same checks, same
//! precise errors), but instead of writing a group it encodes it as a [`Proposal`] and hands
//! the batch to a [`Proposer`] (the replication crate's, over openraft). The proposer returns
//! once every entry was applied by this node's state machine, or refused there, or could not
//! be committed. The engine answers the callers from that: a planned answer is given only for
//! an entry that was applied, which the apply rules (`validate.rs`) accept only if the state
//! it was planned against is the state it met.

use crate::entry_log::Proposal;

/// Carries a leader's planned entries to the cluster. Implemented by the replication crate;
/// called from the engine's writer thread (a plain thread: blocking is expected).
pub trait Proposer: Send + Sync + std::fmt::Debug {
    /// Called before each batch is planned. `Ok` once this node is the leader and has
    /// applied every entry committed before its own term's first entry (so the state it
    /// plans against is the cluster's latest); otherwise the outcome every request of the
    /// batch gets ([`Proposed::NotLeader`] with a hint, usually).
    ///
    /// # Errors
    /// How to answer the batch when this node cannot plan it.
    fn prepare(&self) -> Result<(), Proposed>;

    /// Whether this node leads now, as far as it knows (cheap: no round trip). Only the
    /// leader decides lease and idle expiries; a stale `true` is harmless, since what it
    /// proposes is refused by consensus or by the apply rules.
    fn leads(&self) -> bool;

    /// Proposes `entries`, in this order, as consecutive log entries, and returns once each
    /// is settled, with one outcome per entry in the same order.
    fn propose(&self, entries: Vec<Proposal>) -> Vec<Proposed>;
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
