use super::*;
use crate::record::tag;

fn config(dir: &std::path::Path) -> EntryLogConfig {
    EntryLogConfig {
        dir: dir.to_path_buf(),
        segment_bytes_max: 4096,
    }
}

/// A one-record entry whose body is `n` bytes of `index`.
fn entry(term: u64, index: u64, n: usize) -> LogEntry {
    let bytes = session_state(vec![index as u8; n]);
    LogEntry {
        id: EntryId { term, index },
        payload: EntryPayload::Records(Proposal::from_raw(vec![
            (tag::SESSION_STATE, bytes.clone()),
            (tag::SESSION_STATE, bytes),
        ])),
    }
}

/// The body of a SessionState record of session "s" holding `state` (FORMAT.md: session
/// String, state Vec<u8>, at_ms u64, fixed-width little-endian lengths).
pub(super) fn session_state(state: Vec<u8>) -> Vec<u8> {
    let mut b = 1u64.to_le_bytes().to_vec();
    b.push(b's');
    b.extend_from_slice(&(state.len() as u64).to_le_bytes());
    b.extend_from_slice(&state);
    b.extend_from_slice(&0u64.to_le_bytes());
    b
}

fn entries(term: u64, from: u64, to: u64) -> Vec<LogEntry> {
    (from..to).map(|i| entry(term, i, 300)).collect()
}

fn ids(v: &[LogEntry]) -> Vec<(u64, u64)> {
    v.iter().map(|e| (e.id.term, e.id.index)).collect()
}

fn segments(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .expect("list")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        })
        .count()
}

#[test]
fn entries_round_trip_across_segments_and_a_reopen() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    assert_eq!(
        log.state(),
        EntryLogState {
            last_purged: None,
            last: None
        }
    );
    let mut written = vec![LogEntry {
        id: EntryId { term: 1, index: 1 },
        payload: EntryPayload::Blank,
    }];
    written.push(LogEntry {
        id: EntryId { term: 1, index: 2 },
        payload: EntryPayload::Membership(b"members".to_vec()),
    });
    log.append(&written).expect("append");
    for batch in 0..10u64 {
        let more = entries(2, 3 + batch * 4, 7 + batch * 4);
        log.append(&more).expect("append");
        log.save_committed(EntryId {
            term: 2,
            index: 2 + (batch + 1) * 4,
        })
        .expect("commit");
        written.extend(more);
    }
    assert!(segments(dir.path()) > 3, "rolled");
    assert_eq!(log.read(1, 100).expect("read"), written);
    assert_eq!(
        ids(&log.read(5, 8).expect("read")),
        [(2, 5), (2, 6), (2, 7)]
    );
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert_eq!(log.read(0, u64::MAX).expect("read"), written);
    assert_eq!(log.state().last, Some(EntryId { term: 2, index: 42 }));
    assert_eq!(log.committed().map(|c| c.index), Some(42));
}

#[test]
fn entries_that_do_not_follow_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    log.append(&entries(3, 1, 3)).expect("append");
    for bad in [
        entries(3, 4, 5),                     // a gap
        entries(3, 2, 3),                     // a repeat
        entries(2, 3, 4),                     // a lower term
        vec![entry(3, 3, 1), entry(3, 5, 1)], // a gap inside the batch
    ] {
        assert!(
            matches!(log.append(&bad), Err(Error::InvalidArgument { .. })),
            "{:?}",
            ids(&bad)
        );
    }
    let garbage = LogEntry {
        id: EntryId { term: 3, index: 3 },
        payload: EntryPayload::Records(Proposal::from_bytes(vec![1, 0, 0, 0, 200, 0, 0, 0, 0])),
    };
    assert!(matches!(
        log.append(&[garbage]),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(log.state().last, Some(EntryId { term: 3, index: 2 }));
    log.append(&entries(4, 3, 4))
        .expect("the next entry still goes");
    assert_eq!(
        ids(&log.read(1, 10).expect("read")),
        [(3, 1), (3, 2), (4, 3)]
    );
}

#[test]
fn an_uncommitted_segment_is_never_sealed() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    for i in 1..40 {
        log.append(&entries(1, i, i + 1)).expect("append");
    }
    assert_eq!(
        segments(dir.path()),
        1,
        "nothing committed: the active segment grows"
    );
    log.save_committed(EntryId { term: 0, index: 39 })
        .expect("commit");
    log.append(&entries(1, 40, 41)).expect("append");
    assert_eq!(segments(dir.path()), 2, "rolled once all was committed");
}

