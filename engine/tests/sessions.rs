//! Session state (what a replica needs to restore a session it did not create), retried
//! completions and batched writes across sessions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use cursorlog_engine::{
    Append, BatchWrite, BatchWritten, Config, Engine, Error, NewEvent, OpenStream, StreamState,
};

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.retention.check_interval = Duration::from_secs(3600);
    c
}

fn reopen(e: Engine, dir: &Path, rebuild: bool) -> Engine {
    e.close().unwrap();
    drop(e);
    if rebuild {
        std::fs::remove_dir_all(dir.join("index")).unwrap();
    }
    Engine::open(config(dir)).unwrap()
}

#[test]
fn session_state_lives_with_the_session_across_retention_reopen_and_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let info = e
        .open_session_with_state("s", Some(b"init-params".to_vec()))
        .unwrap();
    assert!(info.created);
    assert_eq!(info.state, b"init-params");
    // An existing session keeps its state; the state given to a second open is ignored.
    let again = e
        .open_session_with_state("s", Some(b"other".to_vec()))
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.state, b"init-params");
    e.set_session_state("s", b"v2".to_vec()).unwrap();
    assert_eq!(e.session("s").unwrap().unwrap().state, b"v2");
    assert_eq!(e.open_session("plain").unwrap().state, b"");

    // Roll many segments with another session's trimmed events, then retire them: the
    // session's record (and its state) is carried forward, not lost with its segment.
    let (_, filler) = common::new_stream(&e, "filler", None);
    for _ in 0..80 {
        e.append(Append {
            session: "filler".into(),
            stream: filler,
            expected_next_seq: None,
            events: vec![NewEvent::new("p", vec![7; 200])],
        })
        .unwrap();
    }
    e.trim("filler", filler, 80).unwrap();
    assert!(e.run_retention().unwrap() > 0);
    let check = |e: &Engine| {
        let v = e.session("s").unwrap().expect("session remembered");
        assert_eq!(
            (v.epoch, v.expired, v.state.as_slice()),
            (1, false, &b"v2"[..])
        );
        assert_eq!(e.session("nobody").unwrap(), None);
    };
    check(&e);
    let e = reopen(e, dir.path(), false);
    check(&e);
    let e = reopen(e, dir.path(), true);
    assert!(e.recovery_report().index_rebuilt);
    check(&e);

    // Clearing it; an expired session's state cannot change.
    e.set_session_state("s", Vec::new()).unwrap();
    assert_eq!(e.session("s").unwrap().unwrap().state, b"");
    e.expire_session("s").unwrap();
    assert!(matches!(
        e.set_session_state("s", b"late".to_vec()),
        Err(Error::SessionExpired)
    ));
    assert!(e.session("s").unwrap().unwrap().expired);
    assert!(matches!(e.touch_session("s"), Err(Error::SessionExpired)));
    assert!(matches!(
        e.touch_session("nobody"),
        Err(Error::UnknownSession)
    ));
}

#[test]
fn oversized_session_state_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let limit = e.config().session_state_bytes_max as usize;
    let err = e
        .open_session_with_state("s", Some(vec![0; limit + 1]))
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    assert_eq!(e.session("s").unwrap(), None);
    e.open_session_with_state("s", Some(vec![1; limit]))
        .unwrap();
    assert!(matches!(
        e.set_session_state("s", vec![0; limit + 1]),
        Err(Error::TooLarge { .. })
    ));
    assert_eq!(e.session("s").unwrap().unwrap().state.len(), limit);
}

fn stream(e: &Engine, session: &str) -> u64 {
    let epoch = e.open_session(session).unwrap().epoch;
    e.open_stream(OpenStream {
        session: session.into(),
        epoch,
        correlation: Some("req".into()),
        lease_ms: None,
    })
    .unwrap()
    .stream
}

#[test]
fn a_retried_completion_is_recognised_and_a_different_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let s = stream(&e, "s");
    let result = NewEvent::new("result", b"{\"ok\":true}".to_vec());
    let first = e.complete("s", s, Some(1), result.clone()).unwrap();
    assert!(!first.duplicate);
    let lsn = e.stats().unwrap().last_lsn;
    let retry = e.complete("s", s, Some(1), result.clone()).unwrap();
    assert!(retry.duplicate);
    assert_eq!(
        (retry.terminal_seq, retry.cursor, retry.state),
        (first.terminal_seq, first.cursor, StreamState::Completed)
    );
    assert_eq!(
        e.stats().unwrap().last_lsn,
        lsn,
        "a recognised retry writes nothing"
    );
    // Without the expected seq, or with another frame, it is a second completion: refused.
    for (expected, frame) in [
        (None, result.clone()),
        (Some(1), NewEvent::new("result", b"{\"ok\":false}".to_vec())),
        (Some(2), result.clone()),
    ] {
        let err = e.complete("s", s, expected, frame).unwrap_err();
        assert!(matches!(err, Error::StreamTerminated { .. }), "{err}");
    }
}

