//! Retention's ordering guarantees, driven through `run_pass` with a `submit` that can lose
//! or fail chosen commands on their way to the real writer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

use super::run_pass;
use crate::mailbox::{submit, Command, Reply};
use crate::{Config, Engine, Error, NewEvent, OpenStream};

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.segment_bytes_max = 4096;
    c.retention.check_interval = Duration::from_secs(3600);
    c.disk_reserve_bytes = 0;
    c
}

fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".seg")
        })
        .count()
}

/// A stream filled over many small segments, trimmed so that the oldest few are retirable;
/// its session and stream were born in the first segment, so retiring needs a carry-forward.
fn retirable_engine(dir: &Path) -> (Engine, u64) {
    let e = Engine::open(config(dir)).unwrap();
    let epoch = e.open_session("s").unwrap().epoch;
    let stream = e
        .open_stream(OpenStream {
            session: "s".into(),
            epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream;
    for i in 0..120u8 {
        e.append(crate::Append {
            session: "s".into(),
            stream,
            expected_next_seq: None,
            events: vec![NewEvent::new("p", vec![i; 200])],
        })
        .unwrap();
    }
    e.trim("s", stream, 90).unwrap();
    (e, stream)
}

fn kind(cmd: &Command) -> &'static str {
    match cmd {
        Command::CarryForward { .. } => "carry",
        Command::Retire { .. } => "retire",
        Command::Forget { .. } => "forget",
        Command::Trim { .. } => "trim",
        _ => "other",
    }
}

/// Runs a pass whose commands go to the real writer through `intercept`, which may answer
/// instead of it; returns the pass's result and the kinds of commands the writer received.
fn pass_with(
    e: &Engine,
    intercept: impl Fn(&Command, usize) -> Option<crate::Result<Reply>>,
) -> (crate::Result<usize>, Vec<&'static str>) {
    let shared = &e.inner.shared;
    let tx = e.sender().unwrap();
    let sent = RefCell::new(Vec::new());
    let carries = RefCell::new(0);
    let result = run_pass(
        shared,
        &|cmd| {
            let n = if matches!(cmd, Command::CarryForward { .. }) {
                *carries.borrow_mut() += 1;
                *carries.borrow()
            } else {
                0
            };
            if let Some(answer) = intercept(&cmd, n) {
                return answer;
            }
            sent.borrow_mut().push(kind(&cmd));
            submit(&tx, shared, cmd)
        },
        false,
    );
    (result, sent.into_inner())
}

fn assert_everything_retained_is_served(e: &Engine, stream: u64) {
    let events = e.read("s", stream, 90, 1000).unwrap().events;
    assert_eq!(events.len(), 30, "events 91..=120 are readable");
    assert_eq!(events.first().map(|ev| ev.seq), Some(91));
}

#[test]
fn a_failed_carry_forward_means_no_retirement() {
    let dir = tempfile::tempdir().unwrap();
    let (e, stream) = retirable_engine(dir.path());
    let before = segment_files(dir.path());
    let (result, sent) = pass_with(&e, |cmd, n| {
        (matches!(cmd, Command::CarryForward { .. }) && n == 1).then(|| {
            Err(Error::Internal(
                "injected: the carry-forward group failed".into(),
            ))
        })
    });
    assert!(result.is_err(), "the pass reports the failure: {result:?}");
    assert!(!sent.contains(&"retire"), "nothing retired: {sent:?}");
    assert_eq!(segment_files(dir.path()), before);
    assert_everything_retained_is_served(&e, stream);
    // The next pass carries forward and retires as usual.
    let retired = e.run_retention().unwrap();
    assert!(retired >= 2, "{retired}");
    assert_eq!(segment_files(dir.path()), before - retired);
    e.close().unwrap();
    drop(e);
    let e = Engine::open(config(dir.path())).unwrap();
    assert_everything_retained_is_served(&e, stream);
}

#[test]
fn the_writer_refuses_to_retire_state_that_was_not_carried_forward() {
    let dir = tempfile::tempdir().unwrap();
    let (e, stream) = retirable_engine(dir.path());
    let before = segment_files(dir.path());
    // Every carry-forward "succeeds" without reaching the writer: the retirement arrives
    // with the session's and the stream's state still born in the segments it names.
    let (result, sent) = pass_with(&e, |cmd, _| {
        matches!(cmd, Command::CarryForward { .. }).then_some(Ok(Reply::Count(0)))
    });
    assert!(
        sent.contains(&"retire"),
        "the retirement reached the writer: {sent:?}"
    );
    match result {
        Err(Error::Internal(why)) => assert!(why.contains("carried forward"), "{why}"),
        other => panic!("the writer must refuse: {other:?}"),
    }
    assert_eq!(segment_files(dir.path()), before, "no segment deleted");
    assert!(
        !e.is_poisoned(),
        "a refused retirement is not a write failure"
    );
    assert_everything_retained_is_served(&e, stream);
    let retired = e.run_retention().unwrap();
    assert!(retired >= 2, "{retired}");
    e.close().unwrap();
    drop(e);
    let e = Engine::open(config(dir.path())).unwrap();
    assert_everything_retained_is_served(&e, stream);
    assert_eq!(
        e.resolve("s", &crate::Cursor::new(1, stream, 120).to_string(), None)
            .unwrap()
            .verdict,
        crate::Verdict::Resumable,
        "the stream's state outlived its first segments"
    );
}
