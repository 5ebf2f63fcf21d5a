//! The Raft type configuration of cursorlog: what a node id, a node, a log id, an entry's
//! payload and an apply result are.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A node's id in the cluster (stable across restarts, chosen by the operator).
pub type NodeId = u64;

/// A node as the membership config records it: where its Raft service listens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftNode {
    /// The node's gRPC address, `host:port` (no scheme: the client adds `http://` or
    /// `https://` according to its TLS setting).
    pub addr: String,
}

impl RaftNode {
    /// A node listening on `addr` (`host:port`).
    pub fn new(addr: impl Into<String>) -> Self {
        Self { addr: addr.into() }
    }
}

impl fmt::Display for RaftNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.addr)
    }
}

/// The application data of one Raft entry: the encoded records of one atomic group, as the
/// engine writes them. This crate treats them as opaque bytes; their content (and their
/// validation in `apply`) belongs to the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// The encoded records (one byte string on the wire, not a sequence of bytes: issue 31,
    /// the review's leader CPU per event; wire-compatible with the sequence postcard wrote).
    /// Shared, not copied, between the writer that built them, openraft, the log's tail
    /// and each follower's message.
    #[serde(with = "shared_bytes")]
    pub records: Bytes,
}

impl Proposal {
    /// A proposal of `records` (a `Vec` or [`Bytes`], taken without a copy).
    pub fn new(records: impl Into<Bytes>) -> Self {
        Self {
            records: records.into(),
        }
    }
}

/// [`Bytes`] as one serde byte string (what `serde_bytes` does for a `Vec<u8>`).
mod shared_bytes {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(b)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        serde_bytes::ByteBuf::deserialize(d).map(|b| Bytes::from(b.into_vec()))
    }
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Proposal({} bytes)", self.records.len())
    }
}

/// What applying one entry answered its proposer: applied, or refused by the engine's apply
/// rules (an entry of a deposed leader's term that committed beside the new leader's, or
/// one that landed at another LSN than its leader planned). A refused entry changed nothing,
/// on every replica alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResult {
    /// Why the apply rules refused the entry; `None` when it applied.
    pub refused: Option<String>,
}

openraft::declare_raft_types!(
    /// cursorlog's [`openraft::RaftTypeConfig`]. The log id is `(term, index)`
    /// (`leader_id_std`: one leader per term, so the committed leader id is the term alone),
    /// entries are openraft's default [`openraft::Entry`] carrying a [`Proposal`], and the
    /// runtime is tokio.
    pub TypeConfig:
        D = Proposal,
        R = ApplyResult,
        NodeId = NodeId,
        Node = RaftNode,
        Term = u64,
        LeaderId = openraft::impls::leader_id_std::LeaderId<u64, NodeId>,
);

/// A Raft node handle over state machine `SM`.
pub type Raft<SM> = openraft::Raft<TypeConfig, SM>;

/// A log entry of cursorlog's Raft log.
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;

/// A log id, `(term, index)`.
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;

/// A vote (term, candidate, committed).
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;

/// The timing of a cluster: how often a leader proves itself and how long followers wait
/// before they elect a new one. The server sets these from its flags; the defaults suit a
/// loaded 2-core machine (three nodes, tests and CPU hogs sharing it), not a fast network.
///
/// Failover takes about `election_timeout_max + rand(min, max)`, not one election timeout: a
/// voter refuses to vote while the leader lease it last saw (= `election_timeout_max`) has
/// not expired, with or without pre-vote (measured in
/// `shared/research/raft-experiment.md`: 3.2–3.8 s with these defaults, ~0.5 s with
/// openraft's 150–300 ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTiming {
    /// How often the leader sends heartbeats (and openraft's deadline for one
    /// AppendEntries). Default 100 ms.
    pub heartbeat: Duration,
    /// The shortest election timeout. Default 1000 ms.
    pub election_min: Duration,
    /// The longest election timeout (also the leader lease). Default 2000 ms.
    pub election_max: Duration,
    /// The deadline for sending and installing one whole snapshot. Default 60 s (openraft's
    /// 200 ms is for in-memory snapshots; ours are files).
    pub install_snapshot: Duration,
}

impl Default for ClusterTiming {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(100),
            election_min: Duration::from_millis(1000),
            election_max: Duration::from_millis(2000),
            install_snapshot: Duration::from_secs(60),
        }
    }
}

