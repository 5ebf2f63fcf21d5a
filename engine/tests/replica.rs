//! A replica's engine applies committed entries (issue 19 item 2, first half): the groups a
//! single node wrote, replicated as entries into another directory's `EntryLog` and applied
//! there after commit, serve exactly what the single node serves (every session, stream,
//! event, verdict and outcome); an entry the apply rules refuse changes nothing; followers
//! wake on apply; a replica takes no writes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::history::{describe, history};

use std::path::Path;

use common::*;
use cursorlog_engine::{
    Append, Config, Engine, EntryId, EntryLog, EntryLogConfig, EntryPayload, Error, LogEntry,
    NewEvent, Proposal, ProposedRecord, SyncPolicy,
};

/// The workload of [`history`] on a single node, closed.
fn single_node_history(dir: &Path) {
    let e = open(dir, SyncPolicy::Always, 64 * 1024);
    history(&e);
    e.close().unwrap();
}

/// The single node's atomic groups, as a leader would propose them: one entry each.
fn groups_as_entries(dir: &Path, term: u64) -> Vec<LogEntry> {
    let mut entries = Vec::new();
    let mut group = Vec::new();
    for (path, f) in all_frames(dir) {
        let bytes = std::fs::read(&path).unwrap();
        let body = bytes[(f.offset + FRAME_HEADER_BYTES) as usize..f.end() as usize].to_vec();
        group.push(ProposedRecord {
            tag: f.record_type,
            body,
        });
        if f.group_left == 0 {
            entries.push(LogEntry {
                id: EntryId {
                    term,
                    index: entries.len() as u64 + 1,
                },
                payload: EntryPayload::Records(Proposal::from_records(&group)),
            });
            group.clear();
        }
    }
    entries
}

fn replica_config(dir: &Path) -> Config {
    config(dir, SyncPolicy::Always, 64 * 1024)
}

#[test]
fn a_replica_applying_the_committed_entries_serves_what_the_single_node_serves() {
    let single = tempfile::tempdir().unwrap();
    single_node_history(single.path());
    let entries = groups_as_entries(single.path(), 1);
    assert!(entries.len() > 15, "{} entries", entries.len());
    let expected = describe(&Engine::open(replica_config(single.path())).unwrap());
    // The comparison covers every kind of state the history made.
    for kind in [
        "Completed",
        "Aborted",
        "Superseded",
        "expired_at_ms: Some",
        "Resumable",
        "outcome req-1: Some",
    ] {
        assert!(expected.contains(kind), "{kind} missing from:\n{expected}");
    }

    let dir = tempfile::tempdir().unwrap();
    let log = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap();
    log.append(&entries).unwrap();
    // Nothing committed yet: the replica serves nothing.
    let replica = Engine::open_replica(replica_config(dir.path()), &log).unwrap();
    assert!(replica.sessions().unwrap().is_empty());
    // Half committed, then all: applied in order, each entry whole.
    let half = entries.len() as u64 / 2;
    let applied = replica.apply_committed(half).unwrap();
    assert_eq!((applied.entries, applied.refused.len()), (half, 0));
    let applied = replica.apply_committed(entries.len() as u64).unwrap();
    assert_eq!(applied.entries, entries.len() as u64 - half);
    assert!(applied.refused.is_empty(), "{:?}", applied.refused);
    assert_eq!(describe(&replica), expected);
    drop(replica);

    // A restart rebuilds the same state from the log, up to the committed entry.
    log.save_committed(EntryId {
        term: 1,
        index: entries.len() as u64,
    })
    .unwrap();
    let replica = Engine::open_replica(replica_config(dir.path()), &log).unwrap();
    assert_eq!(describe(&replica), expected);
}

#[test]
fn a_replica_applies_only_entries_its_own_log_has_synced() {
    let single = tempfile::tempdir().unwrap();
    single_node_history(single.path());
    let entries = groups_as_entries(single.path(), 1);
    let dir = tempfile::tempdir().unwrap();
    let log = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap();
    // Written, not synced: a member may learn entries are committed before its own copy
    // is on disk. Its index must never hold state a power loss could take from its log.
    log.write(&entries).unwrap();
    assert_eq!(log.durable(), 0);
    let replica = Engine::open_replica(replica_config(dir.path()), &log).unwrap();
    let half = entries.len() as u64 / 2;
    replica.apply_committed(half).unwrap();
    assert!(
        log.durable() >= half,
        "applied through {half}, durable through {}",
        log.durable()
    );
}

#[test]
fn an_entry_the_rules_refuse_changes_nothing_and_later_entries_apply() {
    let single = tempfile::tempdir().unwrap();
    single_node_history(single.path());
    let mut entries = groups_as_entries(single.path(), 1);
    // Entry 4 (an append of seqs 6..=9) again, as entry 5: a proposal that committed twice
    // (a leader retried it across a failover). Its seqs no longer follow the head.
    let dup = LogEntry {
        id: EntryId { term: 1, index: 5 },
        payload: entries[3].payload.clone(),
    };
    entries.insert(4, dup);
    for (i, e) in entries.iter_mut().enumerate() {
        e.id.index = i as u64 + 1;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap();
    log.append(&entries[..6]).unwrap();
    let replica = Engine::open_replica(replica_config(dir.path()), &log).unwrap();
    let before = {
        replica.apply_committed(4).unwrap();
        describe(&replica)
    };
    let applied = replica.apply_committed(5).unwrap();
    assert_eq!(applied.entries, 0);
    assert_eq!(applied.refused.len(), 1, "{applied:?}");
    assert_eq!(applied.refused[0].0.index, 5);
    assert!(
        applied.refused[0].1.contains("does not follow head"),
        "{applied:?}"
    );
    assert_eq!(
        describe(&replica),
        before,
        "a refused entry changed nothing"
    );
    // The entry after it is decided on its own (applied or refused, never skipped).
    let later = replica.apply_committed(6).unwrap();
    assert_eq!(later.entries + later.refused.len() as u64, 1);
}

#[test]
fn followers_wake_on_apply_and_writes_are_refused() {
    let single = tempfile::tempdir().unwrap();
    single_node_history(single.path());
    let entries = groups_as_entries(single.path(), 1);
    let dir = tempfile::tempdir().unwrap();
    let log = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap();
    log.append(&entries).unwrap();
    let replica = Engine::open_replica(replica_config(dir.path()), &log).unwrap();
    // Apply up to the entry that opened the first stream, then follow it.
    let opened = (1..=entries.len() as u64)
        .find(|&i| {
            replica.apply_committed(i).unwrap();
            !replica.streams().unwrap().is_empty()
        })
        .unwrap();
    let stream = replica.streams().unwrap()[0].clone();
    let mut follower = replica.follow(&stream.session, stream.id, 0).unwrap();
    assert_eq!(follower.poll(100).unwrap().map(|v| v.len()), Some(0));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let r2 = replica.clone();
    let applier = std::thread::spawn(move || r2.apply_committed(opened + 1).unwrap());
    rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(20), follower.changed())
            .await
            .expect("woken by the apply")
            .unwrap();
    });
    applier.join().unwrap();
    assert!(!follower.poll(100).unwrap().unwrap_or_default().is_empty());
    // A replica takes no writes of its own.
    assert!(matches!(
        replica.open_session("new"),
        Err(Error::NotLeader { .. })
    ));
    assert!(matches!(
        replica.append(Append {
            session: stream.session.clone(),
            stream: stream.id,
            expected_next_seq: None,
            events: vec![NewEvent::new("k", b"x".to_vec())],
        }),
        Err(Error::NotLeader { .. })
    ));
}
