//! The replicated log's storage half ([`EntryLog`]) under power loss: a crash at every
//! file-system step of appends, truncations, purges and vote saves, on the fault-injecting
//! file system, tearing the unsynced bytes. After each crash the log reopens, holds every
//! entry whose append returned (byte-identical, at its index), holds no hole, and the vote
//! is the old one or the new one, never lost or damaged.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use cursorlog_engine::{
    EntryId, EntryLog, EntryLogConfig, EntryPayload, Fault, FaultyFs, LogEntry, Proposal,
    ProposedRecord, Tear,
};

/// A one-record entry: a SessionState record (tag 12) of session "s" whose state is `len`
/// bytes (FORMAT.md: session String, state Vec<u8>, at_ms u64; little-endian u64 lengths).
fn entry(term: u64, index: u64, len: usize) -> LogEntry {
    let mut body = 1u64.to_le_bytes().to_vec();
    body.push(b's');
    body.extend_from_slice(&(len as u64).to_le_bytes());
    body.extend(std::iter::repeat_n((index % 251) as u8, len));
    body.extend_from_slice(&index.to_le_bytes());
    LogEntry {
        id: EntryId { term, index },
        payload: EntryPayload::Records(Proposal::from_records(&[ProposedRecord { tag: 12, body }])),
    }
}

fn config(dir: &std::path::Path) -> EntryLogConfig {
    let mut c = EntryLogConfig::new(dir);
    c.segment_bytes_max = 4096;
    c
}

/// What the script below did before the crash: the entries whose append returned, the
/// last vote saved, the truncation and purge that returned.
#[derive(Debug, Default)]
struct Acked {
    entries: Vec<LogEntry>,
    vote: Option<Vec<u8>>,
    /// Entries after this index may legitimately be gone (a truncation that returned, or
    /// one in progress when the crash came).
    cut_after: Option<u64>,
}

/// Appends, commits, truncates an uncommitted suffix, rewrites it in a new term, saves
/// votes and purges: every kind of write the store makes. Stops at the first error (the
/// injected crash).
fn script(log: &EntryLog, acked: &mut Acked) -> cursorlog_engine::Result<()> {
    let mut index = 1;
    for round in 0..6u64 {
        let batch: Vec<LogEntry> = (0..3).map(|i| entry(1, index + i, 700)).collect();
        // A truncation in progress may leave the old suffix or cut it: note it first.
        log.append(&batch)?;
        acked.entries.extend(batch);
        index += 3;
        if round % 2 == 0 {
            log.save_committed(EntryId {
                term: 1,
                index: index - 2,
            })?;
        }
        let vote = format!("vote {round}").into_bytes();
        log.save_vote(&vote)?;
        acked.vote = Some(vote);
    }
    // A deposed leader's suffix: cut the last uncommitted entries, rewrite them in term 2.
    let keep = log.committed().map_or(0, |c| c.index);
    acked.cut_after = Some(keep);
    log.truncate_after(Some(keep))?;
    acked.entries.retain(|e| e.id.index <= keep);
    let rewritten: Vec<LogEntry> = (keep + 1..keep + 4).map(|i| entry(2, i, 300)).collect();
    log.append(&rewritten)?;
    acked.entries.extend(rewritten);
    acked.cut_after = None;
    log.save_committed(EntryId {
        term: 2,
        index: keep + 3,
    })?;
    log.purge_through(EntryId {
        term: 1,
        index: keep / 2,
    })?;
    Ok(())
}

fn check(log: &EntryLog, acked: &Acked, step: u64) {
    let state = log.state();
    let purged = state.last_purged.map_or(0, |p| p.index);
    let got = log
        .read(0, u64::MAX)
        .unwrap_or_else(|e| panic!("step {step}: read: {e}"));
    // No hole: consecutive from the first held entry.
    for pair in got.windows(2) {
        assert_eq!(
            pair[1].id.index,
            pair[0].id.index + 1,
            "step {step}: a hole"
        );
        assert!(
            pair[1].id.term >= pair[0].id.term,
            "step {step}: term went down"
        );
    }
    for want in &acked.entries {
        if want.id.index <= purged {
            continue;
        }
        if acked.cut_after.is_some_and(|k| want.id.index > k) {
            continue;
        }
        let found = got.iter().find(|e| e.id.index == want.id.index);
        assert_eq!(
            found,
            Some(want),
            "step {step}: acknowledged entry {:?}",
            want.id
        );
    }
    let vote = log
        .read_vote()
        .unwrap_or_else(|e| panic!("step {step}: vote: {e}"));
    if let Some(v) = &acked.vote {
        // The vote saved last, or (crash during the next save) possibly the next one.
        let v = String::from_utf8(v.clone()).unwrap();
        let got = vote.map(|b| String::from_utf8(b).unwrap());
        let n: u64 = v.trim_start_matches("vote ").parse().unwrap();
        assert!(
            got == Some(v.clone()) || got == Some(format!("vote {}", n + 1)),
            "step {step}: vote {got:?}, saved {v}"
        );
    }
}

