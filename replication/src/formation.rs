//! Forming a cluster, and never a second one by accident (issue 30 item 4, review R1).
//!
//! openraft lets any member with an empty log and vote `initialize` a cluster. A member whose
//! directory was wiped looks exactly like a new one, so a wiped founder that initialized on
//! its own re-formed an empty cluster beside the members that still held the data, and a
//! second wiped member voted it in. So a member with an empty directory forms nothing until
//! it has asked every member of its `--peers` (the `ClusterAdmin.Status` call) and every one
//! answered with an empty log:
//!
//! - only the lowest id of `--peers` forms, and only then: it picks a random cluster id
//!   (saved in `CLUSTER` before `initialize`), which every other member adopts from the
//!   first Raft request it is sent;
//! - while a peer does not answer, it waits and asks again, having said once in one log
//!   line whom it waits for (`cursorlog cluster init` forms without waiting);
//! - when a peer answers with a formed log, it forms nothing, ever, and says once in one log
//!   line what it waits for (that cluster's leader) and what to run if none comes.
//!
//! The wait ends as soon as this member holds a log (it formed, or a leader reached it).

use std::collections::BTreeMap;
use std::time::Duration;

use cursorlog_proto::raft_v1::cluster_admin_client::ClusterAdminClient;
use cursorlog_proto::raft_v1::{MemberStatus, StatusRequest};
use openraft::async_runtime::WatchReceiver as _;
use openraft::error::{InitializeError, RaftError};
use openraft::storage::RaftStateMachine;

use crate::identity::{ClusterId, ClusterIdentity};
use crate::network::ClientOptions;
use crate::types::{NodeId, Raft, RaftNode, TypeConfig};

/// How long one peer's status may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a waiting member asks its peers again.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// What one peer said about its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// It answered: its log is empty.
    Empty,
    /// It answered: it holds a formed log ending at `last` (Raft index), of cluster `cluster`
    /// ("" when it has no identity), led by `leader` as far as it knows (0: none).
    Formed {
        /// The last Raft log index it holds.
        last: u64,
        /// Its cluster identity.
        cluster: String,
        /// The leader it knows of (0: none).
        leader: NodeId,
    },
    /// It did not answer.
    Silent(String),
}

impl Peer {
    fn of(status: &MemberStatus) -> Self {
        match status.last_log_index {
            None => Self::Empty,
            Some(last) => Self::Formed {
                last,
                cluster: status.cluster_id.clone(),
                leader: status.leader_id,
            },
        }
    }
}

/// What a member with an empty directory may do, given what its peers said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every peer answered with an empty log: the founder may form the cluster.
    Form,
    /// Some peers did not answer (ids and addresses): wait and ask again.
    Wait(Vec<(NodeId, String)>),
    /// A peer holds a formed log: form nothing (id, address, its last index, its cluster).
    Joins(NodeId, String, u64, String, NodeId),
}

/// The verdict on `answers` (each peer's id, address and answer); a formed log anywhere wins
/// over silence elsewhere.
pub fn verdict(answers: &[(NodeId, String, Peer)]) -> Verdict {
    let formed = answers
        .iter()
        .filter_map(|(id, addr, p)| match p {
            Peer::Formed {
                last,
                cluster,
                leader,
            } => Some((*id, addr.clone(), *last, cluster.clone(), *leader)),
            _ => None,
        })
        .max_by_key(|(_, _, last, _, _)| *last);
    if let Some((id, addr, last, cluster, leader)) = formed {
        return Verdict::Joins(id, addr, last, cluster, leader);
    }
    let silent: Vec<(NodeId, String)> = answers
        .iter()
        .filter(|(_, _, p)| matches!(p, Peer::Silent(_)))
        .map(|(id, addr, _)| (*id, addr.clone()))
        .collect();
    if silent.is_empty() {
        Verdict::Form
    } else {
        Verdict::Wait(silent)
    }
}

/// Asks every member of `members` but `me` for its status, at once.
pub async fn probe(
    me: NodeId,
    members: &BTreeMap<NodeId, RaftNode>,
    client: &ClientOptions,
) -> Vec<(NodeId, String, Peer)> {
    let asks = members
        .iter()
        .filter(|(id, _)| **id != me)
        .map(|(id, node)| async move {
            let addr = client
                .routes
                .get(id)
                .cloned()
                .unwrap_or_else(|| node.addr.clone());
            (*id, node.addr.clone(), ask(client, &addr).await)
        });
    futures_util::future::join_all(asks).await
}

