//! Replicated mode (issue 19): `cursorlog serve --node-id N --peers 1=HOST:PORT,2=…,3=…`.
//!
//! Every member serves clients and its peers on the same `--listen` port: the peers' Raft
//! service (`cursorlog.raft.v1`) sits beside `cursorlog.v1.CursorLog`, behind the same
//! bearer token and TLS. The member with the lowest id forms the cluster the first time,
//! when every log is empty; afterwards membership lives in the log. Writes on a node that
//! is not the leader, and reads on a node that cannot prove it leads (ReadIndex), answer
//! `UNAVAILABLE` with the leader's address in the message and in the `cursorlog-leader`
//! response header. Without `--node-id`, none of this runs: one node, as before.

use std::collections::BTreeMap;
use std::time::Duration;

use cursorlog_engine::{Config, Proposed};
use cursorlog_replication::{
    ClientOptions, ClusterTiming, NodeId, NodeOptions, RaftNode, ReplicatedNode,
};
use tonic::transport::{Certificate, ClientTlsConfig};
use tonic::Status;

use crate::ServeArgs;

/// The response header that names the leader on an `UNAVAILABLE` answer.
pub const LEADER_HEADER: &str = "cursorlog-leader";
/// The response header that says whether a refused write may be sent again as is.
pub const RETRY_HEADER: &str = "cursorlog-retry";

/// What a client may do with a write answered `UNAVAILABLE` by a cluster member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// `safe`: nothing of the write was proposed (this node is not the leader); send it
    /// again, as is, to the leader.
    Safe,
    /// `outcome-unknown`: the write may still take effect (leadership changed while it was
    /// in flight, or the cluster refused what it was planned against). Retry only what is
    /// idempotent: an append with `expected_next_seq`, an `OpenSession`; an `OpenStream`
    /// retried may open a second stream.
    OutcomeUnknown,
}

/// Adds the [`RETRY_HEADER`] header to `status`.
pub fn retry_is(mut status: Status, retry: Retry) -> Status {
    let value = match retry {
        Retry::Safe => "safe",
        Retry::OutcomeUnknown => "outcome-unknown",
    };
    status.metadata_mut().insert(
        RETRY_HEADER,
        tonic::metadata::MetadataValue::from_static(value),
    );
    status
}

/// Replication flags of `cursorlog serve`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// Run as member ID of a replicated cluster (needs --peers). Without it, cursorlog runs
    /// as one node.
    #[arg(long, env = "CURSORLOG_NODE_ID", requires = "peers", value_parser = clap::value_parser!(u64).range(1..))]
    pub node_id: Option<u64>,
    /// The cluster's members, `ID=HOST:PORT` comma-separated, this node included. Each
    /// address is that member's --listen address (clients and peers share it). The lowest
    /// ID forms the cluster when every member's data directory is new.
    #[arg(long, env = "CURSORLOG_PEERS", value_delimiter = ',', value_parser = parse_peer, requires = "node_id")]
    pub peers: Vec<(NodeId, String)>,
    /// Shortest election timeout in ms (the longest, which is also the leader lease, is 1.5×
    /// it). A leader that stops is replaced after about 2.5–3× this: the followers wait out
    /// its lease, then an election timeout; keep it at least 4 heartbeats and above the
    /// worst pause of a loaded machine.
    #[arg(long, env = "CURSORLOG_ELECTION_TIMEOUT_MS", default_value_t = 400, value_parser = clap::value_parser!(u64).range(20..))]
    pub election_timeout_ms: u64,
    /// How often the leader heartbeats its followers, in ms.
    #[arg(long, env = "CURSORLOG_HEARTBEAT_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(5..))]
    pub heartbeat_ms: u64,
    /// Never form the cluster from this member: wait for `cursorlog cluster init` (sent to
    /// any member started with the same --peers) or to be added with `cluster add-learner`.
    /// Without it, the lowest ID of --peers forms the cluster on its first start.
    #[arg(long, env = "CURSORLOG_JOIN", requires = "node_id")]
    pub join: bool,
    /// TEST ONLY: dial member ID at HOST:PORT instead of its --peers address (a fault proxy
    /// on the link from this node to it). Repeatable; hidden from --help.
    #[arg(long, hide = true, value_parser = parse_peer)]
    pub peer_route: Vec<(NodeId, String)>,
    /// With TLS: the CA that signed the peers' certificates [default: --tls-cert, for a
    /// cluster sharing one self-signed certificate].
    #[arg(long, env = "CURSORLOG_PEER_CA")]
    pub peer_ca: Option<std::path::PathBuf>,
    /// Replication: a member snapshots its log every this many entries. A snapshot costs
    /// opening the segment files; a member more than `--snapshot-keep-entries` behind is sent
    /// one instead of entries. Retention deletes a segment only once a snapshot covers it.
    #[arg(long, env = "CURSORLOG_SNAPSHOT_EVERY_ENTRIES", default_value_t = cursorlog_replication::snapshot::SNAPSHOT_EVERY_ENTRIES, value_parser = clap::value_parser!(u64).range(1..))]
    pub snapshot_every_entries: u64,
    /// Replication: entries a member keeps below its last snapshot (a member that restarts
    /// within them catches up by entries). With `--snapshot-every-entries`, how far beyond
    /// the retention bound a member's log may grow.
    #[arg(long, env = "CURSORLOG_SNAPSHOT_KEEP_ENTRIES", default_value_t = cursorlog_replication::snapshot::KEEP_BELOW_SNAPSHOT_ENTRIES)]
    pub snapshot_keep_entries: u64,
}

