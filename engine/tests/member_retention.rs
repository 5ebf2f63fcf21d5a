//! Retention on a cluster member (issue 19 item 4): the leader decides evictions and
//! carry-forwards and proposes them; a member unlinks only segments that are dead *and*
//! purged (covered by a snapshot), records its refusals and membership first (`BASE`), and
//! rebuilds exactly the same state from the shortened log at its next open, or on a member
//! that installs the snapshot. Here the "cluster" is the one-node proposer of the leader
//! tests (`local_cluster`) over a log of small segments, so the real planner, apply rules,
//! entry log and rebuild run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod local_cluster;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::history::describe;
use common::{append_range, new_stream, segment_files, SMALL_SEGMENT};
use cursorlog_engine::{
    Config, Engine, EntryLog, EntryLogConfig, EntryPayload, ManualClock, StreamState, SyncPolicy,
};
use local_cluster::{close, LocalCluster};

const T0: u64 = 1_800_000_000_000;

fn config(dir: &Path, clock: &Arc<ManualClock>) -> Config {
    let mut c = common::config(dir, SyncPolicy::Always, SMALL_SEGMENT);
    c.clock = Arc::clone(clock) as _;
    c.retention.max_age = Some(Duration::from_secs(3600));
    c.background_expiry = false;
    c.disk_reserve_bytes = 0;
    c
}

fn open(dir: &Path, clock: &Arc<ManualClock>) -> (Engine, Arc<LocalCluster>) {
    let log = EntryLog::open(EntryLogConfig {
        dir: dir.to_path_buf(),
        segment_bytes_max: SMALL_SEGMENT,
    })
    .unwrap();
    let node = LocalCluster::new(log.clone());
    let engine = Engine::open_replicated(config(dir, clock), &log, Arc::clone(&node) as _).unwrap();
    *node.engine.lock().unwrap() = Some(engine.clone());
    (engine, node)
}

/// Installs `taken` on `member` as a transfer would: each file staged, then installed.
fn install(member: &Engine, taken: cursorlog_engine::LogSnapshot) {
    let log = member.entry_log().unwrap();
    let staging = log.begin_install(taken.manifest.clone()).unwrap();
    for (i, mut file) in taken.files.into_iter().enumerate() {
        let mut staged = staging.create(i).unwrap();
        std::io::copy(&mut file, &mut staged).unwrap();
    }
    staging.finish().unwrap();
    member.install_snapshot(staging).unwrap();
}

/// Old streams (evicted by age), then an entry the apply rules refuse, then live streams.
/// Returns the live stream ids.
fn workload(e: &Engine, node: &LocalCluster, clock: &ManualClock) -> Vec<u64> {
    for i in 0..8 {
        let session = format!("old-{i}");
        let (_, stream) = new_stream(e, &session, Some("req"));
        append_range(e, &session, stream, 1, 60);
        e.complete(&session, stream, Some(61), common::event(stream, 61))
            .unwrap();
    }
    clock.advance(Duration::from_secs(2 * 3600));
    // A blank entry slips in between the plan and the append: the stream id predicted for
    // this open is no longer the LSN its record lands at, and apply refuses the entry.
    let s = e.open_session("new").unwrap();
    node.blank_first.store(true, Ordering::Release);
    let refused = e.open_stream(cursorlog_engine::OpenStream {
        session: "new".into(),
        epoch: s.epoch,
        correlation: Some("refused".into()),
        lease_ms: None,
    });
    assert!(
        refused.is_err(),
        "the mispredicted open is refused: {refused:?}"
    );
    let mut live = Vec::new();
    for _ in 0..3 {
        let (_, stream) = new_stream(e, "new", None);
        append_range(e, "new", stream, 1, 10);
        live.push(stream);
    }
    live
}

