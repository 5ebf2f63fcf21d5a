//! `cursorlog cluster force-new`: the way out of a lost quorum (two of three members lost
//! their data), in the spirit of etcd's `--force-new-cluster` (issue 30 item 4, review R2).
//!
//! Raft cannot elect a leader without a quorum, and cursorlog's members that lost their data
//! refuse to vote (`crate::amnesia`) rather than help elect a member that may lack what
//! they acknowledged. When the quorum is gone for good, the operator picks the surviving
//! member with the longest log, stops it and runs this on its data directory. It:
//!
//! 1. reads the log, the vote and the last committed entry this member knows;
//! 2. appends a membership entry naming this member as the only voter (in a term above
//!    every term it holds or voted in) and saves a vote for itself in that term: at its next
//!    start openraft reads the membership from the log, finds itself the only voter and
//!    elects itself, and its first entry commits everything the log holds;
//! 3. removes the `AMNESIAC` mark (it is the cluster now);
//! 4. reports what cannot be vouched for: the entries after the last commit this member
//!    knew of, which it holds but no quorum ever confirmed to it (they may or may not have
//!    been acknowledged to clients; they become committed now), and that anything the lost
//!    members alone held is gone.
//!
//! The cluster keeps its identity (`CLUSTER`): the other members, started on empty
//! directories, adopt it when they are added back (`cluster add-learner`, `promote`).
//!
//! Nothing here runs in a serving process: the directory lock refuses a running member.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use cursorlog_engine::{EntryId, EntryLog, EntryLogConfig, EntryPayload, LogEntry};
use openraft::vote::RaftLeaderId as _;

use crate::codec;
use crate::types::{NodeId, RaftNode, Vote};

/// How many entries are read at a time while looking for the last membership.
const SCAN_WINDOW: u64 = 1024;

/// What `force-new` did, and what it cannot vouch for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceNewReport {
    /// This member.
    pub node: NodeId,
    /// Its address in the new membership.
    pub addr: String,
    /// The voters before (from the last membership entry found, if any).
    pub previous_voters: Vec<NodeId>,
    /// The last committed Raft index this member knew of (`None`: none).
    pub committed: Option<u64>,
    /// The last Raft index it held before the new entry.
    pub last: u64,
    /// The entries after `committed`: Raft index, term, kind.
    pub unvouched: Vec<(u64, u64, &'static str)>,
    /// The new membership entry: its Raft index and term.
    pub entry: (u64, u64),
}

impl fmt::Display for ForceNewReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let committed = self
            .committed
            .map_or_else(|| "none".to_owned(), |c| c.to_string());
        writeln!(
            f,
            "member {} ({}) is now the only voter of its cluster (voters before: {:?}); \
             membership entry written at Raft index {} in term {}",
            self.node, self.addr, self.previous_voters, self.entry.0, self.entry.1
        )?;
        writeln!(
            f,
            "last committed Raft index this member knew of: {committed}; its log ends at {}",
            self.last
        )?;
        if self.unvouched.is_empty() {
            writeln!(
                f,
                "cannot be vouched for: none (every entry it holds was known committed)"
            )?;
        } else {
            let (first, last) = (self.unvouched[0].0, self.last);
            writeln!(
                f,
                "cannot be vouched for: Raft indexes {first}..={last} ({} entries), held by \
                 this member but never confirmed to it as committed (they may or may not have \
                 been acknowledged; they are committed now):",
                self.unvouched.len()
            )?;
            for (index, term, kind) in &self.unvouched {
                writeln!(f, "  index {index} term {term} {kind}")?;
            }
        }
        writeln!(
            f,
            "anything acknowledged that only the lost members held is gone. Start this member \
             with its usual flags, then for each other member (started on an empty \
             directory): `cursorlog cluster add-learner --members {addr} --id N --addr \
             HOST:PORT` and `cursorlog cluster promote --members {addr} --id N`",
            addr = self.addr
        )
    }
}