/// `ID=HOST:PORT`.
fn parse_peer(text: &str) -> Result<(NodeId, String), String> {
    let (id, addr) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not ID=HOST:PORT (e.g. 1=127.0.0.1:7001)"))?;
    let id: NodeId = id
        .trim()
        .parse()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| format!("{text:?}: the member id must be a whole number from 1"))?;
    let addr = addr.trim();
    if addr
        .rsplit_once(':')
        .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        return Err(format!("{text:?}: the address must be HOST:PORT"));
    }
    Ok((id, addr.to_owned()))
}

/// The members as openraft's membership holds them; refuses duplicates and a list without
/// this node.
fn members(args: &ClusterArgs, id: NodeId) -> Result<BTreeMap<NodeId, RaftNode>, String> {
    let mut members = BTreeMap::new();
    for (peer, addr) in &args.peers {
        if members.insert(*peer, RaftNode::new(addr)).is_some() {
            return Err(format!("--peers names member {peer} twice"));
        }
    }
    if !members.contains_key(&id) {
        return Err(format!(
            "--peers does not list this node ({id}): list every member, this one included"
        ));
    }
    Ok(members)
}

/// The members `cursorlog cluster init` forms the cluster of: this member's --peers (empty
/// for a single node, or when the list is invalid: `start` reports that).
pub fn founders(args: &ServeArgs) -> BTreeMap<NodeId, RaftNode> {
    args.cluster
        .node_id
        .and_then(|id| members(&args.cluster, id).ok())
        .unwrap_or_default()
}

/// The raw bearer token peers present to each other (the same one clients use).
fn peer_token(args: &ServeArgs) -> Result<Option<String>, String> {
    match (&args.auth_token_file, &args.auth_token) {
        (Some(path), _) => std::fs::read_to_string(path)
            .map(|t| Some(t.trim().to_owned()))
            .map_err(|e| format!("cannot read --auth-token-file {}: {e}", path.display())),
        (None, Some(token)) => Ok(Some(token.trim().to_owned())),
        (None, None) => Ok(None),
    }
}