/// One peer's status.
async fn ask(client: &ClientOptions, addr: &str) -> Peer {
    let channel = match client.channel(addr) {
        Ok(channel) => channel,
        Err(e) => return Peer::Silent(e.to_string()),
    };
    let mut request = tonic::Request::new(StatusRequest {});
    request.set_timeout(PROBE_TIMEOUT);
    if let Some(token) = &client.authorization {
        request
            .metadata_mut()
            .insert("authorization", token.clone());
    }
    let mut admin = ClusterAdminClient::new(channel);
    let call = admin.status(request);
    match tokio::time::timeout(PROBE_TIMEOUT, call).await {
        Ok(Ok(status)) => Peer::of(status.get_ref()),
        Ok(Err(status)) => Peer::Silent(format!("{}: {}", status.code(), status.message())),
        Err(_) => Peer::Silent(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// The one line a member with an empty directory logs on finding a formed log at a peer.
pub fn joins_line(me: NodeId, my_addr: &str, verdict: &Verdict) -> Option<String> {
    let Verdict::Joins(peer, addr, last, cluster, leader) = verdict else {
        return None;
    };
    let cluster = if cluster.is_empty() {
        "(no identity)".to_owned()
    } else {
        cluster.clone()
    };
    let led = if *leader == 0 {
        "it knows of no leader".to_owned()
    } else {
        format!("its leader is member {leader}")
    };
    Some(format!(
        "this member's data directory is empty but member {peer} ({addr}) holds cluster \
         {cluster}'s log up to index {last} ({led}): this member forms no cluster and waits \
         for that cluster's leader to reach it and catch it up. If the leader does not reach \
         it, run `cursorlog cluster remove --members LEADER --id {me}` then `cursorlog \
         cluster add-learner --members LEADER --id {me} --addr {my_addr}` and `cursorlog \
         cluster promote --members LEADER --id {me}`; \
         if the cluster has no leader because a quorum lost its data, stop the member with \
         the longest log, run `cursorlog cluster force-new --data-dir DIR --node-id ID` on \
         it, start it, and add the others back (README, \"Recovery\")"
    ))
}

/// Until this member holds a log: asks the peers, forms the cluster when it is the founder
/// and every peer answered with an empty log, and says once what it waits for otherwise.
pub(crate) fn spawn<SM>(
    raft: Raft<SM>,
    me: NodeId,
    members: BTreeMap<NodeId, RaftNode>,
    client: ClientOptions,
    identity: ClusterIdentity,
) -> tokio::task::JoinHandle<()>
where
    SM: RaftStateMachine<TypeConfig>,
{
    tokio::spawn(async move {
        let founder = members.keys().next() == Some(&me);
        let my_addr = members.get(&me).map(|n| n.addr.clone()).unwrap_or_default();
        let mut said = String::new();
        let mut metrics = raft.metrics();
        loop {
            if metrics.borrow_watched().last_log_index.is_some() {
                return;
            }
            let answers = probe(me, &members, &client).await;
            if metrics.borrow_watched().last_log_index.is_some() {
                return;
            }
            let verdict = verdict(&answers);
            let line = match &verdict {
                Verdict::Form if founder => {
                    form(&raft, &members, &identity).await;
                    return;
                }
                Verdict::Form => String::new(),
                Verdict::Wait(silent) if founder => {
                    let who: Vec<String> = silent
                        .iter()
                        .map(|(id, addr)| format!("{id} ({addr})"))
                        .collect();
                    format!(
                        "waiting for member(s) {} to answer before forming the cluster: a \
                         member forms a cluster only once every member of --peers answered \
                         with an empty log (`cursorlog cluster init` forms without waiting)",
                        who.join(", ")
                    )
                }
                Verdict::Wait(_) => String::new(),
                Verdict::Joins(..) => joins_line(me, &my_addr, &verdict).unwrap_or_default(),
            };
            if !line.is_empty() && line != said {
                tracing::warn!("{line}");
                said = line;
            }
            let _ = tokio::time::timeout(PROBE_EVERY, metrics.changed()).await;
        }
    })
}

/// Forms the cluster of `members`: a new random identity (unless this member has one),
/// saved before `initialize`.
async fn form<SM>(raft: &Raft<SM>, members: &BTreeMap<NodeId, RaftNode>, identity: &ClusterIdentity)
where
    SM: RaftStateMachine<TypeConfig>,
{
    if identity.current().is_none() {
        if let Err(e) = identity.establish(ClusterId::random()) {
            tracing::error!(error = %e, "cannot save a cluster identity: not forming the cluster");
            return;
        }
    }
    match raft.initialize(members.clone()).await {
        Ok(()) => tracing::info!(
            members = ?members,
            cluster = ?identity.current().map(|c| c.to_string()),
            "every member answered with an empty log: initialized the cluster"
        ),
        Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
            tracing::info!(reason = %e, "the cluster is already initialized");
        }
        Err(e) => tracing::error!(error = %e, "initializing the cluster failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn formed(last: u64) -> Peer {
        Peer::Formed {
            last,
            cluster: "00000000000000ab".into(),
            leader: 0,
        }
    }

    #[test]
    fn a_founder_forms_only_when_every_peer_answered_empty() {
        let all_empty = [
            (2, "b:2".into(), Peer::Empty),
            (3, "c:3".into(), Peer::Empty),
        ];
        assert_eq!(verdict(&all_empty), Verdict::Form);
        assert_eq!(verdict(&[]), Verdict::Form, "a one-member cluster");
        let one_silent = [
            (2, "b:2".into(), Peer::Empty),
            (3, "c:3".into(), Peer::Silent("refused".into())),
        ];
        assert_eq!(verdict(&one_silent), Verdict::Wait(vec![(3, "c:3".into())]));
    }

    #[test]
    fn a_formed_log_anywhere_forbids_forming_even_with_others_silent() {
        let answers = [
            (2, "b:2".into(), Peer::Silent("refused".into())),
            (3, "c:3".into(), formed(53)),
        ];
        let v = verdict(&answers);
        assert_eq!(
            v,
            Verdict::Joins(3, "c:3".into(), 53, "00000000000000ab".into(), 0)
        );
        let line = joins_line(1, "a:1", &v).expect("a line");
        assert!(line.contains("member 3 (c:3)"), "{line}");
        assert!(line.contains("up to index 53"), "{line}");
        assert!(line.contains("remove --members LEADER --id 1"), "{line}");
        assert!(line.contains("force-new"), "{line}");
        assert!(!line.contains('\n'));
    }
}
