//! One replicated cursorlog node: the segment log as openraft's log store, the engine as its
//! state machine, and the engine's writes proposed through openraft ([`RaftProposer`]).
//!
//! Wiring, in the order [`ReplicatedNode::start`] does it: open the [`EntryLog`]; open the
//! engine over it with a proposer that does not know its Raft handle yet (the engine is the
//! state machine, and the Raft handle needs the state machine: the proposer gets the handle
//! once it exists); start Raft; a member with an empty directory asks its peers before it
//! forms anything (`crate::formation`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use cursorlog_engine::{
    Config, Engine, EntryLog, EntryLogConfig, Proposal, Proposed, Proposer, Settle,
};
use futures_util::StreamExt as _;
use openraft::async_runtime::WatchReceiver as _;
use openraft::error::{ClientWriteError, LinearizableReadError, RaftError};
use openraft::{Instant as _, ReadPolicy, ServerState};

use crate::amnesia::VoteGuard;
use crate::identity::{ClusterIdentity, IdentityError};
use crate::network::{ClientOptions, NetworkFactory};
use crate::state_machine::EngineStateMachine;
use crate::types::{ClusterTiming, NodeId, Proposal as RaftProposal, Raft, RaftNode};
use crate::SegmentLogStore;
use check_quorum::watch_leading;

mod check_quorum;

/// How a node is started.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// This node's id in the cluster.
    pub id: NodeId,
    /// The engine's configuration (its `dir` is the node's data directory).
    pub engine: Config,
    /// The cluster's members when it is first formed: id → client/peer address. The member
    /// with the lowest id initializes the cluster once every member answered with an empty
    /// log (`crate::formation`); later starts ignore it (membership then lives in the log).
    pub members: BTreeMap<NodeId, RaftNode>,
    /// Election and heartbeat timing.
    pub timing: ClusterTiming,
    /// How this node reaches its peers (token, TLS).
    pub client: ClientOptions,
    /// How long a proposal or a linearizable read may wait for the cluster.
    pub request_timeout: Duration,
    /// When the node snapshots and how much log it keeps below a snapshot.
    pub snapshots: crate::snapshot::SnapshotPolicy,
    /// The file system under the node's log: the real one ([`cursorlog_engine::StdFs`]) but
    /// in crash tests, which swap in one that loses unsynced writes.
    pub file_system: Arc<dyn cursorlog_engine::FileSystem>,
}

