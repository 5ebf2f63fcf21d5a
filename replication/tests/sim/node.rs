//! One simulated node: its own fault-injecting disk ([`FaultyFs`]) and data directory, the
//! real [`SegmentLogStore`] over an [`EntryLog`] on that disk (wrapped to record every
//! storage error), and, while it runs, its openraft [`Raft`](super::net::SimRaft).

use std::io;
use std::ops::RangeBounds;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cursorlog_engine::{
    EntryLog, EntryLogConfig, Error as EngineError, Fault, FaultyFs, FileSystem as _, Tear,
};
use cursorlog_replication::{Entry, LogId, NodeId, SegmentLogStore, TypeConfig, Vote};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::OptionalSend;

use super::disk::SlowFs;
use super::net::{Net, SimRaft};
use crate::support::MemStateMachine;

/// Small segments, so the logs roll and seal segments during a run.
const SEGMENT_BYTES: u64 = 16 * 1024;

/// How long a restart may wait for the old process's last handle on its directory to go.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Storage errors seen by any node's store.
#[derive(Clone, Default)]
pub struct StorageErrors(Arc<Mutex<ErrorCounts>>);

/// What [`StorageErrors`] holds.
#[derive(Debug, Default)]
pub struct ErrorCounts {
    /// Errors while the node's disk was dead (the injected ones).
    pub injected: u64,
    /// Errors on a powered disk: each one is a failure of the run.
    pub unexpected: Vec<String>,
}

impl StorageErrors {
    fn note(&self, node: NodeId, op: &str, powered: bool, err: &io::Error) {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if powered {
            counts.unexpected.push(format!("node {node} {op}: {err}"));
        } else {
            counts.injected += 1;
        }
    }

    /// The counts so far.
    pub fn snapshot(&self) -> (u64, Vec<String>) {
        let counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        (counts.injected, counts.unexpected.clone())
    }
}

/// Whether `fs` lost power and was not revived yet (every operation fails then; a disk is
/// revived only after the last handle of the run that saw it die is gone).
fn dead(fs: &FaultyFs, dir: &std::path::Path) -> bool {
    fs.list(dir).is_err()
}

/// [`SegmentLogStore`], recording the errors it returns (and whether its disk was dead).
#[derive(Clone)]
pub struct SimStore {
    node: NodeId,
    inner: SegmentLogStore,
    fs: FaultyFs,
    dir: PathBuf,
    errors: StorageErrors,
}

impl SimStore {
    fn check<T>(&self, op: &str, r: Result<T, io::Error>) -> Result<T, io::Error> {
        if let Err(e) = &r {
            let powered = !dead(&self.fs, &self.dir);
            self.errors.note(self.node, op, powered, e);
        }
        r
    }
}

impl RaftLogReader<TypeConfig> for SimStore {
    async fn try_get_log_entries<RB>(&mut self, range: RB) -> Result<Vec<Entry>, io::Error>
    where
        RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend,
    {
        let r = self.inner.try_get_log_entries(range).await;
        self.check("read", r)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        let r = self.inner.read_vote().await;
        self.check("read_vote", r)
    }
}

impl RaftLogStorage<TypeConfig> for SimStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let r = self.inner.get_log_state().await;
        self.check("get_log_state", r)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let r = self.inner.save_vote(vote).await;
        self.check("save_vote", r)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        let r = self.inner.save_committed(committed).await;
        self.check("save_committed", r)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        let r = self.inner.read_committed().await;
        self.check("read_committed", r)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let r = self.inner.append(entries, callback).await;
        self.check("append", r)
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), io::Error> {
        let r = self.inner.truncate_after(last).await;
        self.check("truncate_after", r)
    }

    async fn purge(&mut self, upto: LogId) -> Result<(), io::Error> {
        let r = self.inner.purge(upto).await;
        self.check("purge", r)
    }
}

/// A running node.
pub struct Running {
    /// Its Raft handle.
    pub raft: SimRaft,
    /// Its state machine (in memory: empty again after every restart).
    pub sm: MemStateMachine,
    /// Its log, for the oracle to read.
    pub log: EntryLog,
}

/// One node, running or not.
pub struct Node {
    /// Its id.
    pub id: NodeId,
    /// Its disk (the log sees it through [`SlowFs`]: syncs take time).
    pub fs: FaultyFs,
    /// The seed of its syncs' latencies.
    latency_seed: u64,
    /// Its data directory (the disk's files are keyed by paths under it; the engine's
    /// directory lock is a real file there).
    dir: tempfile::TempDir,
    /// Set while it runs.
    pub running: Option<Running>,
}

