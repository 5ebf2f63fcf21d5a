//! A one-node "cluster" for the leader tests (`leader.rs`, `leader_batching.rs`,
//! `member_retention.rs`): a
//! [`Proposer`] that appends the writer's proposals to the node's own `EntryLog`, commits
//! and applies them, or hands each batch to the test to settle as it arranges.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cursorlog_engine::{
    Config, Engine, EntryId, EntryLog, EntryLogConfig, EntryPayload, LogEntry, ManualClock,
    OpenStream, Proposal, Proposed, Proposer, Settle, SyncPolicy,
};

use crate::common::config;

/// A proposed batch held for the test to settle.
pub type Held = (Vec<Proposal>, Settle);

/// A one-node cluster: appends proposals to the log in term 1, commits them and applies.
#[derive(Debug)]
pub struct LocalCluster {
    pub log: EntryLog,
    /// The engine that applies (set after open; cleared to end the cycle).
    pub engine: Mutex<Option<Engine>>,
    /// Append a blank entry before the next batch (an entry of openraft's own slipping in
    /// between the plan and the append).
    pub blank_first: AtomicBool,
    /// This node is a follower whose leader is at this address.
    pub follower_of: Mutex<Option<String>>,
    /// The next batch waits here (after saying so on `entered`) before it settles.
    pub hold: Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
    /// How many coming batches settle as "outcome unknown", with nothing appended (a
    /// leader that lost its quorum while they were in flight).
    pub unknown_batches: AtomicUsize,
    /// Batches go here, to be settled by the test, instead of being settled at once.
    pub to_test: Mutex<Option<Sender<Held>>>,
    /// The next batch's `prepare` says so on the first and waits for the second.
    pub prepare_hold: Mutex<Option<(Sender<()>, Receiver<()>)>>,
    /// The most proposal bytes the writer merges into one entry (0: the engine's default).
    pub entry_bytes_max: AtomicUsize,
    /// How a batch with no entry settles: its leadership confirmation (a ReadIndex round on
    /// a real cluster) fails this way; `None`, it holds.
    pub confirmation_fails: Mutex<Option<Proposed>>,
    /// `prepare` applies every committed entry first, as a ReadIndex round makes a new leader
    /// apply the previous term's tail (off: entries are applied when this cluster settles).
    pub apply_in_prepare: AtomicBool,
}

impl LocalCluster {
    /// A cluster over `log` that settles every batch at once (the engine is set after open).
    pub fn new(log: EntryLog) -> Arc<Self> {
        Arc::new(Self {
            log,
            engine: Mutex::new(None),
            blank_first: AtomicBool::new(false),
            follower_of: Mutex::new(None),
            hold: Mutex::new(None),
            unknown_batches: AtomicUsize::new(0),
            to_test: Mutex::new(None),
            prepare_hold: Mutex::new(None),
            entry_bytes_max: AtomicUsize::new(0),
            confirmation_fails: Mutex::new(None),
            apply_in_prepare: AtomicBool::new(false),
        })
    }

    pub fn append_committed(&self, payloads: Vec<EntryPayload>) -> Vec<EntryId> {
        let next = self.log.state().last.map_or(1, |id| id.index + 1);
        let entries: Vec<LogEntry> = payloads
            .into_iter()
            .enumerate()
            .map(|(i, payload)| LogEntry {
                id: EntryId {
                    term: 1,
                    index: next + i as u64,
                },
                payload,
            })
            .collect();
        self.log.append(&entries).unwrap();
        let ids: Vec<EntryId> = entries.iter().map(|e| e.id).collect();
        self.log.save_committed(*ids.last().unwrap()).unwrap();
        ids
    }
}

impl Proposer for LocalCluster {
    fn prepare(&self) -> Result<u64, Proposed> {
        if let Some((entered, release)) = self.prepare_hold.lock().unwrap().take() {
            entered.send(()).unwrap();
            release.recv().unwrap();
        }
        if let Some(leader) = self.follower_of.lock().unwrap().clone() {
            return Err(Proposed::NotLeader {
                leader: Some(leader),
            });
        }
        if self.apply_in_prepare.load(Ordering::Acquire) {
            let committed = self.log.committed().map_or(0, |c| c.index);
            let engine = self.engine.lock().unwrap().clone();
            if let Some(engine) = engine {
                engine.apply_committed(committed).unwrap();
            }
        }
        Ok(1)
    }