#[test]
fn an_uncommitted_suffix_is_cut_in_the_active_segment_and_rewritten() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    log.append(&entries(1, 1, 11)).expect("append");
    log.save_committed(EntryId { term: 0, index: 10 })
        .expect("commit");
    log.append(&entries(1, 11, 21)).expect("append");
    let before = segments(dir.path());
    log.truncate_after(Some(15)).expect("truncate");
    assert_eq!(log.state().last, Some(EntryId { term: 1, index: 15 }));
    assert_eq!(segments(dir.path()), before);
    log.append(&entries(2, 16, 18))
        .expect("a new leader's entries");
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    let got = ids(&log.read(14, 100).expect("read"));
    assert_eq!(got, [(1, 14), (1, 15), (2, 16), (2, 17)]);
    // Committed entries are never cut.
    assert!(matches!(
        log.truncate_after(Some(5)),
        Err(Error::Internal(_))
    ));
    assert_eq!(log.state().last, Some(EntryId { term: 2, index: 17 }));
}

#[test]
fn a_suffix_starting_a_segment_goes_whole() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    log.append(&entries(1, 1, 21)).expect("append");
    log.save_committed(EntryId { term: 0, index: 20 })
        .expect("commit");
    // The segment is full and committed: the next batch starts a new one.
    log.append(&entries(1, 21, 25)).expect("append");
    let with_suffix = segments(dir.path());
    log.truncate_after(Some(20)).expect("truncate");
    assert_eq!(log.state().last, Some(EntryId { term: 1, index: 20 }));
    assert_eq!(segments(dir.path()), with_suffix, "the active one replaced");
    log.append(&entries(3, 21, 23)).expect("append");
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert_eq!(
        ids(&log.read(19, 100).expect("read")),
        [(1, 19), (1, 20), (3, 21), (3, 22)]
    );
}

#[test]
fn purging_keeps_the_segments_hides_the_entries_from_raft_and_is_remembered() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    for i in (1..60).step_by(3) {
        log.append(&entries(1, i, i + 3)).expect("append");
        log.save_committed(EntryId {
            term: 0,
            index: i + 2,
        })
        .expect("commit");
    }
    let before = segments(dir.path());
    let through = EntryId { term: 1, index: 30 };
    log.purge_through(through).expect("purge");
    // The segments are the snapshot (the engine's state is built from them): none goes.
    assert_eq!(segments(dir.path()), before, "no segment deleted");
    assert_eq!(
        log.read_placed(1, 2).expect("read placed").len(),
        1,
        "the engine still reads purged entries"
    );
    assert_eq!(log.state().last_purged, Some(through));
    assert_eq!(
        log.read(0, 32).expect("read").first().map(|e| e.id.index),
        Some(31)
    );
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert_eq!(log.state().last_purged, Some(through));
    assert_eq!(log.state().last, Some(EntryId { term: 1, index: 60 }));
    // Purging everything leaves the last purged entry as the last entry.
    log.purge_through(EntryId { term: 1, index: 60 })
        .expect("purge all");
    assert_eq!(log.state().last, Some(EntryId { term: 1, index: 60 }));
    assert!(log.read(0, 100).expect("read").is_empty());
}

#[test]
fn the_vote_is_durable_and_a_damaged_one_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    assert_eq!(log.read_vote().expect("vote"), None);
    log.save_vote(b"term 3, node 2").expect("save");
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert_eq!(
        log.read_vote().expect("vote"),
        Some(b"term 3, node 2".to_vec())
    );
    drop(log);
    let path = dir.path().join(VOTE_FILE);
    let mut b = std::fs::read(&path).expect("read");
    b[0] ^= 1;
    std::fs::write(&path, b).expect("write");
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert!(matches!(log.read_vote(), Err(Error::Corruption { .. })));
}

#[test]
fn the_cluster_identity_is_durable_and_a_damaged_one_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    assert_eq!(log.read_cluster().expect("cluster"), None);
    log.save_cluster(b"0123456789abcdef").expect("save");
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert_eq!(
        log.read_cluster().expect("cluster"),
        Some(b"0123456789abcdef".to_vec())
    );
    assert_eq!(log.read_vote().expect("vote"), None, "a file of its own");
    drop(log);
    let path = dir.path().join(CLUSTER_FILE);
    let mut b = std::fs::read(&path).expect("read");
    b[0] ^= 1;
    std::fs::write(&path, b).expect("write");
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert!(matches!(log.read_cluster(), Err(Error::Corruption { .. })));
}