/// Why a node did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The engine refused to open the log.
    #[error("node {0}: opening the log: {1}")]
    Open(NodeId, EngineError),
    /// The old process's handles kept the directory locked.
    #[error("node {0}: the data directory stayed locked for {LOCK_WAIT:?}")]
    StillLocked(NodeId),
    /// openraft refused to start.
    #[error("node {0}: starting raft: {1}")]
    Raft(NodeId, String),
}

impl Node {
    /// A node that has never run, its disk's random choices following `seed`.
    pub fn new(id: NodeId, seed: u64) -> io::Result<Self> {
        Ok(Self {
            id,
            fs: FaultyFs::new(seed),
            latency_seed: seed.rotate_left(17),
            dir: tempfile::tempdir()?,
            running: None,
        })
    }

    fn config(&self) -> EntryLogConfig {
        let mut config = EntryLogConfig::new(self.dir.path());
        config.segment_bytes_max = SEGMENT_BYTES;
        config
    }

    /// Opens the log, once every handle of the previous run is gone (the directory lock is
    /// free). A disk without power is revived only then, so no write of the dead run can
    /// land on the revived disk.
    async fn open_log(&self) -> Result<EntryLog, StartError> {
        let started = Instant::now();
        loop {
            let (config, disk) = (
                self.config(),
                SlowFs::new(self.fs.clone(), self.latency_seed),
            );
            let opened =
                tokio::task::spawn_blocking(move || EntryLog::open_with_fs(config, Arc::new(disk)))
                    .await
                    .map_err(|e| StartError::Raft(self.id, format!("the open task failed: {e}")))?;
            match opened {
                Ok(log) => return Ok(log),
                Err(EngineError::Locked { .. }) if started.elapsed() < LOCK_WAIT => {
                    // Waiting for another task's drop: there is no event to wait for.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(EngineError::Locked { .. }) => return Err(StartError::StillLocked(self.id)),
                // The lock was free; the open failed on the dead disk. Power is back.
                Err(_) if self.dead() => self.fs.revive(),
                Err(e) => return Err(StartError::Open(self.id, e)),
            }
        }
    }

    /// Starts (or restarts) the node from its directory and puts it on `net`.
    pub async fn start(
        &mut self,
        net: &Net,
        config: &Arc<openraft::Config>,
        errors: &StorageErrors,
    ) -> Result<(), StartError> {
        let log = self.open_log().await?;
        let store = SimStore {
            node: self.id,
            inner: SegmentLogStore::new(log.clone()),
            fs: self.fs.clone(),
            dir: self.dir.path().to_path_buf(),
            errors: errors.clone(),
        };
        let sm = MemStateMachine::default();
        let raft = SimRaft::new(
            self.id,
            Arc::clone(config),
            net.factory(self.id),
            store,
            sm.clone(),
        )
        .await
        .map_err(|e| StartError::Raft(self.id, e.to_string()))?;
        net.register(self.id, raft.clone());
        self.running = Some(Running { raft, sm, log });
        Ok(())
    }

    /// Takes the node off the network and shuts its Raft down (the process exits; what it
    /// wrote stays in the page cache unless the disk loses power too).
    pub async fn stop(&mut self, net: &Net) {
        net.unregister(self.id);
        if let Some(running) = self.running.take() {
            // A node whose disk died already stopped with a storage error: either way it is
            // gone now.
            let _ = running.raft.shutdown().await;
        }
    }

    /// Whether its disk lost power (until the next [`Node::start`] revives it).
    pub fn dead(&self) -> bool {
        dead(&self.fs, self.dir.path())
    }

    /// Power loss now: the disk keeps its synced bytes and, torn per `tear`, part of the
    /// rest (the unsynced bytes are dropped when `torn` is false). It stays dead until the
    /// next [`Node::start`].
    pub fn power_loss(&self, torn: bool, tear: Tear) {
        self.fs.set_tear(tear);
        self.fs.crash(torn);
    }

    /// Power loss during the disk's `after`-th operation from now (a write, sync, truncation,
    /// unlink, rename or directory sync), tearing what is not synced per `tear`.
    pub fn power_loss_during_io(&self, after: u64, tear: Tear) {
        self.fs.set_tear(tear);
        self.fs.inject(after, Fault::CrashDuringOp);
    }
}
