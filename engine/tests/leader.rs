//! The leader side of apply after commit (issue 19 item 2): a replicated node's writer plans
//! as a single node does, proposes a batch's groups as entries (merged: see
//! `leader_batching.rs`), and answers from how each entry settled. Here the "cluster" is a
//! one-node proposer (`local_cluster`) that appends to the node's own `EntryLog`, commits and
//! applies, so every test runs the real planner, proposal encoding, entry log and apply
//! rules, without openraft (the replication crate's tests add it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod local_cluster;

use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

use common::history::{describe, history};
use common::*;
use cursorlog_engine::{
    CorruptionKind, Engine, EntryLog, EntryLogConfig, Error, ManualClock, OpenStream, Proposed,
};
use local_cluster::*;

#[test]
fn a_leader_proposing_its_writes_serves_what_a_single_node_serves() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let single = tempfile::tempdir().unwrap();
    let expected = {
        let e = Engine::open(config_at(single.path(), &clock)).unwrap();
        history(&e);
        describe(&e)
    };
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster) = open_leader(dir.path(), &clock);
    history(&leader);
    assert_eq!(describe(&leader), expected);
    let entries = cluster.log.state().last.unwrap().index;
    assert!(
        entries > 15,
        "one entry per batch, one request each: {entries}"
    );
    close(leader, &cluster);
    drop(cluster);

    // What the leader's entries hold is the whole state: a replica rebuilt from them (at a
    // restart) serves the same.
    let log = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap();
    let replica = Engine::open_replica(config_at(dir.path(), &clock), &log).unwrap();
    assert_eq!(describe(&replica), expected);
}

#[test]
fn an_entry_landing_at_another_lsn_than_planned_is_refused_and_its_retry_succeeds() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster) = open_leader(dir.path(), &clock);
    leader.open_session("s").unwrap();
    let before = describe(&leader);
    // A blank entry takes the LSN the planner gave the new stream: the stream id would not
    // be its LSN, so apply refuses the entry on every replica, and the caller is told to
    // retry (not handed a stream id that does not exist).
    cluster.blank_first.store(true, Ordering::Release);
    let err = leader.open_stream(stream_in("s")).unwrap_err();
    assert!(matches!(err, Error::NotConfirmed(_)), "{err:?}");
    assert!(err.to_string().contains("retry"), "{err}");
    assert_eq!(
        describe(&leader),
        before,
        "the refused entry changed nothing"
    );
    let opened = leader.open_stream(stream_in("s")).unwrap();
    append_range(&leader, "s", opened.stream, 1, 3);
    let streams = leader.streams().unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].id, opened.stream);
    assert_eq!(streams[0].head, 3);
    close(leader, &cluster);
}

#[test]
fn a_node_that_is_not_the_leader_answers_with_the_leaders_address_and_writes_nothing() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let (node, cluster) = open_leader(dir.path(), &clock);
    node.open_session("s").unwrap();
    let entries = cluster.log.state().last;
    *cluster.follower_of.lock().unwrap() = Some("10.0.0.2:7000".into());
    match node.open_session("t") {
        Err(Error::NotLeader { leader }) => assert_eq!(leader.as_deref(), Some("10.0.0.2:7000")),
        other => panic!("{other:?}"),
    }
    let err = node.open_session("t").unwrap_err();
    assert!(err.to_string().contains("10.0.0.2:7000"), "{err}");
    assert_eq!(cluster.log.state().last, entries, "nothing was proposed");
    // Reads are served from what was applied.
    assert!(node.session("s").unwrap().is_some());
    close(node, &cluster);
}

#[test]
fn the_leader_expires_a_lapsed_producer_lease_through_a_proposal() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster) = open_leader(dir.path(), &clock);
    leader.open_session("s").unwrap();
    let opened = leader
        .open_stream(OpenStream {
            lease_ms: Some(1_000),
            ..stream_in("s")
        })
        .unwrap();
    let mut follower = leader.follow("s", opened.stream, 0).unwrap();
    assert_eq!(follower.poll(100).unwrap().map(|v| v.len()), Some(0));
    let entries = cluster.log.state().last.unwrap().index;
    clock.advance(std::time::Duration::from_secs(5));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(std::time::Duration::from_secs(60), follower.changed())
            .await
            .expect("the expiry is applied and wakes the follower")
            .unwrap();
    });
    let stream = leader
        .streams()
        .unwrap()
        .into_iter()
        .find(|s| s.id == opened.stream)
        .unwrap();
    assert_eq!(
        stream.state,
        cursorlog_engine::StreamState::Aborted,
        "{stream:?}"
    );
    assert!(
        cluster.log.state().last.unwrap().index > entries,
        "the expiry was proposed as an entry"
    );
    close(leader, &cluster);
}

