//! Snapshots: taken as the files up to an entry, installed on another log atomically
//! (a crash after any step leaves the old log or the new one), the log continuing at the
//! LSN the snapshot carries.

use std::io::{Read as _, Seek as _, Write as _};

use super::*;
use crate::entry_log::snapshot::InstallStep;

/// A leader's log: entries 1..=40 committed (several sealed segments and an active one),
/// and its follower's: 5 entries of its own, uncommitted.
fn logs() -> (tempfile::TempDir, EntryLog, tempfile::TempDir, EntryLog) {
    let (a, b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let leader = EntryLog::open(config(a.path())).expect("open");
    for i in (1..40).step_by(3) {
        leader.append(&entries(1, i, i + 3)).expect("append");
        leader
            .save_committed(EntryId {
                term: 1,
                index: i + 2,
            })
            .expect("commit");
    }
    let follower = EntryLog::open(config(b.path())).expect("open");
    follower.append(&entries(1, 1, 6)).expect("append");
    (a, leader, b, follower)
}

/// Sends `snap` the way the transport does: each file's first `len` bytes, in bounded
/// reads, into a staging directory of `to`.
fn receive(to: &EntryLog, snap: LogSnapshot) -> SnapshotStaging {
    let staging = to.begin_install(snap.manifest.clone()).expect("begin");
    for (i, (mut file, (_, len))) in snap.files.into_iter().zip(&snap.manifest.files).enumerate() {
        file.rewind().expect("rewind");
        let mut out = staging.create(i).expect("create");
        let mut left = *len;
        let mut buf = [0u8; 1000];
        while left > 0 {
            let n = usize::try_from(left.min(1000)).expect("small");
            file.read_exact(&mut buf[..n]).expect("read");
            out.write_all(&buf[..n]).expect("write");
            left -= n as u64;
        }
    }
    staging.finish().expect("finish");
    staging
}

/// An entry's id and its frames' (LSN, record type, body).
type Placed = (EntryId, Vec<(u64, u8, Vec<u8>)>);

/// Entries `from..to` as (index, term, [(LSN, record type, body)]): what must be the same
/// on every replica (positions after a snapshot may differ: another segment split).
fn placed(log: &EntryLog, from: u64, to: u64) -> Vec<Placed> {
    log.read_placed(from, to)
        .expect("read placed")
        .into_iter()
        .map(|(id, frames)| {
            (
                id,
                frames.into_iter().map(|f| (f.lsn, f.tag, f.body)).collect(),
            )
        })
        .collect()
}

#[test]
fn a_snapshot_is_the_files_up_to_an_entry_and_carries_the_next_lsn() {
    let (_a, leader, _b, _f) = logs();
    let through = EntryId { term: 1, index: 25 };
    let snap = leader.snapshot(through).expect("snapshot");
    assert_eq!(snap.manifest.last, through);
    assert!(snap.manifest.files.len() > 1, "{:?}", snap.manifest.files);
    // Every entry has two records: entry 26's first record has LSN 51.
    assert_eq!(snap.manifest.next_lsn, 51);
    assert_eq!(
        SnapshotManifest::decode(&snap.manifest.encode()),
        Some(snap.manifest.clone())
    );
    // A name that is a path is refused.
    let mut bad = snap.manifest.clone();
    bad.files[0].0 = "../x.seg".into();
    assert_eq!(SnapshotManifest::decode(&bad.encode()), None);
    assert!(leader.snapshot(EntryId { term: 1, index: 41 }).is_err());
    assert!(leader.holds(through).expect("holds"));
    assert!(!leader.holds(EntryId { term: 2, index: 25 }).expect("holds"));
    assert!(!leader.holds(EntryId { term: 1, index: 41 }).expect("holds"));
}

#[test]
fn an_installed_snapshot_replaces_the_log_and_it_goes_on_at_the_carried_lsn() {
    let (_a, leader, b, follower) = logs();
    let through = EntryId { term: 1, index: 25 };
    let snap = leader.snapshot(through).expect("snapshot");
    let next_lsn = snap.manifest.next_lsn;
    let staging = receive(&follower, snap);
    follower.install_snapshot(staging).expect("install");
    assert_eq!(
        follower.state(),
        EntryLogState {
            last_purged: Some(through),
            last: Some(through),
        }
    );
    assert_eq!(follower.next_lsn(), next_lsn);
    assert_eq!(follower.committed(), Some(through));
    // The engine reads every entry of the snapshot; Raft none of them.
    assert!(
        follower.read_placed(1, 26).expect("follower")
            == leader.read_placed(1, 26).expect("leader")
    );
    assert!(follower.read(0, 26).expect("read").is_empty());
    // The leader's next entries land at the same LSNs on both.
    follower.append(&entries(1, 26, 30)).expect("append after");
    assert!(placed(&follower, 26, 30) == placed(&leader, 26, 30));
    drop(follower);
    let follower = EntryLog::open(config(b.path())).expect("reopen");
    assert_eq!(follower.state().last, Some(EntryId { term: 1, index: 29 }));
    assert!(placed(&follower, 1, 30) == placed(&leader, 1, 30));
    assert!(!b.path().join(snapshot::INSTALL_DIR).exists());
}

/// A crash after each step of an install: the reopened log is the old one (before the
/// commit point) or exactly the new one (from it on), never a mix.
#[test]
fn a_crash_at_any_step_of_an_install_leaves_the_old_log_or_the_new_one() {
    let through = EntryId { term: 1, index: 25 };
    // A receive that never finished: the old log.
    {
        let (_a, leader, b, follower) = logs();
        let snap = leader.snapshot(through).expect("snapshot");
        let staging = follower
            .begin_install(snap.manifest.clone())
            .expect("begin");
        staging.create(0).expect("create");
        drop(follower);
        let follower = EntryLog::open(config(b.path())).expect("reopen");
        assert_eq!(follower.state().last, Some(EntryId { term: 1, index: 5 }));
        assert!(!b.path().join(snapshot::STAGING_DIR).exists());
    }
    for stop in [
        InstallStep::Committed,
        InstallStep::OldRemoved,
        InstallStep::OneMoved,
        InstallStep::Moved,
    ] {
        let (_a, leader, b, follower) = logs();
        let snap = leader.snapshot(through).expect("snapshot");
        let next_lsn = snap.manifest.next_lsn;
        let staging = receive(&follower, snap);
        follower.install_until(staging, stop).expect("install");
        drop(follower);
        let follower = EntryLog::open(config(b.path())).expect("reopen");
        assert_eq!(
            follower.state(),
            EntryLogState {
                last_purged: Some(through),
                last: Some(through),
            },
            "{stop:?}"
        );
        assert_eq!(follower.next_lsn(), next_lsn, "{stop:?}");
        assert!(
            follower.read_placed(1, 26).expect("follower")
                == leader.read_placed(1, 26).expect("leader"),
            "{stop:?}"
        );
        follower.append(&entries(1, 26, 28)).expect("append after");
        assert!(
            placed(&follower, 26, 28) == placed(&leader, 26, 28),
            "{stop:?}"
        );
    }
}

#[test]
fn a_staged_file_of_the_wrong_length_is_refused_and_changes_nothing() {
    let (_a, leader, _b, follower) = logs();
    let snap = leader
        .snapshot(EntryId { term: 1, index: 25 })
        .expect("snapshot");
    let staging = follower
        .begin_install(snap.manifest.clone())
        .expect("begin");
    for i in 0..snap.manifest.files.len() {
        staging
            .create(i)
            .expect("create")
            .write_all(b"short")
            .expect("write");
    }
    assert!(staging.finish().is_err());
    assert!(follower.install_snapshot(staging).is_err());
    assert_eq!(follower.state().last, Some(EntryId { term: 1, index: 5 }));
}
