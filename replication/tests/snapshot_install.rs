//! The state machine's snapshot install on a member's own log: a member whose log already
//! holds the snapshot's last entry applies up to it and keeps the entries after it (openraft
//! keeps counting on them); a member that lacks it gets the snapshot's files as its log.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use cursorlog_engine::{Config, Engine, EntryId, EntryLog, EntryLogConfig, EntryPayload, LogEntry};
use cursorlog_replication::EngineStateMachine;
use openraft::storage::RaftStateMachine as _;

fn blanks(from: u64, to: u64) -> Vec<LogEntry> {
    (from..to)
        .map(|index| LogEntry {
            id: EntryId { term: 1, index },
            payload: EntryPayload::Blank,
        })
        .collect()
}

/// A member's log holding entries `1..to` (blank, term 1), `committed` of them committed,
/// and its engine (which applied the committed ones at open).
fn member(dir: &Path, to: u64, committed: u64) -> (EntryLog, Engine) {
    let log = EntryLog::open(EntryLogConfig {
        dir: dir.to_path_buf(),
        segment_bytes_max: 1024,
    })
    .unwrap();
    log.append(&blanks(1, to)).unwrap();
    log.save_committed(EntryId {
        term: 1,
        index: committed,
    })
    .unwrap();
    let mut config = Config::new(dir);
    config.retention.check_interval = Duration::from_secs(24 * 3600);
    let engine = Engine::open_replica(config, &log).unwrap();
    (log, engine)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_holds_the_snapshots_entries_keeps_its_log_and_one_that_lacks_them_takes_the_files(
) {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    // The source applied entry 25 of 40.
    let (_source_log, source) = member(a.path(), 41, 25);
    let mut source_sm = EngineStateMachine::new(source);

    // A member holding 1..=30 of the same entries, 20 applied.
    let (log, engine) = member(b.path(), 31, 20);
    let snapshot = source_sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(snapshot.meta.last_log_id.unwrap().index(), 24, "entry 25");
    let mut sm = EngineStateMachine::new(engine.clone());
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(engine.applied().unwrap().last.unwrap().index, 25);
    assert_eq!(
        log.state().last,
        Some(EntryId { term: 1, index: 30 }),
        "the entries after the snapshot stay"
    );

    // A member with 5 entries gets the snapshot's files as its log.
    let (log, engine) = member(c.path(), 6, 5);
    let snapshot = source_sm.get_current_snapshot().await.unwrap().unwrap();
    let mut sm = EngineStateMachine::new(engine.clone());
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(engine.applied().unwrap().last.unwrap().index, 25);
    assert_eq!(log.state().last, Some(EntryId { term: 1, index: 25 }));
    assert_eq!(
        log.state().last_purged,
        Some(EntryId { term: 1, index: 25 })
    );
}
