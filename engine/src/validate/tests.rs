use super::*;
use crate::index::Index;
use crate::log::Position;
use crate::record::{EventBody, SessionStateBody, StreamOpened, Terminal};

fn event(stream: u64, seq: u64) -> Record {
    Record::Event(EventBody {
        stream,
        seq,
        at_ms: 0,
        kind: "k".into(),
        correlation: None,
        payload: vec![1],
    })
}

fn opened(stream: u64, session: &str, epoch: u64) -> Record {
    Record::StreamOpened(StreamOpened {
        stream,
        session: session.into(),
        epoch,
        correlation: None,
        lease_ms: None,
        at_ms: 0,
    })
}

/// Applies `records` from LSN 1 on, each checked first; returns the first rejection.
fn run(records: &[Record]) -> Option<(usize, Rejection)> {
    let dir = tempfile::tempdir().expect("dir");
    let index = Index::open(&dir.path().join("index"), 1 << 20).expect("index");
    let mut txn = Txn::new(&index);
    for (i, r) in records.iter().enumerate() {
        let lsn = i as u64 + 1;
        if let Err(why) = validate(&txn, lsn, r).expect("read") {
            return Some((i, why));
        }
        let pos = Position {
            segment: 1,
            offset: 80 + lsn * 100,
            len: 100,
        };
        crate::apply::apply(&mut txn, lsn, pos, r, false).expect("apply");
    }
    None
}

fn session(name: &str) -> Record {
    Record::SessionOpened {
        session: name.into(),
        epoch: 1,
        at_ms: 0,
    }
}

#[test]
fn a_well_formed_history_passes() {
    let ok = [
        session("s"),
        opened(2, "s", 1),
        event(2, 1),
        event(2, 2),
        Record::Trim {
            stream: 2,
            watermark: 2,
            at_ms: 0,
        },
        Record::SessionState(SessionStateBody {
            session: "s".into(),
            state: vec![1],
            at_ms: 0,
        }),
        Record::Terminal(Terminal {
            stream: 2,
            state: StreamState::Completed,
            terminal_seq: 3,
            at_ms: 0,
            reason: None,
            frame: match event(2, 3) {
                Record::Event(e) => Some(e),
                _ => None,
            },
        }),
        Record::EpochAdvanced {
            session: "s".into(),
            epoch: 2,
            at_ms: 0,
        },
        opened(9, "s", 2),
    ];
    assert_eq!(run(&ok), None);
}

#[test]
fn each_rule_refuses_what_breaks_it() {
    let cases: Vec<(Vec<Record>, Rejection)> = vec![
        (
            vec![session("s"), session("s")],
            Rejection::SessionExists("s".into()),
        ),
        (
            vec![opened(1, "nobody", 1)],
            Rejection::UnknownSession("nobody".into()),
        ),
        (
            vec![session("s"), opened(7, "s", 1)],
            Rejection::StreamIdNotLsn { stream: 7, lsn: 2 },
        ),
        (
            vec![session("s"), opened(2, "s", 3)],
            Rejection::StaleEpoch {
                session: "s".into(),
                current: 1,
                given: 3,
            },
        ),
        (
            vec![session("s"), opened(2, "s", 1), event(2, 2)],
            Rejection::SeqNotNext {
                stream: 2,
                seq: 2,
                head: 0,
            },
        ),
        (
            vec![session("s"), opened(2, "s", 1), event(2, 1), event(2, 1)],
            Rejection::SeqNotNext {
                stream: 2,
                seq: 1,
                head: 1,
            },
        ),
        (vec![event(5, 1)], Rejection::UnknownStream(5)),
        (
            vec![
                session("s"),
                opened(2, "s", 1),
                Record::Terminal(Terminal {
                    stream: 2,
                    state: StreamState::Aborted,
                    terminal_seq: 0,
                    at_ms: 0,
                    reason: None,
                    frame: None,
                }),
                event(2, 1),
            ],
            Rejection::StreamEnded {
                stream: 2,
                state: StreamState::Aborted,
            },
        ),
        (
            vec![
                session("s"),
                Record::EpochAdvanced {
                    session: "s".into(),
                    epoch: 1,
                    at_ms: 0,
                },
            ],
            Rejection::EpochNotAhead {
                session: "s".into(),
                current: 1,
                given: 1,
            },
        ),
        (
            vec![
                session("s"),
                Record::SessionExpired {
                    session: "s".into(),
                    at_ms: 0,
                },
                opened(3, "s", 1),
            ],
            Rejection::SessionExpired("s".into()),
        ),
        (
            vec![
                session("s"),
                opened(2, "s", 1),
                event(2, 1),
                Record::Trim {
                    stream: 2,
                    watermark: 3,
                    at_ms: 0,
                },
            ],
            Rejection::BadWatermark {
                stream: 2,
                watermark: 3,
                current: 1,
                limit: 2,
            },
        ),
    ];
    // A stream a deposed leader opened commits before the new leader's epoch advance, which
    // did not know it and so did not end it: its events must not pass.
    let fenced = vec![
        session("s"),
        opened(2, "s", 1),
        Record::EpochAdvanced {
            session: "s".into(),
            epoch: 2,
            at_ms: 0,
        },
        event(2, 1),
    ];
    assert_eq!(
        run(&fenced),
        Some((
            3,
            Rejection::StreamSuperseded {
                stream: 2,
                session: "s".into(),
                stream_epoch: 1,
                current: 2
            }
        ))
    );
    for (records, want) in cases {
        let last = records.len() - 1;
        assert_eq!(run(&records), Some((last, want)), "{records:?}");
    }
}