/// The store's way under Raft: entries written, learned committed (a member may learn it
/// before its own copy is synced), then synced by one `sync` for the batch; a deposed
/// leader's written suffix cut and rewritten. An entry counts as acknowledged once a sync
/// that returned covers it.
fn script_deferred_sync(log: &EntryLog, acked: &mut Acked) -> cursorlog_engine::Result<()> {
    let mut index = 1;
    for _ in 0..6u64 {
        let batch: Vec<LogEntry> = (0..3).map(|i| entry(1, index + i, 700)).collect();
        log.write(&batch)?;
        log.save_committed(EntryId {
            term: 1,
            index: index + 2,
        })?;
        let durable = log.sync()?;
        assert_eq!(
            durable,
            index + 2,
            "a sync covers every entry written before it"
        );
        acked.entries.extend(batch);
        index += 3;
    }
    let keep = index - 1;
    log.write(
        &(index..index + 3)
            .map(|i| entry(1, i, 500))
            .collect::<Vec<_>>(),
    )?;
    acked.cut_after = Some(keep);
    log.truncate_after(Some(keep))?;
    let rewritten: Vec<LogEntry> = (index..index + 3).map(|i| entry(2, i, 300)).collect();
    log.write(&rewritten)?;
    log.sync()?;
    acked.entries.extend(rewritten);
    acked.cut_after = None;
    Ok(())
}

#[test]
fn a_power_loss_at_every_step_loses_no_acknowledged_entry() {
    power_loss_at_every_step(script);
}

#[test]
fn a_power_loss_at_every_step_of_deferred_syncs_loses_nothing_synced_and_reopens() {
    power_loss_at_every_step(script_deferred_sync);
}

fn power_loss_at_every_step(script: fn(&EntryLog, &mut Acked) -> cursorlog_engine::Result<()>) {
    let mut crashes = 0;
    for step in 1..10_000u64 {
        for tear in [Tear::Prefix, Tear::Sectors] {
            let fs = FaultyFs::new(step);
            fs.set_tear(tear);
            let dir = tempfile::tempdir().unwrap();
            let before = fs.ops();
            let log = EntryLog::open_with_fs(config(dir.path()), Arc::new(fs.clone())).unwrap();
            fs.inject(
                step.saturating_sub(fs.ops() - before).max(1),
                Fault::CrashDuringOp,
            );
            let mut acked = Acked::default();
            let finished = script(&log, &mut acked).is_ok();
            drop(log);
            if finished && fs.ops() < before + step {
                eprintln!("power lost at {crashes} steps");
                assert!(crashes > 50, "crashed at many steps: {crashes}");
                return;
            }
            crashes += 1;
            fs.crash(true);
            fs.revive();
            let log = EntryLog::open_with_fs(config(dir.path()), Arc::new(fs.clone()))
                .unwrap_or_else(|e| panic!("step {step} ({tear:?}): reopen: {e}"));
            check(&log, &acked, step);
            // And it takes writes again where it stands.
            let next = log.state().last.map_or(1, |l| l.index + 1);
            let term = log.state().last.map_or(1, |l| l.term);
            log.append(&[entry(term, next, 10)])
                .unwrap_or_else(|e| panic!("step {step}: append after the crash: {e}"));
        }
    }
    panic!("the script did not finish within the steps tried");
}