#[test]
fn a_cluster_members_directory_is_refused_by_a_single_node_open_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    {
        let (leader, cluster) = open_leader(dir.path(), &clock);
        cluster.log.save_vote(b"a vote").unwrap();
        leader.open_session("s").unwrap();
        close(leader, &cluster);
    }
    let before: Vec<_> = segment_files(dir.path())
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    let err = Engine::open(config_at(dir.path(), &clock)).unwrap_err();
    assert!(matches!(err, Error::UnsupportedFormat { .. }), "{err:?}");
    assert!(err.to_string().contains("--node-id"), "{err}");
    let after: Vec<_> = segment_files(dir.path())
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(before, after, "the refused open wrote nothing");
}

#[test]
fn a_retry_planned_beside_the_append_it_repeats_is_not_acknowledged_when_that_append_fails() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster) = open_leader(dir.path(), &clock);
    let (_, stream) = new_stream(&leader, "s", None);
    let append = cursorlog_engine::Append {
        session: "s".into(),
        stream,
        expected_next_seq: Some(1),
        events: vec![cursorlog_engine::NewEvent::new("k", b"x".to_vec())],
    };
    // The first attempt's batch is held in flight; two resends of it queue meanwhile, and
    // both go into the next batch: the first is planned as the append, the second as a
    // duplicate of it (no entry of its own). Neither batch commits.
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    *cluster.hold.lock().unwrap() = Some((entered_tx, release_rx));
    cluster.unknown_batches.store(2, Ordering::Release);
    let first = {
        let (leader, append) = (leader.clone(), append.clone());
        std::thread::spawn(move || leader.append(append))
    };
    entered.recv().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let resends = rt.block_on(async {
        let spawn = || {
            let (leader, append) = (leader.clone(), append.clone());
            tokio::spawn(async move { leader.append_async(append).await })
        };
        let resends = [spawn(), spawn()];
        // Each resend runs to its first wait: it is queued behind the held batch.
        tokio::task::yield_now().await;
        release.send(()).unwrap();
        let mut out = Vec::new();
        for r in resends {
            out.push(r.await.unwrap());
        }
        out
    });
    assert!(matches!(first.join().unwrap(), Err(Error::NotConfirmed(_))));
    for r in &resends {
        assert!(
            matches!(r, Err(Error::NotConfirmed(_))),
            "a resend was answered from an append that never committed: {resends:?}"
        );
    }
    let head = leader.streams().unwrap()[0].head;
    assert_eq!(head, 0, "nothing was appended");
    close(leader, &cluster);
}

#[test]
fn a_log_that_lost_its_tail_past_the_committed_entry_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    {
        let (leader, cluster) = open_leader(dir.path(), &clock);
        for s in ["a", "b", "c"] {
            leader.open_session(s).unwrap();
        }
        assert_eq!(cluster.log.committed(), cluster.log.state().last);
        close(leader, &cluster);
    }
    // The disk loses the last few bytes of synced, committed data.
    let last = last_segment(dir.path());
    truncate(&last, file_len(&last) - 10);
    // A member that lost committed entries must not vote with its log: it does not start.
    let err = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap_err();
    match &err {
        Error::Corruption {
            kind: CorruptionKind::LostCommitted { committed, last },
            ..
        } => assert_eq!((*committed, *last), (3, Some(2))),
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("cluster remove"), "{err}");
}