/// The stream meta a stream opened by `opened(2, "s", 1)` at LSN 2 has after `head` events.
fn stream_meta(head: u64) -> crate::state::StreamMeta {
    crate::state::StreamMeta {
        id: 2,
        session: "s".into(),
        epoch: 1,
        state: StreamState::Open,
        head,
        watermark: 1,
        correlation: None,
        opened_at_ms: 0,
        ended_at_ms: None,
        end_reason: None,
        has_terminal_frame: false,
        lease_ms: None,
    }
}

/// A carried-forward snapshot must restate the state it meets: one planned against an
/// event that was then refused (a stale pipelined plan) would write a head the stream
/// never reached. Forgetting needs the stream ended, the session expired.
#[test]
fn restating_records_must_match_the_state_they_meet() {
    let snap = |head| {
        Record::StreamSnapshot(crate::record::StreamSnapshot {
            meta: stream_meta(head),
            terminal_frame: None,
        })
    };
    let base = || vec![session("s"), opened(2, "s", 1), event(2, 1)];
    let mut exact = base();
    exact.push(snap(1));
    exact.push(Record::SessionSnapshot(crate::state::SessionMeta {
        id: "s".into(),
        epoch: 1,
        opened_at_ms: 0,
        expired_at_ms: None,
    }));
    assert_eq!(run(&exact), None, "an exact restatement passes");

    let cases: Vec<(Record, Rejection)> = vec![
        (snap(2), Rejection::StaleSnapshot("stream 2".into())),
        (
            Record::SessionSnapshot(crate::state::SessionMeta {
                id: "s".into(),
                epoch: 2,
                opened_at_ms: 0,
                expired_at_ms: None,
            }),
            Rejection::StaleSnapshot("session \"s\"".into()),
        ),
        (
            Record::StreamSnapshot(crate::record::StreamSnapshot {
                meta: crate::state::StreamMeta {
                    id: 5,
                    ..stream_meta(1)
                },
                terminal_frame: None,
            }),
            Rejection::UnknownStream(5),
        ),
        (
            Record::StreamForgotten {
                stream: 2,
                at_ms: 0,
            },
            Rejection::ForgottenWhileOpen(2),
        ),
        (
            Record::SessionForgotten {
                session: "s".into(),
                at_ms: 0,
            },
            Rejection::ForgottenWhileLive("s".into()),
        ),
    ];
    for (record, want) in cases {
        let mut history = base();
        history.push(record);
        assert_eq!(run(&history), Some((3, want)));
    }
}