/// Why a node did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory's log or engine did not open.
    #[error("opening the node's data directory: {0}")]
    Engine(#[from] cursorlog_engine::Error),
    /// The timing is inconsistent.
    #[error("the cluster timing is invalid: {0}")]
    Timing(#[from] openraft::ConfigError),
    /// openraft did not start, or the cluster could not be initialized.
    #[error("starting raft: {0}")]
    Raft(String),
    /// The cluster identity file could not be read or written.
    #[error("{0}")]
    Identity(#[from] IdentityError),
}

/// A running replicated node.
#[derive(Clone)]
pub struct ReplicatedNode {
    id: NodeId,
    engine: Engine,
    raft: Raft<EngineStateMachine>,
    proposer: Arc<RaftProposer>,
    vote_guard: VoteGuard,
    /// The disk-pressure watcher (`space.rs`), stopped before the Raft core at shutdown so
    /// it holds nothing of the node once [`ReplicatedNode::shutdown`] returns.
    space_watch: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
    /// Whether this member leads with a quorum's recent acknowledgement, kept by one task
    /// per member (`watch_leading`) for every follow and task watch to wait on.
    leading: tokio::sync::watch::Receiver<bool>,
    /// That task, stopped at shutdown.
    leading_watch: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
    /// The log store openraft writes through, kept to wait out its last sync at shutdown.
    store: SegmentLogStore,
    /// The cluster this member belongs to (`crate::identity`).
    identity: ClusterIdentity,
    /// How this member reaches its peers (the formation probe, `cluster init`).
    client: ClientOptions,
    /// Asks the peers until this member holds a log (`crate::formation`); stopped at shutdown.
    formation: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl std::fmt::Debug for ReplicatedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicatedNode")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// What a node says about itself (health, `inspect`, metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// This node's id.
    pub id: NodeId,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub role: &'static str,
    /// The current term.
    pub term: u64,
    /// The leader this node knows of, with its address.
    pub leader: Option<(NodeId, String)>,
    /// The last log index (Raft's, from 0), if any.
    pub last_log_index: Option<u64>,
    /// The last applied index, if any.
    pub last_applied: Option<u64>,
    /// The committed index, if known.
    pub committed: Option<u64>,
    /// Per follower (on the leader): how many entries it is behind the leader's last.
    pub lag: BTreeMap<NodeId, u64>,
    /// The voters, with their addresses.
    pub voters: BTreeMap<NodeId, String>,
    /// The learners (receiving the log, not voting), with their addresses.
    pub learners: BTreeMap<NodeId, String>,
}

impl ReplicatedNode {
    /// Opens the node's data directory and starts Raft on it.
    ///
    /// # Errors
    /// [`StartError`] naming what did not open or start.
    pub async fn start(options: NodeOptions) -> Result<Self, StartError> {
        let dir: PathBuf = options.engine.dir.clone();
        let log = EntryLog::open_with_fs(
            EntryLogConfig {
                dir,
                segment_bytes_max: options.engine.segment_bytes_max,
            },
            Arc::clone(&options.file_system),
        )?;
        let voted = log.read_vote()?.is_some();
        if !voted && log.state().last.is_some() {
            return Err(StartError::Raft(format!(
                "{} holds a single node's log (entries, no cluster vote): a cluster member \
                 cannot start on it; start the member on a new directory (copying a single \
                 node's data into a cluster is not supported yet)",
                options.engine.dir.display()
            )));
        }
        let fresh = !voted;
        // A saved identity stands even if --peers changed since (members come and go); a
        // member without one gets it from the formation or from the first leader that
        // reaches it (`crate::identity`).
        let identity = ClusterIdentity::load(log.clone())?;
        // Written before Raft starts, so it is on disk before any vote is saved (R10).
        let vote_guard = VoteGuard::durable(&log, fresh)?;
        let proposer = Arc::new(RaftProposer {
            id: options.id,
            raft: OnceLock::new(),
            runtime: tokio::runtime::Handle::current(),
            ready_term: Arc::new(Mutex::new(None)),
            timeout: options.request_timeout,
            quorum_timeout: options.timing.election_max,
            membership_seen: Mutex::new(None),
        });
        let engine = {
            let (config, log, p) = (options.engine.clone(), log.clone(), Arc::clone(&proposer));
            tokio::task::spawn_blocking(move || {
                Engine::open_replicated(config, &log, p as Arc<dyn Proposer>)
            })
            .await
            .map_err(|e| StartError::Raft(e.to_string()))??
        };
        let config =
            crate::snapshot::with_policy(options.timing.config("cursorlog")?, options.snapshots)?;
        let store = SegmentLogStore::new(log);
        let raft = Raft::new(
            options.id,
            Arc::new(config),
            NetworkFactory::new(options.id, options.client.clone()).with_identity(identity.clone()),
            store.clone(),
            EngineStateMachine::new(engine.clone()),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let _ = proposer.raft.set(raft.clone());
        // A member whose log is empty forms a cluster only when every peer answered with an
        // empty log (the founder), and otherwise says what it waits for (R1).
        let empty = raft.metrics().borrow_watched().last_log_index.is_none();
        let formation = (empty && !options.members.is_empty()).then(|| {
            crate::formation::spawn(
                raft.clone(),
                options.id,
                options.members.clone(),
                options.client.clone(),
                identity.clone(),
            )
        });
        vote_guard.lift_when_leading(&raft);
        let space_watch = Arc::new(Mutex::new(Some(crate::space::spawn_space_watch(
            raft.clone(),
            &engine,
        ))));
        let (leading, leading_watch) = watch_leading(raft.clone(), Arc::clone(&proposer));
        if fresh {
            tracing::info!(
                "this member has no saved vote: it votes in an election of a running cluster \
                 only after a leader has reached it"
            );
        }
        Ok(Self {
            id: options.id,
            engine,
            raft,
            proposer,
            vote_guard,
            space_watch,
            leading,
            leading_watch: Arc::new(Mutex::new(Some(leading_watch))),
            store,
            identity,
            client: options.client,
            formation: Arc::new(Mutex::new(formation)),
        })
    }

    /// This member's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// How this member reaches its peers.
    pub fn client(&self) -> &ClientOptions {
        &self.client
    }

    /// This member's cluster identity: give it to the Raft service
    /// ([`crate::RaftService::with_identity`]) and to `cluster init`.
    pub fn identity(&self) -> ClusterIdentity {
        self.identity.clone()
    }

    /// Whether this member may vote yet: give it to the Raft service
    /// ([`crate::RaftService::with_vote_guard`]).
    pub fn vote_guard(&self) -> VoteGuard {
        self.vote_guard.clone()
    }

    /// The engine: reads, and writes that this node proposes when it leads.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The Raft handle (for the node-to-node service).
    pub fn raft(&self) -> &Raft<EngineStateMachine> {
        &self.raft
    }

    /// Waits until a read on this node is linearizable: it is the leader, a quorum confirmed
    /// it after the read began, and it applied everything committed by then (ReadIndex).
    ///
    /// # Errors
    /// [`Proposed::NotLeader`] with the leader's address when another node leads (or none is
    /// known, or this node is cut off from a quorum); [`Proposed::Unknown`] on a timeout.
    pub async fn linearizable(&self) -> Result<(), Proposed> {
        self.proposer.linearizable().await
    }

    /// Resolves once this node does not lead (at once if it does not now), or leads without
    /// having heard from a quorum for an election timeout (cut off: another member may lead
    /// already): a live `Read` follower or task watch on it must then move to the new
    /// leader, or it would wait for events this node will not apply in time, or ever.
    pub async fn stopped_leading(&self) {
        let mut leading = self.leading.clone();
        loop {
            leading.borrow_and_update();
            // The metrics decide (the watch may not have seen a change yet); the watch only
            // says when to look again.
            if !self
                .proposer
                .leads_with_quorum(&self.raft.metrics().borrow_watched())
            {
                return;
            }
            if leading.changed().await.is_err() {
                return;
            }
        }
    }

    /// Resolves with openraft's fatal error once this node's Raft core stopped (a storage
    /// failure, a panic): the node then serves nothing useful, and its process should exit
    /// non-zero so a supervisor restarts it, as a poisoned single node does.
    pub async fn core_stopped(&self) -> String {
        let mut metrics = self.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow_watched().running_state {
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                return "the Raft core ended".into();
            }
        }
    }

    /// The address of the leader this node knows of, if any.
    pub fn leader_addr(&self) -> Option<String> {
        self.status().leader.map(|(_, addr)| addr)
    }

    /// This node's view of the cluster.
    pub fn status(&self) -> NodeStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let leader = m.current_leader.map(|l| {
            let addr = m
                .membership_config
                .get_node(&l)
                .map(|n| n.addr.clone())
                .unwrap_or_default();
            (l, addr)
        });
        let last = m.last_log_index.unwrap_or(0);
        let lag = m
            .replication
            .as_ref()
            .map(|r| {
                r.iter()
                    .filter(|(id, _)| **id != self.id)
                    .map(|(id, matched)| {
                        let at = matched.as_ref().map_or(0, |l| l.index + 1);
                        (*id, (last + 1).saturating_sub(at))
                    })
                    .collect()
            })
            .unwrap_or_default();
        NodeStatus {
            id: self.id,
            role: match m.state {
                ServerState::Leader => "leader",
                ServerState::Follower => "follower",
                ServerState::Candidate => "candidate",
                ServerState::Learner => "learner",
                ServerState::Shutdown => "shutdown",
            },
            term: m.current_term,
            leader,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            committed: m.local_committed.map(|l| l.index),
            lag,
            voters: addresses(&m.membership_config, m.membership_config.voter_ids()),
            learners: addresses(
                &m.membership_config,
                m.membership_config.membership().learner_ids(),
            ),
        }
    }

    /// Stops Raft, waits for the log's last sync, then closes the engine.
    ///
    /// # Errors
    /// The engine's close failed (its index could not be flushed).
    pub async fn shutdown(self) -> Result<(), cursorlog_engine::Error> {
        for task in [&self.space_watch, &self.leading_watch] {
            let watch = task.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(watch) = watch {
                watch.abort();
                let _ = watch.await;
            }
        }
        let formation = self
            .formation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(formation) = formation {
            formation.abort();
            let _ = formation.await;
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(error = %e, "raft did not shut down cleanly");
        }
        // No sync may still run on the log once this returns (a restart reopens it).
        if let Err(e) = self.store.settle().await {
            tracing::warn!(error = %e, "the log's last sync failed");
        }
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || engine.close())
            .await
            .map_err(|e| cursorlog_engine::Error::Internal(e.to_string()))?
    }
}