#[test]
fn a_member_retires_only_purged_dead_segments_and_rebuilds_the_same_state_from_what_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let (leader, node) = open(dir.path(), &clock);
    // The cluster's membership is the log's first entry, in a segment that will retire.
    let membership =
        node.append_committed(vec![EntryPayload::Membership(b"members 1,2,3".to_vec())]);
    leader.apply_committed(membership[0].index).unwrap();
    let members = leader.applied().unwrap().membership;
    assert!(members.is_some());
    let live = workload(&leader, &node, &clock);
    let before = segment_files(dir.path());
    assert!(before.len() > 6, "{} segments", before.len());

    // The leader's pass raises the old streams' watermarks and carries their state
    // forward, as entries; nothing is purged yet, so no segment goes.
    assert_eq!(leader.run_retention().unwrap(), 0);
    let files_before = segment_files(dir.path());
    assert!(
        before.iter().all(|f| files_before.contains(f)),
        "no segment went"
    );
    let served = describe(&leader);
    let evicted = leader.streams().unwrap();
    let evicted = evicted.iter().filter(|s| s.watermark > s.head).count();
    assert!(evicted >= 6, "old streams are evicted by age: {served}");

    // openraft purges what a snapshot covers; the dead prefix goes.
    let applied = leader.applied().unwrap().last.unwrap();
    node.log.purge_through(applied).unwrap();
    let retired = leader.run_retention().unwrap();
    assert!(retired > 0, "dead purged segments retire");
    let files_after = segment_files(dir.path());
    assert_eq!(files_after[..], files_before[retired..]);
    assert!(node.log.first_entry().unwrap() > 1);
    assert_eq!(
        describe(&leader),
        served,
        "retiring dead segments changes no answer"
    );
    for stream in &live {
        let s = leader.streams().unwrap();
        let s = s.iter().find(|s| s.id == *stream).unwrap();
        assert_eq!((s.state, s.head), (StreamState::Open, 10));
    }

    // A member that installs the leader's snapshot gets the shortened log and the
    // refusals among its entries, and serves the same.
    let (taken, _) = leader.snapshot().unwrap().unwrap();
    assert_eq!(
        taken.manifest.refused.as_ref().map(Vec::len),
        Some(1),
        "the refused open is among the snapshot's entries"
    );
    let other = tempfile::tempdir().unwrap();
    let (follower, follower_node) = open(other.path(), &clock);
    install(&follower, taken);
    assert_eq!(describe(&follower), served);
    assert_eq!(follower.applied().unwrap().membership, members);
    close(follower, &follower_node);
    drop(follower_node);
    let (follower, follower_node) = open(other.path(), &clock);
    assert_eq!(describe(&follower), served, "and after its own restart");
    assert_eq!(follower.applied().unwrap().membership, members);
    close(follower, &follower_node);

    // A restart rebuilds from the shortened log: without the refusals recorded in BASE
    // before the unlink, the refused open would apply this time (another stream would
    // appear), and without its membership the member would not know its cluster.
    close(leader, &node);
    drop(node);
    let (reopened, node) = open(dir.path(), &clock);
    assert_eq!(describe(&reopened), served);
    assert_eq!(
        reopened.applied().unwrap().membership,
        members,
        "the membership outlives the segment that held it"
    );
    // And it goes on: a live stream takes its next event.
    append_range(&reopened, "new", live[0], 11, 11);
    close(reopened, &node);
    drop(node);

    // Without BASE the shortened log cannot be rebuilt exactly: the member refuses to open
    // and says how to recover, instead of serving a guess.
    std::fs::remove_file(dir.path().join("BASE")).unwrap();
    let log = EntryLog::open(EntryLogConfig {
        dir: dir.path().to_path_buf(),
        segment_bytes_max: SMALL_SEGMENT,
    })
    .unwrap();
    let err = Engine::open_replica(config(dir.path(), &clock), &log).unwrap_err();
    assert!(
        err.to_string()
            .contains("Wipe this member's data directory"),
        "{err}"
    );
}