impl ClusterTiming {
    /// openraft's [`openraft::Config`] for this timing, validated.
    ///
    /// Besides the timeouts it sets:
    /// - `enable_pre_vote`: a node that was cut off asks before it bumps its term, so it does
    ///   not depose a healthy leader when it comes back (the network forwards `pre_vote`; the
    ///   trait's default would grant it without asking).
    /// - `allow_log_reversion`: a member whose log went back (its directory was wiped, or its
    ///   disk lost entries) is sent the log again from where it now ends. Without it the
    ///   leader stops replicating to that member for good (a debug build's leader panics:
    ///   measured by the catch-up benchmark). The member's lost *vote* is the hazard that
    ///   remains (it could vote twice in a term): README says to remove a member before
    ///   wiping it and add it back after.
    /// - `enable_leader_restore: false`: a leader that restarts campaigns in a new term
    ///   instead of resuming its old one. The log store reports an append flushed after a
    ///   later sync (`log_sync.rs`), so a leader's entries reach followers before its own
    ///   disk has them; a power loss can take them from the leader only. Resuming the same
    ///   term, it would then issue those log ids again with other payloads, and followers
    ///   holding the first ones would diverge (the cluster simulation found it: two members
    ///   held different events at the same log id). In a new term the lost suffix is an
    ///   ordinary uncommitted one, kept or cut by Raft.
    /// - `quorum_loss_probe_interval`: a leader that has heard from no quorum for its lease
    ///   (`election_max`) stops its heartbeats for `2 × election_max`, then probes as long
    ///   again, and so on. A leader whose inbound links are cut still reaches its followers:
    ///   without the pause its heartbeats keep them from ever electing another, while it can
    ///   commit nothing and answers nothing (its check-quorum, `node.rs`), so the cluster
    ///   stayed unavailable until the cut healed (issue 30, the `isolate-in` nemesis). The
    ///   interval is openraft's minimum, its lease plus one longest election timeout.
    /// - `SnapshotPolicy::Never`: openraft never builds a snapshot on its own. In cursorlog a
    ///   snapshot is the retained sealed segments, and the log is purged only by retention,
    ///   which builds the snapshot that covers what it deletes; an automatic snapshot every
    ///   N entries would copy state the segments already hold.
    ///
    /// # Errors
    /// [`openraft::ConfigError`] when the timing is inconsistent (e.g. `election_min` not above
    /// `heartbeat`, or `election_max` not above `election_min`).
    pub fn config(&self, cluster_name: &str) -> Result<openraft::Config, openraft::ConfigError> {
        openraft::Config {
            cluster_name: cluster_name.to_owned(),
            heartbeat_interval: millis(self.heartbeat),
            election_timeout_min: millis(self.election_min),
            election_timeout_max: millis(self.election_max),
            install_snapshot_timeout: millis(self.install_snapshot),
            enable_pre_vote: Some(true),
            allow_log_reversion: Some(true),
            enable_leader_restore: Some(false),
            snapshot_policy: openraft::SnapshotPolicy::Never,
            quorum_loss_probe_interval: Some(millis(self.election_max).saturating_mul(2)),
            ..Default::default()
        }
        .validate()
    }
}

/// Whole milliseconds, saturating (a timeout beyond u64 milliseconds is "never").
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_timing_validates_with_pre_vote_no_leader_restore_and_no_automatic_snapshots() {
        let config = ClusterTiming::default().config("t").unwrap();
        assert_eq!(config.heartbeat_interval, 100);
        assert_eq!(
            (config.election_timeout_min, config.election_timeout_max),
            (1000, 2000)
        );
        assert_eq!(config.enable_pre_vote, Some(true));
        // A leader cut off inbound goes quiet, so its followers can elect another.
        assert_eq!(config.quorum_loss_probe_interval, Some(4000));
        // A restarted leader must not resume its term: its appends reach followers before
        // its own disk (cluster_sim seeds 2 and 5 at 30 rounds diverge with it on).
        assert_eq!(config.enable_leader_restore, Some(false));
        assert!(matches!(
            config.snapshot_policy,
            openraft::SnapshotPolicy::Never
        ));
    }

    #[test]
    fn an_election_timeout_below_the_heartbeat_is_refused() {
        let timing = ClusterTiming {
            election_min: Duration::from_millis(50),
            election_max: Duration::from_millis(80),
            ..ClusterTiming::default()
        };
        assert!(timing.config("t").is_err());
    }
}
