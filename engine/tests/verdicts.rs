//! One test per row of DESIGN.md's verdict table, plus the seed scenarios. Each asserts the
//! verdict, its facts, and that nothing is replayed where replay is forbidden.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::new_stream as stream;

use cursorlog_engine::{
    Append, Config, Cursor, Engine, Error, NewEvent, OpenStream, StreamState, Verdict,
};

struct Fixture {
    _dir: tempfile::TempDir,
    engine: Engine,
}

fn open() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(Config::new(dir.path())).unwrap();
    Fixture { _dir: dir, engine }
}

fn append(e: &Engine, session: &str, stream: u64, n: usize) -> Cursor {
    let events = (0..n)
        .map(|i| NewEvent::new("progress", format!("p{i}").into_bytes()))
        .collect();
    e.append(Append {
        session: session.into(),
        stream,
        expected_next_seq: None,
        events,
    })
    .unwrap()
    .last_cursor()
}

#[test]
fn malformed_cursor() {
    let f = open();
    stream(&f.engine, "s", None);
    for bad in ["", "1-2", "x-1-1", "1-1-1-1", "1-1-+1"] {
        let r = f.engine.resolve("s", bad, None).unwrap();
        assert_eq!(r.verdict, Verdict::MalformedCursor, "{bad:?}");
        assert!(r.facts.detail.is_some(), "a malformed verdict says why");
    }
}

#[test]
fn unknown_session_never_opened_and_expired() {
    let f = open();
    let (epoch, s) = stream(&f.engine, "s", None);
    let c = append(&f.engine, "s", s, 2);
    let r = f.engine.resolve("nope", &c.to_string(), None).unwrap();
    assert_eq!(r.verdict, Verdict::UnknownSession);
    assert!(!r.facts.session_expired);

    f.engine.expire_session("s").unwrap();
    let r = f
        .engine
        .resolve("s", &Cursor::new(epoch, s, 1).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::UnknownSession);
    assert!(
        r.facts.session_expired,
        "within the horizon the expiry is a fact"
    );
    assert!(matches!(
        f.engine.open_session("s"),
        Err(Error::SessionExpired)
    ));
}

#[test]
fn epoch_mismatch_for_older_and_newer_epochs() {
    let f = open();
    let (epoch, s) = stream(&f.engine, "s", None);
    let c = append(&f.engine, "s", s, 3);
    let adv = f.engine.advance_epoch("s").unwrap();
    assert_eq!(adv.epoch, epoch + 1);
    assert_eq!(adv.superseded, vec![s]);
    let r = f.engine.resolve("s", &c.to_string(), None).unwrap();
    assert_eq!(r.verdict, Verdict::EpochMismatch);
    assert_eq!(r.facts.current_epoch, Some(epoch + 1));
    let future = Cursor::new(epoch + 5, s, 1).to_string();
    assert_eq!(
        f.engine.resolve("s", &future, None).unwrap().verdict,
        Verdict::EpochMismatch
    );
    // The superseded stream accepts nothing more.
    let err = f.engine.append(Append {
        session: "s".into(),
        stream: s,
        expected_next_seq: None,
        events: vec![NewEvent::new("k", b"x".to_vec())],
    });
    assert!(matches!(
        err,
        Err(Error::StreamTerminated {
            state: StreamState::Superseded,
            ..
        })
    ));
}

#[test]
fn unknown_cursor_for_missing_stream_and_other_sessions_stream() {
    let f = open();
    let (epoch_a, a) = stream(&f.engine, "A", Some("req-1"));
    let ca = append(&f.engine, "A", a, 3);
    assert_eq!(
        f.engine
            .resolve("A", &ca.to_string(), None)
            .unwrap()
            .facts
            .correlation
            .as_deref(),
        Some("req-1")
    );
    let (epoch_b, _) = stream(&f.engine, "B", None);
    assert_eq!(epoch_a, epoch_b);
    // Session A's cursor presented under session B: the same answer as a stream that does
    // not exist, and no facts about A's stream.
    let cross = f.engine.resolve("B", &ca.to_string(), None).unwrap();
    let missing = f
        .engine
        .resolve("B", &Cursor::new(epoch_b, 999_999, 1).to_string(), None)
        .unwrap();
    assert_eq!(cross.verdict, Verdict::UnknownCursor);
    assert_eq!(missing.verdict, Verdict::UnknownCursor);
    assert_eq!(
        cross.facts, missing.facts,
        "nothing reveals that the stream exists elsewhere"
    );
    assert_eq!(cross.facts.head, None);
    assert_eq!(cross.facts.correlation, None, "nor the request id");
    // Nor can B read or append to A's stream.
    assert!(matches!(
        f.engine.read("B", a, 0, 10),
        Err(Error::UnknownStream(_))
    ));
    let err = f.engine.append(Append {
        session: "B".into(),
        stream: a,
        expected_next_seq: None,
        events: vec![NewEvent::new("k", b"x".to_vec())],
    });
    assert!(matches!(err, Err(Error::UnknownStream(_))));
}

