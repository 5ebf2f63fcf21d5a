//! The simulated cluster of `tests/cluster_sim.rs`: nodes ([`node`]) on slow fault-injecting
//! disks ([`disk`]), their network ([`net`]), the clients ([`client`]) and the faults.

pub mod client;
pub mod disk;
pub mod net;
pub mod node;

use std::sync::Arc;
use std::time::Duration;

use cursorlog_engine::Tear;
use cursorlog_replication::{ClusterTiming, NodeId};
use openraft::async_runtime::WatchReceiver as _;
use openraft::ServerState;

use net::Net;
use node::{Node, StartError, StorageErrors};

/// splitmix64, so a seed reproduces the same choices of faults.
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next number.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 for 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// An index into a slice of `len`.
    pub fn pick(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap_or(0)
    }

    /// A coin flip.
    pub fn coin(&mut self) -> bool {
        self.below(2) == 1
    }
}

/// The timing of the simulated cluster: [`ClusterTiming`] scaled down about 3x from the
/// default (100 ms, 1–2 s) for an in-process run, and still well above the scheduling
/// hiccups of a loaded 2-core machine.
pub fn timing() -> ClusterTiming {
    ClusterTiming {
        heartbeat: Duration::from_millis(50),
        election_min: Duration::from_millis(300),
        election_max: Duration::from_millis(600),
        install_snapshot: Duration::from_secs(10),
    }
}

/// How long a power loss planned in a node's next disk operations may wait for them (a node
/// cut off from the quorum by the others' power loss writes nothing).
const IO_CRASH_WAIT: Duration = Duration::from_millis(500);

/// A fault the driver injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// A random node's process is killed (Raft shut down, store dropped), then its disk
    /// loses power (unsynced bytes dropped or torn), then it restarts.
    KillAndPowerLoss,
    /// The leader's process is killed and restarted; its disk keeps everything.
    LeaderKill,
    /// These nodes' disks lose power while the nodes run, each either at once or in the
    /// middle of one of its next disk operations (tearing what was not synced), then they
    /// restart.
    PowerLoss(u8),
    /// The leader is cut off both ways, then the cut heals.
    PartitionBoth,
    /// The leader's outgoing links are cut (it hears the others, they do not hear it), then
    /// the cut heals.
    PartitionOneWay,
}

impl FaultKind {
    /// The kind without its node set (for the per-kind counts).
    pub fn label(self) -> String {
        match self {
            Self::KillAndPowerLoss => "kill + power loss".into(),
            Self::LeaderKill => "leader kill".into(),
            Self::PowerLoss(set) => {
                let n = set.count_ones();
                format!("power loss of {n} node{}", if n == 1 { "" } else { "s" })
            }
            Self::PartitionBoth => "leader partition (both ways)".into(),
            Self::PartitionOneWay => "leader partition (one way)".into(),
        }
    }

    /// A random fault.
    pub fn random(rng: &mut Rng, nodes: usize) -> Self {
        match rng.below(5) {
            0 => Self::KillAndPowerLoss,
            1 => Self::LeaderKill,
            2 => {
                // Any non-empty subset, all of them included.
                let all = (1u64 << nodes) - 1;
                Self::PowerLoss(u8::try_from(1 + rng.below(all)).unwrap_or(1))
            }
            3 => Self::PartitionBoth,
            _ => Self::PartitionOneWay,
        }
    }
}

/// The simulated cluster.
pub struct Cluster {
    /// The nodes, ids 1..=n in order.
    pub nodes: Vec<Node>,
    /// Their network.
    pub net: Net,
    /// Every storage error seen.
    pub errors: StorageErrors,
    /// Power losses placed in the middle of a disk operation.
    pub io_crashes: u64,
    /// Of those, the ones whose disk did no I/O in time (the power went anyway).
    pub io_crashes_idle: u64,
    config: Arc<openraft::Config>,
}