    fn leads(&self) -> bool {
        self.follower_of.lock().unwrap().is_none()
    }

    fn entry_bytes_max(&self) -> usize {
        match self.entry_bytes_max.load(Ordering::Acquire) {
            0 => 4 << 20,
            n => n,
        }
    }

    fn propose(&self, entries: Vec<Proposal>, settle: Settle) {
        if let Some(test) = self.to_test.lock().unwrap().clone() {
            return test.send((entries, settle)).unwrap();
        }
        settle.settle(self.settle_now(entries));
    }
}

impl LocalCluster {
    /// Appends, commits and applies `entries` at once (or as the test arranged).
    pub fn settle_now(&self, entries: Vec<Proposal>) -> Vec<Proposed> {
        if entries.is_empty() {
            return self
                .confirmation_fails
                .lock()
                .unwrap()
                .clone()
                .into_iter()
                .collect();
        }
        if let Some((entered, release)) = self.hold.lock().unwrap().take() {
            entered.send(()).unwrap();
            release.recv().unwrap();
        }
        if self
            .unknown_batches
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            return vec![Proposed::Unknown("lost the quorum".into()); entries.len()];
        }
        if self.blank_first.swap(false, Ordering::AcqRel) {
            let blank = self.append_committed(vec![EntryPayload::Blank]);
            let engine = self.engine.lock().unwrap().clone().unwrap();
            engine.apply_committed(blank[0].index).unwrap();
        }
        let ids = self.append_committed(entries.into_iter().map(EntryPayload::Records).collect());
        let engine = self.engine.lock().unwrap().clone().unwrap();
        let applied = engine.apply_committed(ids.last().unwrap().index).unwrap();
        ids.iter()
            .map(|id| match applied.refused.iter().find(|(r, _)| r == id) {
                Some((_, why)) => Proposed::Refused(why.clone()),
                None => Proposed::Applied,
            })
            .collect()
    }
}

pub fn stream_in(session: &str) -> OpenStream {
    OpenStream {
        session: session.into(),
        epoch: 1,
        correlation: None,
        lease_ms: None,
    }
}

pub fn config_at(dir: &Path, clock: &Arc<ManualClock>) -> Config {
    let mut c = config(dir, SyncPolicy::Always, 64 * 1024);
    c.clock = Arc::clone(clock) as _;
    c
}

/// A replicated node over `dir` with a one-node cluster.
pub fn open_leader(dir: &Path, clock: &Arc<ManualClock>) -> (Engine, Arc<LocalCluster>) {
    let log = EntryLog::open(EntryLogConfig::new(dir)).unwrap();
    let cluster = LocalCluster::new(log.clone());
    let engine = Engine::open_replicated(
        config_at(dir, clock),
        &log,
        Arc::clone(&cluster) as Arc<dyn Proposer>,
    )
    .unwrap();
    *cluster.engine.lock().unwrap() = Some(engine.clone());
    (engine, cluster)
}

pub fn close(engine: Engine, cluster: &LocalCluster) {
    cluster.engine.lock().unwrap().take();
    engine.close().unwrap();
}

/// An append of one event to `stream` at `seq`.
pub fn one_event(session: &str, stream: u64, seq: u64) -> cursorlog_engine::Append {
    cursorlog_engine::Append {
        session: session.into(),
        stream,
        expected_next_seq: Some(seq),
        events: vec![cursorlog_engine::NewEvent::new("k", b"x".to_vec())],
    }
}

/// The next batch the writer proposed (it is held until the test settles it).
pub fn next_batch(batches: &Receiver<Held>) -> Held {
    batches
        .recv_timeout(Duration::from_secs(60))
        .expect("the writer proposes the next batch while the ones before it are in flight")
}