#[test]
fn unknown_cursor_for_stream_of_an_older_epoch_under_the_current_epoch() {
    let f = open();
    let (epoch, s) = stream(&f.engine, "s", None);
    append(&f.engine, "s", s, 2);
    f.engine.advance_epoch("s").unwrap();
    // A forged cursor claiming the old stream lives in the new epoch.
    let forged = Cursor::new(epoch + 1, s, 1).to_string();
    assert_eq!(
        f.engine.resolve("s", &forged, None).unwrap().verdict,
        Verdict::UnknownCursor
    );
}

#[test]
fn stream_mismatch_when_declared_stream_differs() {
    let f = open();
    let (_, s1) = stream(&f.engine, "s", None);
    let (_, s2) = stream(&f.engine, "s", None);
    let c = append(&f.engine, "s", s1, 2);
    let r = f.engine.resolve("s", &c.to_string(), Some(s2)).unwrap();
    assert_eq!(r.verdict, Verdict::StreamMismatch);
    assert_eq!(
        f.engine
            .resolve("s", &c.to_string(), Some(s1))
            .unwrap()
            .verdict,
        Verdict::Resumable
    );
}

/// Seed 000: the cursor is the terminal event of a completed stream. Known is not resumable.
#[test]
fn seed_000_terminal_cursor_is_stream_terminated_and_replays_nothing() {
    let f = open();
    let (_, s) = stream(&f.engine, "s", Some("req-1"));
    append(&f.engine, "s", s, 3);
    let t = f
        .engine
        .complete(
            "s",
            s,
            Some(4),
            NewEvent::new("result", b"{\"result\":1}".to_vec()),
        )
        .unwrap();
    assert_eq!(t.terminal_seq, 4);
    let r = f
        .engine
        .resolve("s", &t.cursor.to_string(), Some(s))
        .unwrap();
    assert_eq!(r.verdict, Verdict::StreamTerminated);
    assert!(
        !r.missed_terminal_frame(),
        "the client has the terminal frame"
    );
    assert_eq!(r.facts.terminal_seq, Some(4));
    assert_eq!(r.facts.stream_state, Some(StreamState::Completed));
    let after = f.engine.read("s", s, 4, 100).unwrap();
    assert!(
        after.events.is_empty() && after.end_of_stream,
        "nothing after the terminal frame"
    );
    assert!(matches!(
        f.engine.append(Append {
            session: "s".into(),
            stream: s,
            expected_next_seq: None,
            events: vec![NewEvent::new("k", b"x".to_vec())]
        }),
        Err(Error::StreamTerminated {
            terminal_seq: 4,
            ..
        })
    ));
}

#[test]
fn stream_terminated_before_terminal_seq_points_to_the_outcome() {
    let f = open();
    let (epoch, s) = stream(&f.engine, "s", Some("req-9"));
    append(&f.engine, "s", s, 3);
    f.engine
        .complete("s", s, None, NewEvent::new("result", b"done".to_vec()))
        .unwrap();
    let r = f
        .engine
        .resolve("s", &Cursor::new(epoch, s, 2).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::StreamTerminated);
    assert!(r.missed_terminal_frame());
    assert_eq!(
        r.facts.correlation.as_deref(),
        Some("req-9"),
        "the verdict names the request the stream answers"
    );
    let o = f
        .engine
        .outcome("s", "req-9")
        .unwrap()
        .expect("outcome by correlation id");
    assert_eq!(f.engine.stream_outcome("s", s).unwrap().as_ref(), Some(&o));
    assert_eq!(
        f.engine.stream_outcome("other", s).unwrap(),
        None,
        "by stream id too, another session's outcome is never revealed"
    );
    assert_eq!(o.stream, s);
    assert_eq!(o.state, StreamState::Completed);
    assert_eq!(o.terminal_seq, Some(4));
    assert_eq!(o.frame.as_ref().map(|e| &e.payload[..]), Some(&b"done"[..]));
    assert_eq!(o.frame.as_ref().map(|e| e.seq), Some(4));
    // Outcomes are per session.
    assert_eq!(f.engine.outcome("other", "req-9").unwrap(), None);
}