impl Cluster {
    /// `n` nodes, started and initialized as one cluster; disks seeded from `seed`.
    pub async fn start(n: u64, seed: u64) -> Result<Self, StartError> {
        let config = timing()
            .config("cluster-sim")
            .map_err(|e| StartError::Raft(0, e.to_string()))?;
        let mut cluster = Self {
            nodes: Vec::new(),
            net: Net::default(),
            errors: StorageErrors::default(),
            io_crashes: 0,
            io_crashes_idle: 0,
            config: Arc::new(config),
        };
        for id in 1..=n {
            let node = Node::new(id, seed ^ id.wrapping_mul(0x5151))
                .map_err(|e| StartError::Raft(id, e.to_string()))?;
            cluster.nodes.push(node);
        }
        for i in 0..cluster.nodes.len() {
            cluster.restart(i).await?;
        }
        let members: std::collections::BTreeMap<NodeId, cursorlog_replication::RaftNode> = (1..=n)
            .map(|id| {
                (
                    id,
                    cursorlog_replication::RaftNode::new(format!("sim-{id}")),
                )
            })
            .collect();
        let first = cluster.nodes[0]
            .running
            .as_ref()
            .map(|r| r.raft.clone())
            .ok_or(StartError::Raft(1, "not running".into()))?;
        first
            .initialize(members)
            .await
            .map_err(|e| StartError::Raft(1, e.to_string()))?;
        Ok(cluster)
    }

    /// Starts node at position `i` if it is not running.
    pub async fn restart(&mut self, i: usize) -> Result<(), StartError> {
        let (net, config, errors) = (
            self.net.clone(),
            Arc::clone(&self.config),
            self.errors.clone(),
        );
        let node = &mut self.nodes[i];
        if node.running.is_none() {
            node.start(&net, &config, &errors).await?;
        }
        Ok(())
    }

    /// The node believed leader: a running node in state `Leader`, the one of the highest
    /// term if several are (a deposed one may not know yet).
    pub fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let m = n.running.as_ref()?.raft.metrics().borrow_watched().clone();
                (m.state == ServerState::Leader).then_some((m.current_term, i))
            })
            .max()
            .map(|(_, i)| i)
    }

    /// Injects the first half of `fault` (the second is [`Cluster::recover`]). `leader` is
    /// the position of the node believed leader. Returns whether a quorum can still make
    /// progress while the fault lasts.
    pub async fn inject(&mut self, fault: FaultKind, leader: usize, rng: &mut Rng) -> bool {
        let n = self.nodes.len();
        match fault {
            FaultKind::KillAndPowerLoss => {
                let victim = rng.pick(n);
                self.nodes[victim].stop(&self.net).await;
                let tear = random_tear(rng);
                self.nodes[victim].power_loss(rng.coin(), tear);
                true
            }
            FaultKind::LeaderKill => {
                self.nodes[leader].stop(&self.net).await;
                true
            }
            FaultKind::PowerLoss(set) => {
                let victims: Vec<usize> = (0..n).filter(|i| set & (1 << i) != 0).collect();
                for &v in &victims {
                    let tear = random_tear(rng);
                    if rng.coin() {
                        self.nodes[v].power_loss(rng.coin(), tear);
                    } else {
                        // In the middle of one of its next few writes, syncs, renames, …
                        self.nodes[v].power_loss_during_io(1 + rng.below(12), tear);
                        self.io_crashes += 1;
                    }
                }
                let started = std::time::Instant::now();
                for &v in &victims {
                    self.wait_dead(v, started).await;
                }
                for &v in &victims {
                    self.nodes[v].stop(&self.net).await;
                }
                victims.len() * 2 < n
            }
            FaultKind::PartitionBoth | FaultKind::PartitionOneWay => {
                let l = self.nodes[leader].id;
                for other in self.nodes.iter().map(|n| n.id).filter(|id| *id != l) {
                    self.net.cut(l, other);
                    if fault == FaultKind::PartitionBoth {
                        self.net.cut(other, l);
                    }
                }
                true
            }
        }
    }

    /// Waits until node `i`'s disk died of the power loss planned in its I/O; a node that
    /// does no I/O meanwhile (nothing to write) loses power anyway.
    async fn wait_dead(&mut self, i: usize, started: std::time::Instant) {
        while !self.nodes[i].dead() {
            if started.elapsed() > IO_CRASH_WAIT {
                self.io_crashes_idle += 1;
                self.nodes[i].power_loss(true, Tear::Prefix);
                return;
            }
            // The disk has no notification of its death to wait on.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Ends every fault: links healed, stopped nodes restarted.
    pub async fn recover(&mut self) -> Result<(), StartError> {
        self.net.heal();
        for i in 0..self.nodes.len() {
            self.restart(i).await?;
        }
        Ok(())
    }
}

fn random_tear(rng: &mut Rng) -> Tear {
    if rng.coin() {
        Tear::Sectors
    } else {
        Tear::Prefix
    }
}