/// Whether the metrics say node `id` leads: in the leader state and naming itself (a leader
/// removed from the membership steps down to another state while it may still name itself).
fn leads(m: &openraft::RaftMetrics<crate::types::TypeConfig>, id: NodeId) -> bool {
    m.state == ServerState::Leader && m.current_leader == Some(id)
}

/// `ids` with their addresses in `membership`.
fn addresses(
    membership: &openraft::type_config::alias::StoredMembershipOf<crate::types::TypeConfig>,
    ids: impl Iterator<Item = NodeId>,
) -> BTreeMap<NodeId, String> {
    ids.map(|id| {
        let addr = membership
            .get_node(&id)
            .map(|n| n.addr.clone())
            .unwrap_or_default();
        (id, addr)
    })
    .collect()
}

/// The engine's [`Proposer`] over openraft.
#[derive(Debug)]
pub struct RaftProposer {
    id: NodeId,
    /// Set once Raft started (Raft needs the engine, which needs this).
    raft: OnceLock<Raft<EngineStateMachine>>,
    runtime: tokio::runtime::Handle,
    /// The term in which this node, as leader, last confirmed it applied everything
    /// committed before its term (see [`Proposer::prepare`]); reset by a batch that found
    /// this node no longer leading.
    ready_term: Arc<Mutex<Option<u64>>>,
    timeout: Duration,
    /// How long a leader may go without a quorum's acknowledgement before it stops
    /// answering (check-quorum, which openraft 0.10 lacks): the longest election timeout,
    /// after which the other members may have elected a leader of their own.
    quorum_timeout: Duration,
    /// The membership this leader last saw and when it first saw it: a changed voter set
    /// starts its own quorum clock (see [`Self::leads_with_quorum`]).
    membership_seen: Mutex<Option<(MembershipLogId, RaftInstant)>>,
}