#[test]
fn aborted_stream_is_terminated_with_its_reason() {
    let f = open();
    let (epoch, s) = stream(&f.engine, "s", Some("r"));
    append(&f.engine, "s", s, 2);
    let t = f.engine.abort("s", s, "producer gave up", None).unwrap();
    assert_eq!(t.terminal_seq, 2, "no frame: the terminal seq is the head");
    let r = f
        .engine
        .resolve("s", &Cursor::new(epoch, s, 2).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::StreamTerminated);
    assert_eq!(r.facts.stream_state, Some(StreamState::Aborted));
    assert_eq!(r.facts.detail.as_deref(), Some("producer gave up"));
    assert!(matches!(
        f.engine.abort("s", s, "again", None),
        Err(Error::StreamTerminated { .. })
    ));
}

#[test]
fn cursor_evicted_after_trim() {
    let f = open();
    let (epoch, s) = stream(&f.engine, "s", None);
    append(&f.engine, "s", s, 10);
    assert_eq!(f.engine.trim("s", s, 5).unwrap(), 6);
    // Cursor 5: everything after it (6..) is retained, so it is still resumable.
    assert_eq!(
        f.engine
            .resolve("s", &Cursor::new(epoch, s, 5).to_string(), None)
            .unwrap()
            .verdict,
        Verdict::Resumable
    );
    let r = f
        .engine
        .resolve("s", &Cursor::new(epoch, s, 4).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::CursorEvicted);
    assert_eq!(r.facts.watermark, Some(6));
    assert!(matches!(
        f.engine.read("s", s, 4, 10),
        Err(Error::Evicted { watermark: 6, .. })
    ));
    // Watermarks never go backwards.
    assert_eq!(f.engine.trim("s", s, 2).unwrap(), 6);
    assert_eq!(
        f.engine
            .read("s", s, 5, 100)
            .unwrap()
            .events
            .first()
            .map(|e| e.seq),
        Some(6)
    );
}

#[test]
fn cursor_ahead_of_head_and_past_the_terminal_seq() {
    let f = open();
    let (epoch, s) = stream(&f.engine, "s", None);
    append(&f.engine, "s", s, 3);
    let r = f
        .engine
        .resolve("s", &Cursor::new(epoch, s, 4).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::CursorAhead);
    assert_eq!(r.facts.head, Some(3));
    f.engine
        .complete("s", s, None, NewEvent::new("result", b"r".to_vec()))
        .unwrap();
    let past = Cursor::new(epoch, s, 9).to_string();
    assert_eq!(
        f.engine.resolve("s", &past, None).unwrap().verdict,
        Verdict::CursorAhead
    );
}

#[test]
fn resumable_replays_strictly_after_the_cursor_without_gaps() {
    let f = open();
    let (epoch, s) = stream(&f.engine, "s", None);
    append(&f.engine, "s", s, 10);
    let c = Cursor::new(epoch, s, 4);
    let r = f.engine.resolve("s", &c.to_string(), Some(s)).unwrap();
    assert_eq!(r.verdict, Verdict::Resumable);
    assert_eq!(r.facts.head, Some(10));
    let batch = f.engine.read("s", s, 4, 3).unwrap();
    assert_eq!(
        batch.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![5, 6, 7]
    );
    assert_eq!(batch.events[0].payload, &b"p4"[..]);
    assert!(!batch.end_of_stream);
    // Seq 0 (nothing received yet) is a valid cursor.
    assert_eq!(
        f.engine
            .resolve("s", &Cursor::new(epoch, s, 0).to_string(), None)
            .unwrap()
            .verdict,
        Verdict::Resumable
    );
}

#[test]
fn verdicts_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (epoch, s, t);
    {
        let e = Engine::open(Config::new(dir.path())).unwrap();
        (epoch, s) = stream(&e, "s", Some("c"));
        append(&e, "s", s, 3);
        t = e
            .complete("s", s, None, NewEvent::new("result", b"r".to_vec()))
            .unwrap();
        e.close().unwrap();
    }
    let e = Engine::open(Config::new(dir.path())).unwrap();
    assert_eq!(
        e.resolve("s", &t.cursor.to_string(), None).unwrap().verdict,
        Verdict::StreamTerminated
    );
    assert_eq!(
        e.resolve("s", &Cursor::new(epoch, s, 1).to_string(), None)
            .unwrap()
            .verdict,
        Verdict::StreamTerminated
    );
    assert_eq!(e.read("s", s, 0, 10).unwrap().events.len(), 4);
    assert!(e.outcome("s", "c").unwrap().is_some());
}