#[test]
fn batches_are_planned_against_the_ones_in_flight_and_answered_in_order() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster) = open_leader(dir.path(), &clock);
    let (_, x) = new_stream(&leader, "s", None);
    let (_, y) = new_stream(&leader, "t", None);
    let (to_test, batches) = std::sync::mpsc::channel();
    *cluster.to_test.lock().unwrap() = Some(to_test);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Three batches in flight at once, none settled: the second event of x is planned
    // against the first, which has not applied yet.
    let x1 = rt
        .block_on(leader.queue_append(one_event("s", x, 1)))
        .unwrap();
    let a = next_batch(&batches);
    let y1 = rt
        .block_on(leader.queue_append(one_event("t", y, 1)))
        .unwrap();
    let b = next_batch(&batches);
    let x2 = rt
        .block_on(leader.queue_append(one_event("s", x, 2)))
        .unwrap();
    let c = next_batch(&batches);
    assert_eq!((a.0.len(), b.0.len(), c.0.len()), (1, 1, 1));
    // The cluster commits and applies them in order, but reports the last first.
    let outcomes: Vec<_> = [a.0, b.0, c.0]
        .into_iter()
        .map(|entries| cluster.settle_now(entries))
        .collect();
    assert!(outcomes.iter().flatten().all(|o| *o == Proposed::Applied));
    let settled = || leader.stats().unwrap().commit_batches;
    let before = settled();
    c.1.settle(outcomes[2].clone());
    b.1.settle(outcomes[1].clone());
    assert_eq!(
        settled(),
        before,
        "nothing is answered before the first batch settles"
    );
    a.1.settle(outcomes[0].clone());
    assert_eq!(settled(), before + 3);
    let seqs = |r: cursorlog_engine::Result<cursorlog_engine::Appended>| {
        let r = r.unwrap();
        (r.stream, r.first_seq, r.duplicate)
    };
    assert_eq!(seqs(rt.block_on(x1)), (x, 1, false));
    assert_eq!(seqs(rt.block_on(y1)), (y, 1, false));
    assert_eq!(seqs(rt.block_on(x2)), (x, 2, false));
    *cluster.to_test.lock().unwrap() = None;
    let heads: Vec<_> = leader.streams().unwrap().iter().map(|s| s.head).collect();
    assert_eq!(heads, [2, 1]);
    close(leader, &cluster);
}

#[test]
fn a_request_planned_against_a_failed_batch_in_flight_is_not_acknowledged() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster) = open_leader(dir.path(), &clock);
    let (_, x) = new_stream(&leader, "s", None);
    let (_, y) = new_stream(&leader, "t", None);
    let (to_test, batches) = std::sync::mpsc::channel();
    *cluster.to_test.lock().unwrap() = Some(to_test);
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    *cluster.prepare_hold.lock().unwrap() = Some((entered_tx, release_rx));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Batch A holds the first attempt of x's event 1. While the writer is about to plan it,
    // a resend of that append and y's event 1 queue: they form batch B, planned while A is
    // in flight. The resend is planned as a duplicate of A's append (no entry of its own).
    let first = {
        let leader = leader.clone();
        std::thread::spawn(move || leader.append(one_event("s", x, 1)))
    };
    entered.recv().unwrap();
    let resend = rt
        .block_on(leader.queue_append(one_event("s", x, 1)))
        .unwrap();
    let y1 = rt
        .block_on(leader.queue_append(one_event("t", y, 1)))
        .unwrap();
    release.send(()).unwrap();
    let a = next_batch(&batches);
    let b = next_batch(&batches);
    assert_eq!(
        (a.0.len(), b.0.len()),
        (1, 1),
        "B's only entry is y's event"
    );
    // A is lost (its leader lost the quorum); B commits and applies: y's event is valid
    // against the state without A.
    a.1.settle(vec![Proposed::Unknown("lost the quorum".into())]);
    let b_outcomes = cluster.settle_now(b.0);
    assert_eq!(b_outcomes, [Proposed::Applied]);
    b.1.settle(b_outcomes);
    assert!(
        matches!(first.join().unwrap(), Err(Error::NotConfirmed(_))),
        "A was not applied"
    );
    let resend = rt.block_on(resend);
    assert!(
        matches!(resend, Err(Error::NotConfirmed(_))),
        "a resend was answered from an append in flight that never committed: {resend:?}"
    );
    // Every request planned after A's group is refused, even one whose own entry applied
    // (y's event is in the log: its caller is told to retry, as with any unknown outcome).
    let y1 = rt.block_on(y1);
    assert!(matches!(y1, Err(Error::NotConfirmed(_))), "{y1:?}");
    // The next batch is planned against the index, not the failed window: x's event 1 is
    // new again.
    *cluster.to_test.lock().unwrap() = None;
    let again = leader.append(one_event("s", x, 1)).unwrap();
    assert_eq!((again.first_seq, again.duplicate), (1, false));
    let heads: Vec<_> = leader.streams().unwrap().iter().map(|s| s.head).collect();
    assert_eq!(heads, [1, 1]);
    close(leader, &cluster);
}