/// Starts this member's Raft node over its data directory, when `--node-id` is given.
///
/// # Errors
/// Bad flags, an unreadable token or CA, or a data directory or Raft that does not start.
pub async fn start(args: &ServeArgs, config: Config) -> Result<Option<ReplicatedNode>, String> {
    let Some(id) = args.cluster.node_id else {
        return Ok(None);
    };
    let members = members(&args.cluster, id)?;
    let election = Duration::from_millis(args.cluster.election_timeout_ms);
    let heartbeat = Duration::from_millis(args.cluster.heartbeat_ms);
    if heartbeat >= election {
        return Err(format!(
            "--heartbeat-ms {} must be below --election-timeout-ms {}",
            args.cluster.heartbeat_ms, args.cluster.election_timeout_ms
        ));
    }
    let mut client = ClientOptions::new();
    for (peer, addr) in &args.cluster.peer_route {
        tracing::warn!(
            peer,
            addr,
            "TEST ONLY: --peer-route dials this member through another address"
        );
        client = client.with_route(*peer, addr);
    }
    if let Some(token) = peer_token(args)? {
        client = client
            .with_token(&token)
            .map_err(|e| format!("the auth token cannot be sent to peers: {e}"))?;
    }
    if args.tls_cert.is_some() {
        let ca_path = args.cluster.peer_ca.as_ref().or(args.tls_cert.as_ref());
        if let Some(path) = ca_path {
            let pem = std::fs::read(path)
                .map_err(|e| format!("cannot read the peers' CA {}: {e}", path.display()))?;
            client =
                client.with_tls(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)));
        }
    }
    let dir = config.dir.clone();
    let node = ReplicatedNode::start(NodeOptions {
        id,
        engine: config,
        // A member that joins forms nothing: `cluster init` or `add-learner` brings it in.
        members: if args.cluster.join {
            BTreeMap::new()
        } else {
            members
        },
        timing: ClusterTiming {
            heartbeat,
            election_min: election,
            // The lease (openraft's is the longest timeout) plus a timeout is the failover
            // time; a narrower range than openraft's 2x shortens it by half a timeout, at the
            // price of more split votes (each costs one more timeout).
            election_max: election * 3 / 2,
            ..ClusterTiming::default()
        },
        client,
        request_timeout: Duration::from_secs(10),
        snapshots: cursorlog_replication::SnapshotPolicy {
            every: args.cluster.snapshot_every_entries,
            keep_below: args.cluster.snapshot_keep_entries,
        },
        file_system: crate::serve::file_system(args),
    })
    .await
    .map_err(|e| format!("cannot start cluster member {id} on {}: {e}", dir.display()))?;
    tracing::info!(node = id, "started as a member of a replicated cluster");
    Ok(Some(node))
}

/// The `UNAVAILABLE` answer for a read or write this node cannot serve, naming the leader.
pub fn unavailable(outcome: &Proposed) -> Status {
    match outcome {
        Proposed::NotLeader { leader } => retry_is(with_leader(
            Status::unavailable(match leader {
                Some(l) => format!("this node is not the leader: the leader is at {l}; retry there"),
                None => "this node is not the leader and knows of none (an election is under way, or this node is cut off): retry shortly or on another member".into(),
            }),
            leader.as_deref(),
        ), Retry::Safe),
        Proposed::Unknown(why) | Proposed::Refused(why) => retry_is(
            Status::unavailable(format!("the cluster did not answer ({why}); retry")),
            Retry::OutcomeUnknown,
        ),
        Proposed::Applied => Status::internal("an applied read reported as a failure"),
    }
}

/// Adds the leader's address to `status` as the [`LEADER_HEADER`] header.
pub fn with_leader(mut status: Status, leader: Option<&str>) -> Status {
    if let Some(value) = leader.and_then(|l| l.parse().ok()) {
        status.metadata_mut().insert(LEADER_HEADER, value);
    }
    status
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn peers_parse_and_bad_ones_say_what_is_wrong() {
        assert_eq!(
            parse_peer("2=127.0.0.1:7002").unwrap(),
            (2, "127.0.0.1:7002".into())
        );
        assert_eq!(
            parse_peer(" 3 = node3:7003").unwrap(),
            (3, "node3:7003".into())
        );
        for bad in [
            "127.0.0.1:7002",
            "0=a:1",
            "x=a:1",
            "1=a",
            "1=:7",
            "1=a:port",
        ] {
            assert!(parse_peer(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn a_member_list_must_hold_this_node_once() {
        let args = ClusterArgs {
            node_id: Some(1),
            peers: vec![(1, "a:1".into()), (2, "b:2".into())],
            ..ClusterArgs::default()
        };
        assert_eq!(members(&args, 1).unwrap().len(), 2);
        assert!(members(&args, 3)
            .unwrap_err()
            .contains("does not list this node"));
        let twice = ClusterArgs {
            peers: vec![(1, "a:1".into()), (1, "b:2".into())],
            ..args
        };
        assert!(members(&twice, 1).unwrap_err().contains("twice"));
    }

    #[test]
    fn a_not_leader_answer_names_the_leader_in_a_header() {
        let s = unavailable(&Proposed::NotLeader {
            leader: Some("127.0.0.1:7002".into()),
        });
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert_eq!(
            s.metadata().get(LEADER_HEADER).unwrap().to_str().unwrap(),
            "127.0.0.1:7002"
        );
        assert!(s.message().contains("127.0.0.1:7002"));
        assert_eq!(s.metadata().get(RETRY_HEADER).unwrap(), "safe");
        let none = unavailable(&Proposed::NotLeader { leader: None });
        assert!(none.metadata().get(LEADER_HEADER).is_none());
    }
}