#[test]
fn idempotent_retry_returns_the_same_seqs_and_conflicts_are_refused() {
    let f = open();
    let (_, s) = stream(&f.engine, "s", None);
    let batch = |p: &str| Append {
        session: "s".into(),
        stream: s,
        expected_next_seq: Some(1),
        events: vec![
            NewEvent::new("k", p.as_bytes().to_vec()),
            NewEvent::new("k", b"2".to_vec()),
        ],
    };
    let first = f.engine.append(batch("1")).unwrap();
    assert_eq!(
        (first.first_seq, first.last_seq, first.duplicate),
        (1, 2, false)
    );
    let retry = f.engine.append(batch("1")).unwrap();
    assert_eq!(
        (retry.first_seq, retry.last_seq, retry.duplicate),
        (1, 2, true)
    );
    assert!(matches!(
        f.engine.append(batch("other")),
        Err(Error::SeqConflict { .. })
    ));
    let gap = Append {
        expected_next_seq: Some(9),
        ..batch("1")
    };
    assert!(matches!(
        f.engine.append(gap),
        Err(Error::SeqConflict { head: 2, .. })
    ));
    assert_eq!(
        f.engine.read("s", s, 0, 10).unwrap().events.len(),
        2,
        "retries wrote nothing"
    );
}

#[test]
fn bad_input_is_refused_with_the_field_named_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(dir.path());
    cfg.payload_bytes_max = 16;
    cfg.batch_events_max = 2;
    let e = Engine::open(cfg).unwrap();
    let (_, s) = stream(&e, "s", None);
    let before = e.stats().unwrap().last_lsn;
    let one = |p: Vec<u8>| Append {
        session: "s".into(),
        stream: s,
        expected_next_seq: None,
        events: vec![NewEvent::new("k", p)],
    };
    assert!(matches!(
        e.append(one(vec![0; 17])),
        Err(Error::TooLarge { limit: 16, .. })
    ));
    let three = Append {
        events: vec![NewEvent::new("k", vec![1]); 3],
        ..one(vec![])
    };
    assert!(matches!(
        e.append(three),
        Err(Error::TooLarge { limit: 2, .. })
    ));
    let empty = Append {
        events: vec![],
        ..one(vec![])
    };
    assert!(matches!(
        e.append(empty),
        Err(Error::InvalidArgument {
            field: "events",
            ..
        })
    ));
    assert!(matches!(
        e.open_session(""),
        Err(Error::InvalidArgument {
            field: "session",
            ..
        })
    ));
    assert!(matches!(
        e.open_session(&"x".repeat(300)),
        Err(Error::InvalidArgument {
            field: "session",
            ..
        })
    ));
    let stale = OpenStream {
        session: "s".into(),
        epoch: 7,
        correlation: None,
        lease_ms: None,
    };
    assert!(matches!(
        e.open_stream(stale),
        Err(Error::StaleEpoch {
            given: 7,
            current: 1
        })
    ));
    let nosess = OpenStream {
        session: "none".into(),
        epoch: 1,
        correlation: None,
        lease_ms: None,
    };
    assert!(matches!(e.open_stream(nosess), Err(Error::UnknownSession)));
    assert_eq!(
        e.stats().unwrap().last_lsn,
        before,
        "no rejected request wrote a record"
    );
    let err = e.append(one(vec![0; 17])).unwrap_err().to_string();
    assert!(
        err.contains("payload"),
        "message names what was wrong: {err}"
    );
}

#[test]
fn stream_ids_are_unique_across_sessions_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..3 {
        let e = Engine::open(Config::new(dir.path())).unwrap();
        for sess in ["a", "b"] {
            let (_, s) = stream(&e, sess, None);
            assert!(seen.insert(s), "stream id {s} reused in round {round}");
        }
        e.close().unwrap();
    }
}

#[test]
fn lease_expiry_aborts_the_stream_and_ends_followers() {
    let f = open();
    let s = f.engine.open_session("s").unwrap();
    let st = f
        .engine
        .open_stream(OpenStream {
            session: "s".into(),
            epoch: s.epoch,
            correlation: None,
            lease_ms: Some(150),
        })
        .unwrap();
    append(&f.engine, "s", st.stream, 1);
    let mut follower = f.engine.follow("s", st.stream, 1).unwrap();
    let started = std::time::Instant::now();
    let rt = tokio_runtime();
    let next = rt.block_on(follower.next_batch(10)).unwrap();
    assert_eq!(next, None, "the follower ends at the abort tombstone");
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    let r = f
        .engine
        .resolve("s", &Cursor::new(s.epoch, st.stream, 1).to_string(), None)
        .unwrap();
    assert_eq!(r.verdict, Verdict::StreamTerminated);
    assert_eq!(r.facts.stream_state, Some(StreamState::Aborted));
    assert_eq!(r.facts.detail.as_deref(), Some("producer lease expired"));
}