/// The log id of a membership entry (`None` before the first).
type MembershipLogId = Option<openraft::type_config::alias::LogIdOf<crate::types::TypeConfig>>;

/// The clock openraft stamps its metrics with.
type RaftInstant = openraft::type_config::alias::InstantOf<crate::types::TypeConfig>;

impl RaftProposer {
    fn raft(&self) -> Result<&Raft<EngineStateMachine>, Proposed> {
        self.raft
            .get()
            .ok_or_else(|| Proposed::Unknown("the node is starting".into()))
    }

    /// Whether the metrics say this node leads and a quorum acknowledged it within the last
    /// [`Self::quorum_timeout`] (a one-voter cluster is its own quorum). A leader cut off
    /// from its peers fails this an election timeout after its last acknowledgement, while
    /// openraft still calls it leader.
    ///
    /// A voter set this leader changed less than [`Self::quorum_timeout`] ago counts as
    /// acknowledged since the change: openraft's quorum clock for a new voter set starts
    /// from acknowledgements made under the old one (for a one-voter cluster, the election),
    /// so a leader promoting its first learner read as cut off at once and handed its lead
    /// to the learner in the middle of the promotion. Only how soon a cut-off leader steps
    /// down depends on this; its answers still wait for a commit or a ReadIndex round.
    fn leads_with_quorum(&self, m: &openraft::RaftMetrics<crate::types::TypeConfig>) -> bool {
        if !leads(m, self.id) {
            return false;
        }
        if m.membership_config.voter_ids().count() <= 1 {
            return true;
        }
        let membership = *m.membership_config.log_id();
        let changed_at = {
            let mut seen = self
                .membership_seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match &*seen {
                Some((id, at)) if *id == membership => *at,
                _ => {
                    let now = RaftInstant::now();
                    *seen = Some((membership, now));
                    now
                }
            }
        };
        let acked = m.last_quorum_acked.as_ref().map(|a| a.into_inner());
        let since = acked.map_or(changed_at, |a| a.max(changed_at));
        since.elapsed() < self.quorum_timeout
    }

    /// The address of node `id` in the current membership.
    fn addr_of(&self, id: Option<NodeId>) -> Option<String> {
        let raft = self.raft.get()?;
        let m = raft.metrics().borrow_watched().clone();
        id.and_then(|id| m.membership_config.get_node(&id).map(|n| n.addr.clone()))
    }

    async fn linearizable(&self) -> Result<(), Proposed> {
        confirm_leadership(self.raft()?, self.timeout).await
    }
}

/// A ReadIndex round on `raft`, started now: `Ok` once a quorum confirmed this node leads
/// and it applied everything committed when the round began.
async fn confirm_leadership(
    raft: &Raft<EngineStateMachine>,
    timeout: Duration,
) -> Result<(), Proposed> {
    match tokio::time::timeout(timeout, raft.ensure_linearizable(ReadPolicy::ReadIndex)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f)))) => {
            Err(Proposed::NotLeader {
                leader: f.leader_node.map(|n| n.addr),
            })
        }
        // Cut off from a quorum: whoever leads is elsewhere (or nobody yet).
        Ok(Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_)))) => {
            Err(Proposed::NotLeader { leader: None })
        }
        Ok(Err(e)) => Err(Proposed::Unknown(e.to_string())),
        Err(_) => Err(Proposed::NotLeader { leader: None }),
    }
}