#[test]
fn the_amnesiac_mark_survives_a_reopen_until_it_is_cleared() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    assert!(!log.amnesiac().expect("read"));
    log.mark_amnesiac(true).expect("mark");
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert!(log.amnesiac().expect("read"), "the mark outlives a restart");
    log.mark_amnesiac(false).expect("clear");
    log.mark_amnesiac(false).expect("clearing twice is fine");
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert!(!log.amnesiac().expect("read"));
}

#[test]
fn a_second_open_of_the_directory_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let _log = EntryLog::open(config(dir.path())).expect("open");
    assert!(matches!(
        EntryLog::open(config(dir.path())),
        Err(Error::Locked { .. })
    ));
}

#[test]
fn the_logs_own_record_kinds_are_not_proposals() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    for tag in [tag::BLANK, tag::MEMBERSHIP] {
        let body = if tag == tag::BLANK {
            Vec::new()
        } else {
            b"x".to_vec()
        };
        let e = LogEntry {
            id: EntryId { term: 1, index: 1 },
            payload: EntryPayload::Records(Proposal::from_raw(vec![(tag, body)])),
        };
        assert!(matches!(
            log.append(&[e]),
            Err(Error::InvalidArgument { .. })
        ));
    }
    assert_eq!(log.state().last, None);
}

#[test]
fn a_new_log_starts_at_its_first_entry() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    log.append(&entries(4, 7, 10)).expect("a first entry at 7");
    assert_eq!(log.state().last, Some(EntryId { term: 4, index: 9 }));
    assert_eq!(log.state().last_purged, None);
    assert_eq!(
        ids(&log.read(0, 100).expect("read")),
        [(4, 7), (4, 8), (4, 9)]
    );
    // Once it holds entries, they must follow.
    assert!(matches!(
        log.append(&entries(4, 20, 21)),
        Err(Error::InvalidArgument { .. })
    ));
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert_eq!(
        ids(&log.read(0, 100).expect("read")),
        [(4, 7), (4, 8), (4, 9)]
    );
}

/// A snapshot installed ahead of the log purges past its last entry: the log then goes on
/// after the purged entry.
#[test]
fn a_purge_past_the_end_restarts_the_log_after_it() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    log.append(&entries(1, 1, 30)).expect("append");
    log.save_committed(EntryId { term: 1, index: 29 })
        .expect("commit");
    log.append(&entries(1, 30, 31)).expect("append");
    let through = EntryId {
        term: 5,
        index: 100,
    };
    log.purge_through(through).expect("purge");
    assert_eq!(
        log.state(),
        EntryLogState {
            last_purged: Some(through),
            last: Some(through)
        }
    );
    assert_eq!(segments(dir.path()), 1);
    log.append(&entries(5, 101, 103))
        .expect("the log goes on after the purge");
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert_eq!(log.state().last_purged, Some(through));
    assert_eq!(ids(&log.read(0, 1000).expect("read")), [(5, 101), (5, 102)]);
}

mod snapshots;

/// The `COMMITTED` file as it is on disk now.
fn committed_on_disk(log: &EntryLog) -> Option<u64> {
    let inner = log.lock();
    match durable_file::read(inner.fs.as_ref(), &inner.dir, COMMITTED_FILE).expect("read") {
        Read::Body(b) => decode_entry_id(&b).map(|id| id.index),
        Read::Missing | Read::Damaged => None,
    }
}