/// Settles the batches the writer proposes on a thread of its own: it takes what is queued
/// (waiting a little for the batches the writer plans while the first is held), commits and
/// applies them in order, and reports them last first. Returns the most batches it held.
fn spawn_settler(
    cluster: Arc<LocalCluster>,
    batches: Receiver<Held>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut most = 0;
        while let Ok(first) = batches.recv() {
            let mut held = vec![first];
            // Only a liveness bound: a lone batch is settled after it.
            while held.len() < 3 {
                match batches.recv_timeout(Duration::from_millis(20)) {
                    Ok(more) => held.push(more),
                    Err(_) => break,
                }
            }
            most = most.max(held.len());
            let outcomes: Vec<_> = held
                .iter_mut()
                .map(|(entries, _)| cluster.settle_now(std::mem::take(entries)))
                .collect();
            for ((_, settle), outcomes) in held.into_iter().zip(outcomes).rev() {
                settle.settle(outcomes);
            }
        }
        most
    })
}

#[test]
fn concurrent_producers_through_pipelined_batches_lose_and_repeat_nothing() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster) = open_leader(dir.path(), &clock);
    let streams: Vec<u64> = (0..4)
        .map(|i| new_stream(&leader, &format!("s{i}"), None).1)
        .collect();
    let (to_test, batches) = std::sync::mpsc::channel();
    *cluster.to_test.lock().unwrap() = Some(to_test);
    let settler = spawn_settler(Arc::clone(&cluster), batches);
    const EVENTS: u64 = 40;
    let producers: Vec<_> = streams
        .iter()
        .enumerate()
        .map(|(i, &stream)| {
            let leader = leader.clone();
            std::thread::spawn(move || {
                let session = format!("s{i}");
                for seq in 1..=EVENTS {
                    let a = leader.append(one_event(&session, stream, seq)).unwrap();
                    assert_eq!((a.first_seq, a.duplicate), (seq, false));
                    if seq % 8 == 0 {
                        // A resend of an acknowledged append is its duplicate.
                        let again = leader.append(one_event(&session, stream, seq)).unwrap();
                        assert_eq!((again.first_seq, again.duplicate), (seq, true));
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    *cluster.to_test.lock().unwrap() = None;
    let most = settler.join().unwrap();
    eprintln!("at most {most} batches were in flight at once");
    let heads: Vec<_> = leader.streams().unwrap().iter().map(|s| s.head).collect();
    assert_eq!(heads, [EVENTS; 4]);
    let served = describe(&leader);
    close(leader, &cluster);
    drop(cluster);
    // The log holds exactly what was acknowledged: a replica rebuilt from it serves the same.
    let log = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap();
    let replica = Engine::open_replica(config_at(dir.path(), &clock), &log).unwrap();
    assert_eq!(describe(&replica), served);
}

/// Review R3 (issue 30 item 1): an error is a claim about the state it was planned against.
/// An append planned while the batch completing its stream is in flight is refused
/// (`StreamTerminated`) only once that batch applied; if it did not, the stream is still
/// open, and the caller is told to retry, not that the stream ended.
#[test]
fn an_error_planned_against_a_batch_in_flight_waits_for_it_and_is_withdrawn_if_it_fails() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster) = open_leader(dir.path(), &clock);
    let (_, x) = new_stream(&leader, "s", None);
    let (to_test, batches) = std::sync::mpsc::channel();
    *cluster.to_test.lock().unwrap() = Some(to_test);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let completing = {
        let leader = leader.clone();
        std::thread::spawn(move || {
            leader.complete(
                "s",
                x,
                Some(1),
                cursorlog_engine::NewEvent::new("k", b"end".to_vec()),
            )
        })
    };
    let a = next_batch(&batches);
    assert_eq!(a.0.len(), 1, "A completes x");
    let append = rt
        .block_on(leader.queue_append(one_event("s", x, 1)))
        .unwrap();
    let b = next_batch(&batches);
    assert!(b.0.is_empty(), "B's only request is refused: no entry");
    let settled = || leader.stats().unwrap().commit_batches;
    let before = settled();
    b.1.settle(Vec::new());
    assert_eq!(settled(), before, "B's refusal waits for A");
    a.1.settle(vec![Proposed::Unknown("lost the quorum".into())]);
    assert!(matches!(
        completing.join().unwrap(),
        Err(Error::NotConfirmed(_))
    ));
    let append = rt.block_on(append);
    assert!(
        matches!(append, Err(Error::NotConfirmed(_))),
        "x is open (A did not apply), yet the append was refused from A's plan: {append:?}"
    );
    *cluster.to_test.lock().unwrap() = None;
    let again = leader.append(one_event("s", x, 1)).unwrap();
    assert_eq!((again.first_seq, again.duplicate), (1, false));
    close(leader, &cluster);
}

/// Review R4 (issue 30 item 1): an answer that writes nothing (an existing session's
/// `OpenSession`, a seq conflict, an unknown stream) is released only once this member's
/// leadership was confirmed after it was planned; a member deposed without knowing it
/// (its confirmation fails) answers with the retryable `NotLeader`, never from its state.
#[test]
fn an_answer_with_no_entry_is_released_only_after_a_leadership_confirmation() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster) = open_leader(dir.path(), &clock);
    let (_, x) = new_stream(&leader, "s", None);
    leader.append(one_event("s", x, 1)).unwrap();
    let entries = cluster.log.state().last;
    *cluster.confirmation_fails.lock().unwrap() = Some(Proposed::NotLeader {
        leader: Some("10.0.0.2:7000".into()),
    });
    let deposed = |r: Result<String, Error>| match r {
        Err(Error::NotLeader { leader }) => assert_eq!(leader.as_deref(), Some("10.0.0.2:7000")),
        other => panic!("answered from state a deposed leader holds: {other:?}"),
    };
    deposed(leader.open_session("s").map(|s| format!("{s:?}")));
    deposed(
        leader
            .append(one_event("s", x, 7))
            .map(|a| format!("{a:?}")),
    );
    deposed(
        leader
            .append(one_event("s", x + 1000, 1))
            .map(|a| format!("{a:?}")),
    );
    assert_eq!(cluster.log.state().last, entries, "nothing was proposed");
    // Confirmed, the same calls get their real answers.
    *cluster.confirmation_fails.lock().unwrap() = None;
    assert!(!leader.open_session("s").unwrap().created);
    assert!(matches!(
        leader.append(one_event("s", x, 7)),
        Err(Error::SeqConflict { .. })
    ));
    close(leader, &cluster);
}

/// Review R6 (issue 30 item 3): a new leader's index may lack the previous term's tail (it
/// commits with the new term's first entry, after the node became leader). Leases are armed
/// only once a ReadIndex round of the term applied it, so a leased stream opened in that
/// tail, whose producer died with the old leader, is still aborted when its lease lapses.
#[test]
fn a_lease_opened_in_the_previous_terms_tail_is_armed_by_the_new_leader() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    // The old leader opens a leased stream; its entries are the tail the new one inherits.
    let old_dir = tempfile::tempdir().unwrap();
    let (old, old_cluster) = open_leader(old_dir.path(), &clock);
    old.open_session("s").unwrap();
    let opened = old
        .open_stream(OpenStream {
            lease_ms: Some(1_000),
            ..stream_in("s")
        })
        .unwrap();
    let tail = old_cluster.log.read(0, u64::MAX).unwrap();
    close(old, &old_cluster);

    // The new leader holds the tail, committed but not applied yet, when it starts leading.
    let dir = tempfile::tempdir().unwrap();
    let log = EntryLog::open(EntryLogConfig::new(dir.path())).unwrap();
    let cluster = LocalCluster::new(log.clone());
    *cluster.follower_of.lock().unwrap() = Some("10.0.0.1:7000".into());
    let leader = Engine::open_replicated(
        config_at(dir.path(), &clock),
        &log,
        Arc::clone(&cluster) as Arc<dyn cursorlog_engine::Proposer>,
    )
    .unwrap();
    *cluster.engine.lock().unwrap() = Some(leader.clone());
    log.append(&tail).unwrap();
    log.save_committed(tail.last().unwrap().id).unwrap();
    cluster.apply_in_prepare.store(true, Ordering::Release);
    *cluster.follower_of.lock().unwrap() = None;

    // The lease lapses on the new leader's clock: the stream is aborted through a proposal.
    // (The clock moves on until it is: arming may come after a move.)
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let aborted = loop {
        let state = leader
            .streams()
            .unwrap()
            .into_iter()
            .find(|s| s.id == opened.stream)
            .map(|s| s.state);
        if state == Some(cursorlog_engine::StreamState::Aborted) {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        clock.advance(Duration::from_secs(2));
        let _ = leader.run_maintenance();
        std::thread::yield_now();
    };
    assert!(
        aborted,
        "the stream opened in the previous term's tail was never aborted: its lease was not armed"
    );
    close(leader, &cluster);
}