#[test]
fn follower_sees_appends_from_another_handle_then_ends_at_the_terminal_frame() {
    let f = open();
    let (_, s) = stream(&f.engine, "s", None);
    append(&f.engine, "s", s, 2);
    let mut follower = f.engine.follow("s", s, 1).unwrap();
    let producer = f.engine.clone();
    // Lockstep: the producer writes the next event only after the follower has received
    // everything before it, so every late event reaches a follower that has caught up and
    // waits (the path under test), whatever the scheduling.
    let (caught_up, wait_caught_up) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        for i in 0..5 {
            wait_caught_up.recv().unwrap();
            producer
                .append(Append {
                    session: "s".into(),
                    stream: s,
                    expected_next_seq: None,
                    events: vec![NewEvent::new("k", format!("late{i}").into_bytes())],
                })
                .unwrap();
        }
        wait_caught_up.recv().unwrap();
        producer
            .complete("s", s, None, NewEvent::new("result", b"end".to_vec()))
            .unwrap();
    });
    let rt = tokio_runtime();
    let mut seqs = Vec::new();
    while let Some(batch) = rt.block_on(follower.next_batch(2)).unwrap() {
        seqs.extend(batch.iter().map(|e| e.seq));
        // The producer is gone after the terminal event: nobody to tell then.
        let _ = caught_up.send(());
    }
    t.join().unwrap();
    assert_eq!(
        seqs,
        (2..=8).collect::<Vec<_>>(),
        "every event after the cursor exactly once, in order"
    );
}

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn async_append_matches_blocking_append() {
    let f = open();
    let (_, s) = stream(&f.engine, "s", None);
    let rt = tokio_runtime();
    let batch = |p: &str| Append {
        session: "s".into(),
        stream: s,
        expected_next_seq: Some(1),
        events: vec![NewEvent::new("k", p.as_bytes().to_vec())],
    };
    let a = rt.block_on(f.engine.append_async(batch("x"))).unwrap();
    assert_eq!((a.first_seq, a.duplicate), (1, false));
    let again = rt.block_on(f.engine.append_async(batch("x"))).unwrap();
    assert!(again.duplicate, "idempotent retry through the async path");
    assert!(matches!(
        rt.block_on(f.engine.append_async(batch("y"))),
        Err(Error::SeqConflict { .. })
    ));
    let empty = Append {
        events: vec![],
        ..batch("x")
    };
    assert!(matches!(
        rt.block_on(f.engine.append_async(empty)),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(
        f.engine.read("s", s, 0, 10).unwrap().events[0].payload,
        &b"x"[..]
    );
}

/// A verdict reads the session and the stream as of one moment, never half-way through a
/// write that changes both. An epoch advance supersedes the session's open streams and
/// raises its epoch in one apply; a Resolve that read the session before that apply and
/// the stream after it answered "terminated, superseded" with the old epoch current, a
/// state that never existed (the cluster's history checker caught it on a live member).
#[test]
fn a_verdict_is_never_read_half_way_through_an_epoch_advance() {
    let f = open();
    let e = &f.engine;
    for round in 0..300 {
        let session = format!("s{round}");
        let (epoch, id) = stream(e, &session, None);
        let cursor = Cursor {
            epoch,
            stream: id,
            seq: 0,
        }
        .to_string();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let mut reads = 0_u64;
                loop {
                    let r = e.resolve(&session, &cursor, None).unwrap();
                    reads += 1;
                    match (r.verdict, r.facts.current_epoch, r.facts.stream_state) {
                        (Verdict::Resumable, Some(1), Some(StreamState::Open)) => {}
                        (Verdict::EpochMismatch, Some(2), None) => return reads,
                        other => {
                            panic!("round {round}, read {reads}: a verdict of no moment: {other:?}")
                        }
                    }
                    if done.load(std::sync::atomic::Ordering::SeqCst) && reads > 1_000_000 {
                        panic!("round {round}: the advance never showed");
                    }
                }
            });
            e.advance_epoch(&session).unwrap();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            reader.join().unwrap()
        });
    }
}