/// A purge past the last entry (a snapshot installed ahead of the log), appends after it, a
/// truncation of everything after the purged entry, and a rewrite: a crash at each step.
/// After each crash the log reopens, takes the next append at `last + 1`, and gives the
/// entries after the purge the LSNs they had (the one after the purge is the one recorded).
#[test]
fn a_power_loss_during_a_purge_past_the_end_or_a_truncation_after_it_heals_at_open() {
    let through = EntryId { term: 1, index: 10 };
    for (crashes, step) in (1..10_000u64).enumerate() {
        let fs = FaultyFs::new(step);
        fs.set_tear(Tear::Sectors);
        let dir = tempfile::tempdir().unwrap();
        let log = EntryLog::open_with_fs(config(dir.path()), Arc::new(fs.clone())).unwrap();
        log.append(&(1..4).map(|i| entry(1, i, 50)).collect::<Vec<_>>())
            .unwrap();
        log.save_committed(EntryId { term: 1, index: 3 }).unwrap();
        assert_eq!(log.next_lsn(), 4);
        let before = fs.ops();
        fs.inject(step, Fault::CrashDuringOp);
        let finished = (|| {
            log.purge_through(through)?;
            log.append(&[entry(1, 11, 50), entry(1, 12, 50)])?;
            log.truncate_after(Some(10))?;
            log.append(&[entry(2, 11, 50)])
        })()
        .is_ok();
        drop(log);
        if finished && fs.ops() < before + step {
            eprintln!("power lost at {crashes} steps");
            assert!(crashes > 10, "crashed at many steps: {crashes}");
            return;
        }
        fs.crash(true);
        fs.revive();
        let log = EntryLog::open_with_fs(config(dir.path()), Arc::new(fs.clone()))
            .unwrap_or_else(|e| panic!("step {step}: reopen: {e}"));
        let state = log.state();
        let last = state.last.unwrap_or_else(|| panic!("step {step}: empty"));
        match state.last_purged {
            None => {
                // The purge never became durable: the log is as it was.
                assert_eq!((last.index, log.next_lsn()), (3, 4), "step {step}");
            }
            Some(p) => {
                assert_eq!(p, through, "step {step}");
                assert!(last.index >= 10, "step {step}: {last:?}");
                // One record per entry after the purge, from the recorded LSN on.
                assert_eq!(log.next_lsn(), 4 + (last.index - 10), "step {step}");
                let held = log.read(0, u64::MAX).unwrap();
                assert_eq!(held.len() as u64, last.index - 10, "step {step}");
            }
        }
        log.append(&[entry(last.term.max(2), last.index + 1, 10)])
            .unwrap_or_else(|e| panic!("step {step}: append after the crash: {e}"));
    }
    panic!("the script did not finish within the steps tried");
}

/// A first append that is refused leaves an empty log empty (it may still start anywhere).
#[test]
fn a_refused_first_append_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = EntryLog::open(config(dir.path())).unwrap();
    assert!(log.append(&[entry(1, 5, 10), entry(1, 7, 10)]).is_err());
    assert_eq!(log.state().last, None);
    drop(log);
    let log = EntryLog::open(config(dir.path())).unwrap();
    assert_eq!(log.state().last, None);
    log.append(&[entry(1, 1, 10)]).unwrap();
    assert_eq!(log.state().last, Some(EntryId { term: 1, index: 1 }));
}

/// Commits saved in place (unsynced, as on every commit), then a purge: a power loss at every
/// step never leaves `COMMITTED` below `PURGED` at the next open (issue 30 item 5, review R7:
/// such a member refused to start, "purged beyond the snapshot"), and the log reopens and
/// takes the next entry.
#[test]
fn a_power_loss_around_a_purge_never_leaves_committed_below_purged() {
    let through = EntryId { term: 1, index: 12 };
    for (crashes, step) in (1..10_000u64).enumerate() {
        let fs = FaultyFs::new(step);
        fs.set_tear(Tear::Sectors);
        let dir = tempfile::tempdir().unwrap();
        let log = EntryLog::open_with_fs(config(dir.path()), Arc::new(fs.clone())).unwrap();
        let before = fs.ops();
        fs.inject(step, Fault::CrashDuringOp);
        let finished = (|| {
            for index in 1..=15 {
                log.append(&[entry(1, index, 700)])?;
                log.save_committed(EntryId { term: 1, index })?;
            }
            log.purge_through(through)?;
            log.append(&[entry(1, 16, 50)])?;
            log.save_committed(EntryId { term: 1, index: 16 })
        })()
        .is_ok();
        drop(log);
        if finished && fs.ops() < before + step {
            eprintln!("power lost at {crashes} steps");
            assert!(crashes > 30, "crashed at many steps: {crashes}");
            return;
        }
        fs.crash(true);
        fs.revive();
        let log = EntryLog::open_with_fs(config(dir.path()), Arc::new(fs.clone()))
            .unwrap_or_else(|e| panic!("step {step}: reopen: {e}"));
        let state = log.state();
        if let Some(purged) = state.last_purged {
            let committed = log.committed().map(|c| c.index);
            assert!(
                committed >= Some(purged.index),
                "step {step}: committed {committed:?} below purged {}",
                purged.index
            );
        }
        let last = state.last.map_or(0, |l| l.index);
        log.append(&[entry(1, last + 1, 10)])
            .unwrap_or_else(|e| panic!("step {step}: append after the crash: {e}"));
    }
    panic!("the script did not finish within the steps tried");
}