impl Proposer for RaftProposer {
    fn prepare(&self) -> Result<u64, Proposed> {
        let raft = self.raft()?;
        let m = raft.metrics().borrow_watched().clone();
        if !leads(&m, self.id) {
            return Err(Proposed::NotLeader {
                leader: self.addr_of(m.current_leader),
            });
        }
        if !self.leads_with_quorum(&m) {
            // Cut off: whoever leads now is on the other side, and not known here.
            return Err(Proposed::NotLeader { leader: None });
        }
        let mut ready = self
            .ready_term
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *ready == Some(m.current_term) {
            return Ok(m.current_term);
        }
        // First batch of this term: a ReadIndex round makes this node apply everything
        // committed before its term's first entry (a new leader's index may lag the log).
        self.runtime.block_on(self.linearizable())?;
        *ready = Some(m.current_term);
        Ok(m.current_term)
    }

    fn leads(&self) -> bool {
        self.raft
            .get()
            .is_some_and(|raft| self.leads_with_quorum(&raft.metrics().borrow_watched()))
    }

    fn propose(&self, entries: Vec<Proposal>, settle: Settle) {
        let count = entries.len();
        if count == 0 {
            // Answers with no entry (errors, an existing session, an empty dequeue) are
            // claims about the cluster's state: a ReadIndex round started now proves this
            // node still led after they were planned (and waits for its apply).
            let Some(raft) = self.raft.get().cloned() else {
                return settle.settle(vec![Proposed::Unknown("the node is starting".into())]);
            };
            let (id, timeout, ready_term) = (self.id, self.timeout, Arc::clone(&self.ready_term));
            self.runtime.spawn(async move {
                match confirm_leadership(&raft, timeout).await {
                    Ok(()) => settle.settle(Vec::new()),
                    Err(not) => {
                        tracing::debug!(node = id, outcome = ?not, "answers held for want of a leadership confirmation");
                        *ready_term.lock().unwrap_or_else(PoisonError::into_inner) = None;
                        settle.settle(vec![not]);
                    }
                }
            });
            return;
        }
        let raft = match self.raft() {
            Ok(raft) => raft.clone(),
            Err(starting) => return settle.settle(vec![starting; count]),
        };
        let data: Vec<RaftProposal> = entries
            .into_iter()
            .map(|p| RaftProposal {
                records: p.into_bytes(),
            })
            .collect();
        // Queued on the writer's thread, so batches reach the log in the order they were
        // planned (each is planned against the batches before it); only the wait for their
        // outcomes runs beside the writer, which goes on to plan the next batch.
        let queued = self.runtime.block_on(async {
            tokio::time::timeout(self.timeout, raft.client_write_many(data)).await
        });
        let results = match queued {
            Ok(Ok(results)) => results,
            Ok(Err(fatal)) => {
                return settle.settle(vec![Proposed::Unknown(fatal.to_string()); count]);
            }
            Err(_) => {
                let why = format!(
                    "not queued within {} ms (the entries may still commit)",
                    self.timeout.as_millis()
                );
                return settle.settle(vec![Proposed::Unknown(why); count]);
            }
        };
        let (timeout, ready_term) = (self.timeout, Arc::clone(&self.ready_term));
        self.runtime.spawn(async move {
            let outcomes = async {
                let mut out = Vec::with_capacity(count);
                let mut results = results;
                while let Some(result) = results.next().await {
                    out.push(match result {
                        Ok(Ok(written)) => match written.response.refused {
                            None => Proposed::Applied,
                            Some(why) => Proposed::Refused(why),
                        },
                        // Refused before it was appended: nothing of it exists, retry elsewhere.
                        Ok(Err(ClientWriteError::ForwardToLeader(f))) => Proposed::NotLeader {
                            leader: f.leader_node.map(|n| n.addr),
                        },
                        Ok(Err(e)) => Proposed::Unknown(e.to_string()),
                        Err(fatal) => Proposed::Unknown(fatal.to_string()),
                    });
                }
                out
            };
            // A timeout leaves the outcomes not reported yet as unknown (filled in below).
            let mut out = tokio::time::timeout(timeout, outcomes)
                .await
                .unwrap_or_default();
            out.resize(
                count,
                Proposed::Unknown(format!(
                    "no outcome within {} ms (the entry may still commit)",
                    timeout.as_millis()
                )),
            );
            if out.iter().any(|o| matches!(o, Proposed::NotLeader { .. })) {
                *ready_term.lock().unwrap_or_else(PoisonError::into_inner) = None;
            }
            settle.settle(out);
        });
    }
}