#[test]
fn the_committed_file_never_runs_ahead_of_what_this_log_has_synced() {
    let dir = tempfile::tempdir().unwrap();
    let log = EntryLog::open(config(dir.path())).unwrap();
    log.append(&entries(1, 1, 3)).unwrap();
    log.save_committed(EntryId { term: 1, index: 2 }).unwrap();
    assert_eq!(committed_on_disk(&log), Some(2));
    // Written, learned committed, not yet synced: the file keeps the old value (a power
    // loss could take the entries and leave the file, which would refuse to open).
    log.write(&entries(1, 3, 6)).unwrap();
    log.save_committed(EntryId { term: 1, index: 5 }).unwrap();
    assert_eq!(log.committed(), Some(EntryId { term: 1, index: 5 }));
    assert_eq!(committed_on_disk(&log), Some(2));
    // The sync that makes it durable saves it: the file never lags behind either (a purge
    // of applied entries beyond it, then a restart, would replay from a point the log no
    // longer holds).
    assert_eq!(log.sync().unwrap(), 5);
    assert_eq!(committed_on_disk(&log), Some(5));
    log.write(&entries(1, 6, 7)).unwrap();
    log.save_committed(EntryId { term: 1, index: 6 }).unwrap();
    log.purge_through(EntryId { term: 1, index: 4 }).unwrap();
    assert_eq!(committed_on_disk(&log), Some(5));
    log.sync_through(6).unwrap();
    assert_eq!(committed_on_disk(&log), Some(6));
}

#[test]
fn a_sync_started_before_a_cut_does_not_vouch_for_what_was_written_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = EntryLog::open(config(dir.path())).unwrap();
    log.append(&entries(1, 1, 2)).unwrap();
    log.write(&entries(1, 2, 4)).unwrap();
    // A sync takes its point, then (before it reports) the suffix is cut and rewritten.
    let point = log.lock().writer.sync_point().expect("unsynced bytes");
    log.truncate_after(Some(1)).unwrap();
    assert_eq!(log.lock().durable, 1, "the cut removed entries 2 and 3");
    log.write(&entries(2, 2, 4)).unwrap();
    point.sync().unwrap();
    let mut inner = log.lock();
    assert!(
        !inner.writer.synced_outside(&point),
        "the log was cut since"
    );
    assert!(inner.writer.has_unsynced());
    drop(inner);
    assert_eq!(log.lock().durable, 1);
    assert_eq!(log.sync().unwrap(), 3);
    log.sync_through(3).unwrap();
}

#[test]
fn written_entries_are_readable_before_the_sync_and_a_roll_makes_them_durable() {
    let dir = tempfile::tempdir().unwrap();
    let log = EntryLog::open(config(dir.path())).unwrap();
    log.write(&entries(1, 1, 4)).unwrap();
    assert_eq!(ids(&log.read(1, 4).unwrap()), vec![(1, 1), (1, 2), (1, 3)]);
    assert_eq!(log.lock().durable, 0);
    // Fill past the segment size with everything committed: the next write rolls, and
    // sealing synced what came before it.
    log.write(&entries(1, 4, 12)).unwrap();
    log.save_committed(EntryId { term: 1, index: 11 }).unwrap();
    log.write(&entries(1, 12, 13)).unwrap();
    assert!(segments(dir.path()) >= 2);
    assert_eq!(log.lock().durable, 11);
    assert_eq!(log.sync().unwrap(), 12);
}

/// What the log answers from its tail in memory is what it answers from its segments: the
/// same entries and the same placed frames, after appends, a cut suffix, a purge, and
/// across segments.
#[test]
fn the_tail_in_memory_answers_as_the_segments_do() {
    let dir = tempfile::tempdir().expect("dir");
    let log = EntryLog::open(config(dir.path())).expect("open");
    log.write(&entries(1, 1, 20)).expect("write");
    log.sync().expect("sync");
    log.save_committed(EntryId { term: 1, index: 12 })
        .expect("commit");
    log.write(&entries(1, 20, 30)).expect("write");
    // A cut suffix, replaced in a later term.
    log.truncate_after(Some(25)).expect("cut");
    log.write(&entries(2, 26, 34)).expect("write");
    log.sync().expect("sync");
    log.purge_through(EntryId { term: 1, index: 3 })
        .expect("purge");
    let cached_placed = log.read_placed(4, 34).expect("placed");
    let cached = log.read(1, 40).expect("read");
    assert_eq!(
        log.read_cached(30, 40).map(|v| ids(&v)),
        Some(ids(&cached[26..]))
    );
    drop(log);
    let log = EntryLog::open(config(dir.path())).expect("reopen");
    assert!(
        log.read_cached(30, 40).is_none(),
        "a reopened log holds no tail"
    );
    assert_eq!(log.read(1, 40).expect("read"), cached);
    assert_eq!(ids(&cached).first(), Some(&(1, 4)));
    assert_eq!(ids(&cached).last(), Some(&(2, 33)));
    assert_eq!(log.read_placed(4, 34).expect("placed"), cached_placed);
}