/// The Raft index of the engine's entry `id` (the engine counts from 1, Raft from 0).
fn raft_index(id: EntryId) -> u64 {
    id.index - 1
}

fn kind(payload: &EntryPayload) -> &'static str {
    match payload {
        EntryPayload::Blank => "blank (a leader's first entry)",
        EntryPayload::Membership(_) => "membership change",
        EntryPayload::Records(_) => "records (client writes)",
    }
}

type Membership = openraft::Membership<NodeId, RaftNode>;

/// The last membership entry among the entries `log` holds, if any.
fn last_membership(log: &EntryLog, first: u64, last: u64) -> Result<Option<Membership>, String> {
    let mut hi = last;
    while hi >= first {
        let lo = hi.saturating_sub(SCAN_WINDOW - 1).max(first);
        let entries = log.read(lo, hi + 1).map_err(|e| e.to_string())?;
        for entry in entries.iter().rev() {
            if let EntryPayload::Membership(bytes) = &entry.payload {
                return codec::decode("membership", bytes)
                    .map(Some)
                    .map_err(|e| e.to_string());
            }
        }
        if lo == first {
            break;
        }
        hi = lo - 1;
    }
    Ok(None)
}

/// Makes the member `node` whose (stopped) data directory is `dir` the only voter of its
/// cluster; `addr` is its address, read from its last membership when `None`.
///
/// # Errors
/// The directory is in use or unreadable, is not a cluster member's, holds no entry, or
/// the address is unknown.
pub fn force_new_cluster(
    dir: &Path,
    node: NodeId,
    addr: Option<String>,
) -> Result<ForceNewReport, String> {
    let log = EntryLog::open(EntryLogConfig {
        dir: dir.to_path_buf(),
        segment_bytes_max: 64 * 1024 * 1024,
    })
    .map_err(|e| format!("opening {}: {e}", dir.display()))?;
    let vote: Vote = match log.read_vote().map_err(|e| e.to_string())? {
        Some(bytes) => codec::decode("vote", &bytes).map_err(|e| e.to_string())?,
        None => {
            return Err(format!(
                "{} holds no VOTE: it is not a cluster member's directory (or it never took \
                 part in one); run force-new on the member with the longest log",
                dir.display()
            ))
        }
    };
    let state = log.state();
    let Some(last) = state.last else {
        return Err(format!(
            "{} holds no log entries: nothing to recover from; run force-new on the member \
             with the longest log",
            dir.display()
        ));
    };
    let first = state.last_purged.map_or(1, |p| p.index + 1);
    let previous = last_membership(&log, first, last.index)?;
    let addr = match (addr, &previous) {
        (Some(addr), _) => addr,
        (None, Some(m)) => m.get_node(&node).map(|n| n.addr.clone()).ok_or_else(|| {
            format!(
                "member {node} is not in the last membership of {} (its members: {:?}): \
                     check --node-id, or give --addr",
                dir.display(),
                m.nodes().map(|(id, _)| *id).collect::<Vec<_>>()
            )
        })?,
        (None, None) => {
            return Err(
                "no membership entry is left in the log (purged): give this member's address \
                 with --addr"
                    .to_owned(),
            )
        }
    };
    let committed = log.committed();
    let from = committed.map_or(first, |c| c.index + 1).max(first);
    let unvouched: Vec<(u64, u64, &'static str)> = if from <= last.index {
        log.read(from, last.index + 1)
            .map_err(|e| e.to_string())?
            .iter()
            .map(|e| (raft_index(e.id), e.id.term, kind(&e.payload)))
            .collect()
    } else {
        Vec::new()
    };
    let term = vote.leader_id().term().max(last.term) + 1;
    let membership = Membership::new(
        vec![BTreeSet::from([node])],
        BTreeMap::from([(node, RaftNode::new(addr.clone()))]),
    )
    .map_err(|e| e.to_string())?;
    let entry = LogEntry {
        id: EntryId {
            term,
            index: last.index + 1,
        },
        payload: EntryPayload::Membership(
            codec::encode("membership", &membership).map_err(|e| e.to_string())?,
        ),
    };
    log.write(&[entry]).map_err(|e| e.to_string())?;
    log.sync().map_err(|e| e.to_string())?;
    let vote = Vote::new(term, node);
    log.save_vote(&codec::encode("vote", &vote).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    log.mark_amnesiac(false).map_err(|e| e.to_string())?;
    tracing::warn!(
        node,
        term,
        index = last.index,
        "force-new: this member is now the only voter of its cluster"
    );
    Ok(ForceNewReport {
        node,
        addr,
        previous_voters: previous
            .map(|m| m.voter_ids().collect())
            .unwrap_or_default(),
        committed: committed.map(raft_index),
        last: raft_index(last),
        unvouched,
        entry: (last.index, term),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> EntryLog {
        EntryLog::open(EntryLogConfig {
            dir: dir.to_path_buf(),
            segment_bytes_max: 1 << 20,
        })
        .expect("open the log")
    }

    fn three() -> Membership {
        Membership::new(
            vec![BTreeSet::from([1, 2, 3])],
            BTreeMap::from([
                (1, RaftNode::new("a:1")),
                (2, RaftNode::new("b:2")),
                (3, RaftNode::new("c:3")),
            ]),
        )
        .expect("membership")
    }

    #[test]
    fn force_new_leaves_one_voter_in_a_new_term_and_names_what_was_not_known_committed() {
        let dir = tempfile::tempdir().expect("dir");
        let log = open(dir.path());
        let membership = codec::encode("membership", &three()).expect("encode");
        let mut entries = vec![LogEntry {
            id: EntryId { term: 0, index: 1 },
            payload: EntryPayload::Membership(membership),
        }];
        for index in 2..=6 {
            entries.push(LogEntry {
                id: EntryId { term: 2, index },
                payload: EntryPayload::Blank,
            });
        }
        log.write(&entries).expect("write");
        log.sync().expect("sync");
        log.save_committed(EntryId { term: 2, index: 4 })
            .expect("commit");
        log.sync().expect("sync");
        let vote = codec::encode("vote", &Vote::new_committed(3, 2)).expect("vote");
        log.save_vote(&vote).expect("vote");
        log.mark_amnesiac(true).expect("mark");
        drop(log);

        let report = force_new_cluster(dir.path(), 3, None).expect("force-new");
        assert_eq!(report.addr, "c:3", "read from the last membership");
        assert_eq!(report.previous_voters, [1, 2, 3]);
        assert_eq!(report.committed, Some(3));
        assert_eq!(report.last, 5);
        let unvouched: Vec<u64> = report.unvouched.iter().map(|u| u.0).collect();
        assert_eq!(
            unvouched,
            [4, 5],
            "Raft indexes after the last known commit"
        );
        assert_eq!(
            report.entry,
            (6, 4),
            "the next index, in a term above the vote's"
        );
        let text = report.to_string();
        assert!(text.contains("Raft indexes 4..=5 (2 entries)"), "{text}");

        let log = open(dir.path());
        let last = log.read(7, 8).expect("read").pop().expect("the new entry");
        let EntryPayload::Membership(bytes) = last.payload else {
            panic!("not a membership entry: {last:?}");
        };
        let m: Membership = codec::decode("membership", &bytes).expect("decode");
        assert_eq!(m.voter_ids().collect::<Vec<_>>(), [3]);
        let vote: Vote =
            codec::decode("vote", &log.read_vote().expect("vote").expect("saved")).expect("vote");
        assert_eq!(vote, Vote::new(4, 3));
        assert!(!log.amnesiac().expect("mark"), "the one voter votes");
        drop(log);
        assert!(
            force_new_cluster(tempfile::tempdir().expect("dir").path(), 3, None)
                .expect_err("an empty directory")
                .contains("no VOTE")
        );
    }
}
