//! A leader proposes one Raft entry per batch, not one per request: the writer merges a
//! batch's planned groups into as few entries as fit under the proposer's cap, and answers
//! every request of an entry from that entry's outcome (issue 19 item 8, throughput: openraft's
//! work is per entry). The "cluster" is `local_cluster`'s one-node proposer, so the real
//! planner, entry log and apply rules run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod local_cluster;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use common::*;
use cursorlog_engine::{
    Append, Appended, Engine, Error, ManualClock, NewEvent, Proposed, Result, StreamInfo,
};
use local_cluster::*;

type Answer = std::pin::Pin<Box<dyn Future<Output = Result<Appended>> + Send>>;

/// An append of one event of `payload` bytes to `stream` at `seq`.
fn event_of(session: &str, stream: u64, seq: u64, payload: usize) -> Append {
    Append {
        session: session.into(),
        stream,
        expected_next_seq: Some(seq),
        events: vec![NewEvent::new("k", vec![7u8; payload])],
    }
}

/// Makes what `queue` queues one batch: a first append (to stream `warm` of session "w")
/// is held in `prepare` while `queue` runs, so the writer gathers everything it queued into
/// the batch after it. The first batch is applied; returns the next batch (held, not
/// settled) and what `queue` returned.
fn one_batch_of<T>(
    leader: &Engine,
    cluster: &LocalCluster,
    batches: &Receiver<Held>,
    warm: u64,
    queue: impl FnOnce() -> T,
) -> (Held, T) {
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    *cluster.prepare_hold.lock().unwrap() = Some((entered_tx, release_rx));
    let first = {
        let leader = leader.clone();
        std::thread::spawn(move || leader.append(one_event("w", warm, 1)))
    };
    entered.recv().unwrap();
    let queued = queue();
    release.send(()).unwrap();
    let (entries, settle) = next_batch(batches);
    settle.settle(cluster.settle_now(entries));
    assert!(first.join().unwrap().is_ok(), "the first batch applied");
    (next_batch(batches), queued)
}

/// Queues `appends` in order; their answers.
fn queue_all(leader: &Engine, rt: &tokio::runtime::Runtime, appends: Vec<Append>) -> Vec<Answer> {
    appends
        .into_iter()
        .map(|a| Box::pin(rt.block_on(leader.queue_append(a)).unwrap()) as Answer)
        .collect()
}

/// A leader with a stream `warm` in session "w" and one stream in each of `sessions`, whose
/// batches go to the test (the receiver) to settle.
fn leader_with(
    dir: &std::path::Path,
    sessions: &[&str],
) -> (Engine, Arc<LocalCluster>, Receiver<Held>, u64, Vec<u64>) {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let (leader, cluster) = open_leader(dir, &clock);
    let (_, warm) = new_stream(&leader, "w", None);
    let streams = sessions
        .iter()
        .map(|s| new_stream(&leader, s, None).1)
        .collect();
    let (to_test, batches) = std::sync::mpsc::channel();
    *cluster.to_test.lock().unwrap() = Some(to_test);
    (leader, cluster, batches, warm, streams)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn heads(leader: &Engine, streams: &[u64]) -> Vec<u64> {
    let all = leader.streams().unwrap();
    streams
        .iter()
        .map(|id| all.iter().find(|s| s.id == *id).unwrap().head)
        .collect()
}

#[test]
fn a_batch_of_requests_is_proposed_as_one_entry() {
    let dir = tempfile::tempdir().unwrap();
    const SESSIONS: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let (leader, cluster, batches, warm, streams) = leader_with(dir.path(), &SESSIONS);
    let rt = runtime();
    let appends = SESSIONS
        .iter()
        .zip(&streams)
        .map(|(s, &id)| event_of(s, id, 1, 100))
        .collect();
    let ((entries, settle), answers) = one_batch_of(&leader, &cluster, &batches, warm, || {
        queue_all(&leader, &rt, appends)
    });
    assert_eq!(
        entries.len(),
        1,
        "8 requests, one entry: {} entries",
        entries.len()
    );
    let outcomes = cluster.settle_now(entries);
    assert_eq!(outcomes, [Proposed::Applied]);
    settle.settle(outcomes);
    for (answer, &id) in answers.into_iter().zip(&streams) {
        let a = rt.block_on(answer).unwrap();
        assert_eq!((a.stream, a.first_seq, a.duplicate), (id, 1, false));
    }
    assert_eq!(heads(&leader, &streams), [1; 8]);
    *cluster.to_test.lock().unwrap() = None;
    close(leader, &cluster);
}

#[test]
fn a_refused_merged_entry_fails_every_request_in_it_and_every_batch_planned_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let (leader, cluster, batches, warm, streams) = leader_with(dir.path(), &["x", "y", "z", "u"]);
    let rt = runtime();
    let before = leader.streams().unwrap().len();
    // Batch B: three appends, each valid on its own, then a stream opening whose id the
    // planner predicts from the log's next LSN.
    let ((b, b_settle), (answers, opening)) =
        one_batch_of(&leader, &cluster, &batches, warm, || {
            let appends = ["x", "y", "z"]
                .iter()
                .zip(&streams)
                .map(|(s, &id)| event_of(s, id, 1, 100))
                .collect();
            let answers = queue_all(&leader, &rt, appends);
            let opening = {
                let leader = leader.clone();
                rt.spawn(async move { leader.open_stream_async(stream_in("u")).await })
            };
            // The opening runs to its first wait: it is queued behind the appends.
            rt.block_on(tokio::task::yield_now());
            (answers, opening)
        });
    assert_eq!(b.len(), 1, "B is one entry: {} entries", b.len());
    // Batch C is planned behind B in the same window while B is in flight: an append of
    // u's stream, valid whatever B's outcome.
    let behind = queue_all(&leader, &rt, vec![event_of("u", streams[3], 1, 100)]);
    let (c, c_settle) = next_batch(&batches);
    // A blank entry slips in before B: the opening's stream id is not its LSN, so apply
    // refuses B's entry, and with it the appends merged into it.
    cluster.blank_first.store(true, Ordering::Release);
    let b_outcomes = cluster.settle_now(b);
    assert!(
        matches!(b_outcomes.as_slice(), [Proposed::Refused(_)]),
        "{b_outcomes:?}"
    );
    b_settle.settle(b_outcomes);
    let c_outcomes = cluster.settle_now(c);
    assert_eq!(c_outcomes, [Proposed::Applied], "C alone is valid");
    c_settle.settle(c_outcomes);
    for answer in answers {
        let a = rt.block_on(answer);
        assert!(
            matches!(&a, Err(Error::NotConfirmed(why)) if why.contains("refused")),
            "an append merged into the refused entry: {a:?}"
        );
    }
    let opened: Result<StreamInfo> = rt.block_on(opening).unwrap();
    assert!(matches!(opened, Err(Error::NotConfirmed(_))), "{opened:?}");
    for answer in behind {
        let a = rt.block_on(answer);
        assert!(
            matches!(a, Err(Error::NotConfirmed(_))),
            "a request planned behind the refused entry was acknowledged: {a:?}"
        );
    }
    assert_eq!(
        heads(&leader, &streams[..3]),
        [0, 0, 0],
        "B changed nothing"
    );
    assert_eq!(leader.streams().unwrap().len(), before, "no stream opened");
    // The next window is planned against the index: the appends succeed on retry.
    *cluster.to_test.lock().unwrap() = None;
    for (s, &id) in ["x", "y", "z"].iter().zip(&streams) {
        let again = leader.append(event_of(s, id, 1, 100)).unwrap();
        assert_eq!((again.first_seq, again.duplicate), (1, false));
    }
    close(leader, &cluster);
}