#[tokio::test]
async fn a_batch_answers_each_item_alone_and_keeps_each_streams_order() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let a = stream(&e, "a");
    let b = stream(&e, "b");
    let append = |session: &str, stream, expected, payload: &[u8]| {
        BatchWrite::Append(Append {
            session: session.into(),
            stream,
            expected_next_seq: expected,
            events: vec![NewEvent::new("p", payload.to_vec())],
        })
    };
    let result = NewEvent::new("result", b"done".to_vec());
    let out = e
        .write_batch_async(vec![
            append("a", a, Some(1), b"a1"),
            append("b", b, Some(1), b"b1"),
            append("a", a, Some(2), b"a2"),
            append("b", a, None, b"wrong session"),
            append("a", a, Some(2), b"a2"), // the same batch again: a retry
            BatchWrite::Complete {
                session: "a".into(),
                stream: a,
                expected_next_seq: Some(3),
                terminal: result.clone(),
            },
            BatchWrite::Complete {
                session: "a".into(),
                stream: a,
                expected_next_seq: Some(3),
                terminal: result.clone(),
            },
            append("b", b, Some(5), b"gap"),
            BatchWrite::Open(OpenStream {
                session: "b".into(),
                epoch: 1,
                correlation: Some("next".into()),
                lease_ms: None,
            }),
        ])
        .await;
    let seqs: Vec<String> = out
        .iter()
        .map(|r| match r {
            Ok(BatchWritten::Appended(x)) => {
                format!("{}..{} dup={}", x.first_seq, x.last_seq, x.duplicate)
            }
            Ok(BatchWritten::Completed(t)) => {
                format!("done {} dup={}", t.terminal_seq, t.duplicate)
            }
            Ok(BatchWritten::Opened(s)) => format!("opened after b: {}", s.stream > b),
            Err(e) => format!(
                "err {}",
                match e {
                    Error::UnknownStream(_) => "unknown stream",
                    Error::SeqConflict { .. } => "seq conflict",
                    _ => "other",
                }
            ),
        })
        .collect();
    assert_eq!(
        seqs,
        [
            "1..1 dup=false",
            "1..1 dup=false",
            "2..2 dup=false",
            "err unknown stream",
            "2..2 dup=true",
            "done 3 dup=false",
            "done 3 dup=true",
            "err seq conflict",
            "opened after b: true",
        ]
    );
    let read = e.read("a", a, 0, 10).unwrap();
    let payloads: Vec<&[u8]> = read.events.iter().map(|ev| ev.payload.as_ref()).collect();
    assert_eq!(payloads, [&b"a1"[..], b"a2", b"done"]);
    assert!(read.end_of_stream);
}

/// The async forms of the session and termination calls (which the server uses, so no thread
/// waits for a group commit) answer exactly as their blocking twins, refusals included.
#[tokio::test]
async fn the_async_session_calls_answer_as_the_blocking_ones() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let info = e
        .open_session_with_state_async("s", Some(b"init".to_vec()))
        .await
        .unwrap();
    assert!(info.created && info.epoch == 1 && info.state == b"init");
    let again = e.open_session_with_state_async("s", None).await.unwrap();
    assert!(!again.created && again.state == b"init");
    assert!(matches!(
        e.open_session_with_state_async("", None).await,
        Err(Error::InvalidArgument { .. })
    ));

    e.set_session_state_async("s", b"v2".to_vec())
        .await
        .unwrap();
    assert_eq!(e.session("s").unwrap().unwrap().state, b"v2");
    assert!(matches!(
        e.set_session_state_async("nobody", Vec::new()).await,
        Err(Error::UnknownSession)
    ));

    let first = stream(&e, "s");
    let advanced = e.advance_epoch_async("s").await.unwrap();
    assert_eq!((advanced.epoch, advanced.superseded), (2, vec![first]));

    let open = e
        .open_stream_async(OpenStream {
            session: "s".into(),
            epoch: 2,
            correlation: Some("r2".into()),
            lease_ms: None,
        })
        .await
        .unwrap()
        .stream;
    assert!(matches!(
        e.open_stream_async(OpenStream {
            session: "s".into(),
            epoch: 1,
            correlation: None,
            lease_ms: None,
        })
        .await,
        Err(Error::StaleEpoch { .. })
    ));
    let done = e
        .open_stream_async(OpenStream {
            session: "s".into(),
            epoch: 2,
            correlation: None,
            lease_ms: None,
        })
        .await
        .unwrap()
        .stream;
    let frame = NewEvent::new("result", b"ok".to_vec());
    let t = e
        .complete_async("s", done, Some(1), frame.clone())
        .await
        .unwrap();
    assert!(!t.duplicate && t.state == StreamState::Completed);
    let retried = e.complete_async("s", done, Some(1), frame).await.unwrap();
    assert!(retried.duplicate && retried.terminal_seq == t.terminal_seq);
    let aborted = e
        .abort_async("s", open, "producer gone", None)
        .await
        .unwrap();
    assert_eq!(aborted.state, StreamState::Aborted);
    let outcome = e.stream_outcome("s", open).unwrap().unwrap();
    assert_eq!(outcome.reason.as_deref(), Some("producer gone"));
    assert!(matches!(
        e.abort_async("s", open, "again", None).await,
        Err(Error::StreamTerminated { .. })
    ));

    let last = e
        .open_stream(OpenStream {
            session: "s".into(),
            epoch: 2,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream;
    let expired = e.expire_session_async("s").await.unwrap();
    assert_eq!(expired.aborted, vec![last]);
    assert!(e.session("s").unwrap().unwrap().expired);
    assert!(matches!(
        e.expire_session_async("s").await,
        Err(Error::SessionExpired)
    ));
}
