//! Snapshots: taken as the files up to an entry, installed on another log atomically
//! (a crash after any step leaves the old log or the new one), the log continuing at the
//! LSN the snapshot carries.

use std::io::{Read as _, Write as _};

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
                frames
                    .into_iter()
                    .map(|f| (f.lsn, f.tag, f.body.to_vec()))
                    .collect(),
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
    assert!(!b.path().join(snapshot::INSTALL_FILE).exists());
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
        assert!(std::fs::read_dir(b.path()).expect("list").all(|e| !e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .ends_with(".staged")));
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

/// [`receive`], failing instead of panicking (a power cut in the middle).
#[cfg(feature = "testing")]
fn try_receive(to: &EntryLog, snap: LogSnapshot) -> Result<SnapshotStaging> {
    let staging = to.begin_install(snap.manifest.clone())?;
    for (i, mut file) in snap.files.into_iter().enumerate() {
        let mut out = staging.create(i)?;
        std::io::copy(&mut file, &mut out).map_err(|e| Error::Internal(e.to_string()))?;
    }
    staging.finish()?;
    Ok(staging)
}

/// A power cut at every file-system step of a receive and an install (unsynced bytes torn
/// as a prefix or by sectors): the reopened log is the old one, whole, or exactly the
/// snapshot's, continuing at its LSN; either way it takes writes again.
#[cfg(feature = "testing")]
#[test]
fn a_power_loss_at_every_step_of_a_receive_and_install_leaves_the_old_log_or_the_new_one() {
    use std::sync::Arc;

    use crate::fs::{Fault, FaultyFs, Tear};

    let through = EntryId { term: 1, index: 25 };
    let (_a, leader, _b, _f) = logs();
    let next_lsn = leader
        .snapshot(through)
        .expect("snapshot")
        .manifest
        .next_lsn;
    let old = entries(1, 1, 6);
    let (mut olds, mut news) = (0, 0);
    for step in 1..10_000u64 {
        for tear in [Tear::Prefix, Tear::Sectors] {
            let fs = FaultyFs::new(step);
            fs.set_tear(tear);
            let dir = tempfile::tempdir().expect("dir");
            let follower =
                EntryLog::open_with_fs(config(dir.path()), Arc::new(fs.clone())).expect("open");
            follower.append(&old).expect("append");
            let before = fs.ops();
            fs.inject(step, Fault::CrashDuringOp);
            let installed = leader
                .snapshot(through)
                .and_then(|snap| try_receive(&follower, snap))
                .and_then(|staging| follower.install_snapshot(staging))
                .is_ok();
            drop(follower);
            if installed && fs.ops() < before + step {
                eprintln!(
                    "power lost at {} steps: {olds} old logs, {news} new",
                    olds + news
                );
                assert!(olds > 5 && news > 5, "{olds} old, {news} new");
                return;
            }
            fs.crash(true);
            fs.revive();
            let log = EntryLog::open_with_fs(config(dir.path()), Arc::new(fs.clone()))
                .unwrap_or_else(|e| panic!("step {step} ({tear:?}): reopen: {e}"));
            let state = log.state();
            if state.last_purged == Some(through) {
                news += 1;
                assert_eq!(state.last, Some(through), "step {step}");
                assert_eq!(log.next_lsn(), next_lsn, "step {step}");
                assert!(
                    log.read_placed(1, 26).expect("new") == leader.read_placed(1, 26).expect("l"),
                    "step {step} ({tear:?}): the snapshot's entries"
                );
                log.append(&entries(1, 26, 27)).expect("append after");
                assert!(
                    placed(&log, 26, 27) == placed(&leader, 26, 27),
                    "step {step}"
                );
            } else {
                olds += 1;
                assert_eq!(state.last_purged, None, "step {step}");
                assert_eq!(log.read(1, 6).expect("old"), old, "step {step} ({tear:?})");
                log.append(&entries(1, 6, 7)).expect("append after");
            }
        }
    }
    panic!("the install did not finish within the steps tried");
}

#[test]
fn a_manifest_carries_its_refusals_and_reads_the_first_version() {
    let (_a, leader, _b, _f) = logs();
    let mut manifest = leader
        .snapshot(EntryId { term: 1, index: 25 })
        .expect("snapshot")
        .manifest;
    let v1 = manifest.encode();
    assert_eq!(&v1[..8], b"CLSNAPM1");
    manifest.refused = Some(vec![EntryId { term: 1, index: 3 }]);
    manifest.membership = Some((EntryId { term: 1, index: 1 }, b"members".to_vec()));
    let v2 = manifest.encode();
    assert_eq!(&v2[..8], b"CLSNAPM2");
    assert_eq!(SnapshotManifest::decode(&v2), Some(manifest.clone()));
    manifest.refused = None;
    manifest.membership = None;
    assert_eq!(SnapshotManifest::decode(&v1), Some(manifest));
    assert_eq!(SnapshotManifest::decode(&v2[..v2.len() - 1]), None);
}