#[test]
fn the_cap_splits_a_batch_and_each_request_is_answered_from_its_own_entry() {
    let dir = tempfile::tempdir().unwrap();
    const SESSIONS: [&str; 5] = ["a", "b", "c", "d", "e"];
    let (leader, cluster, batches, warm, streams) = leader_with(dir.path(), &SESSIONS);
    let rt = runtime();
    // Two 1,500-byte events fit an entry of 4 KiB, three do not; a 10,000-byte event is an
    // entry of its own.
    cluster.entry_bytes_max.store(4096, Ordering::Release);
    const SIZES: [usize; 5] = [1_500, 1_500, 10_000, 1_500, 1_500];
    let ((entries, settle), answers) = one_batch_of(&leader, &cluster, &batches, warm, || {
        let appends = SESSIONS
            .iter()
            .zip(&streams)
            .zip(SIZES)
            .map(|((s, &id), size)| event_of(s, id, 1, size))
            .collect();
        queue_all(&leader, &rt, appends)
    });
    let records: Vec<usize> = entries.iter().map(|e| e.records().unwrap().len()).collect();
    assert_eq!(records, [2, 1, 2], "entries of the requests' groups");
    assert!(entries
        .iter()
        .all(|e| e.as_bytes().len() <= 4096 || e.records().unwrap().len() == 1));
    // The first two entries apply; the third is lost (a leader that lost its quorum).
    let mut outcomes = cluster.settle_now(entries[..2].to_vec());
    assert_eq!(outcomes, [Proposed::Applied, Proposed::Applied]);
    outcomes.push(Proposed::Unknown("lost the quorum".into()));
    settle.settle(outcomes);
    let answers: Vec<_> = answers.into_iter().map(|a| rt.block_on(a)).collect();
    for (i, a) in answers.iter().enumerate() {
        match i {
            0..=2 => assert_eq!(
                a.as_ref().map(|a| (a.stream, a.first_seq)).ok(),
                Some((streams[i], 1)),
                "request {i} is in an applied entry: {a:?}"
            ),
            _ => assert!(
                matches!(a, Err(Error::NotConfirmed(_))),
                "request {i} is in the lost entry: {a:?}"
            ),
        }
    }
    assert_eq!(heads(&leader, &streams), [1, 1, 1, 0, 0]);
    *cluster.to_test.lock().unwrap() = None;
    close(leader, &cluster);
}
