//! The checker on hand-built histories: valid ones (concurrent calls, calls whose outcome
//! is unknown) pass, and each lie of issue 30 item 1 is rejected.

use super::*;
use tonic::{Code, Status};

pub(super) const BUDGET: usize = 200_000;

/// A call of `client` to member `member` from `start` to `end` (ms).
pub(super) fn op(client: usize, start: u64, end: u64, call: Call, answer: Answer) -> Op {
    Op {
        client,
        member: client % 3,
        session: "S".into(),
        call,
        start: start * 1_000_000,
        end: end * 1_000_000,
        answer,
        phase: "test".into(),
    }
}

pub(super) fn refused(code: Code, message: &str) -> Answer {
    Answer::from_status(&Status::new(code, message))
}

pub(super) fn unknown() -> Answer {
    Answer::from_status(&Status::new(Code::Unavailable, "deadline"))
}

pub(super) fn opened_session(epoch: u64, created: bool) -> Answer {
    Answer::Session {
        epoch,
        created: Some(created),
    }
}

pub(super) fn appended(first: u64, last: u64) -> Answer {
    Answer::Appended {
        first,
        last,
        duplicate: false,
    }
}

pub(super) fn append(stream: u64, expected: u64, events: u64) -> Call {
    Call::Append {
        stream,
        expected,
        events,
        tag: tag_of(stream, expected),
        via: Via::Unary,
    }
}

/// The tag of the one call in these histories that writes at `expected` on `stream`.
pub(super) fn tag_of(stream: u64, expected: u64) -> u64 {
    stream * 1000 + expected
}

/// Session S created, stream 10 opened at epoch 1, `n` events appended one by one, all in
/// sequence (client 0), ending at time `10 * (n + 2)` ms.
pub(super) fn setup(n: u64) -> Vec<Op> {
    let mut h = vec![
        op(0, 0, 5, Call::OpenSession, opened_session(1, true)),
        op(
            0,
            10,
            15,
            Call::OpenStream { epoch: 1 },
            Answer::Opened {
                stream: 10,
                epoch: 1,
            },
        ),
    ];
    for k in 1..=n {
        h.push(op(
            0,
            10 + 10 * k,
            15 + 10 * k,
            append(10, k, 1),
            appended(k, k),
        ));
    }
    h
}

pub(super) fn assert_ok(h: &[Op]) {
    match check_key(h, BUDGET) {
        Verdict::Ok => {}
        v => panic!("a valid history was rejected: {v:?}"),
    }
}

pub(super) fn assert_violation(h: &[Op]) -> Vec<Op> {
    match check_key(h, BUDGET) {
        Verdict::Violation { witness, stuck } => {
            eprintln!("witness:\n{}", {
                let mut s = String::new();
                for o in &witness {
                    s.push_str(&format!("  {o}\n"));
                }
                s
            });
            eprintln!("{stuck}");
            witness
        }
        v => panic!("a lie was not caught: {v:?}"),
    }
}

#[test]
fn a_sequential_history_is_accepted() {
    let mut h = setup(3);
    h.push(op(
        1,
        100,
        110,
        Call::KeepAlive { stream: 10 },
        Answer::Alive,
    ));
    h.push(op(
        2,
        120,
        130,
        Call::Resolve {
            stream: 10,
            epoch: 1,
        },
        Answer::Resolved {
            verdict: 1,
            current_epoch: Some(1),
            phase: Some(Phase::Open),
            head: Some(3),
        },
    ));
    h.push(op(
        1,
        140,
        150,
        Call::Complete {
            stream: 10,
            expected: 4,
            tag: tag_of(10, 4),
            via: Via::Unary,
        },
        Answer::Completed {
            terminal_seq: 4,
            duplicate: false,
        },
    ));
    h.push(op(
        2,
        160,
        170,
        append(10, 5, 1),
        refused(
            Code::FailedPrecondition,
            "stream 10 is terminated (completed) at seq 4",
        ),
    ));
    assert_ok(&h);
}

#[test]
fn concurrent_appends_are_accepted_in_either_order() {
    let mut h = setup(0);
    // Two clients race for seq 1: one wins, the other is told the head is 1. Their calls
    // overlap, and the loser's answer comes back first.
    h.push(op(1, 20, 60, append(10, 1, 1), appended(1, 1)));
    h.push(op(
        2,
        25,
        40,
        append(10, 1, 1),
        refused(
            Code::Aborted,
            "seq conflict on stream 10: expected next seq 1, stream head is 1: conflict",
        ),
    ));
    assert_ok(&h);
}

#[test]
fn an_unknown_outcome_may_have_taken_effect_or_not() {
    let mut h = setup(2);
    // Timed out: took effect (the head is 3 later) ...
    h.push(op(1, 40, 4000, append(10, 3, 1), unknown()));
    h.push(op(
        2,
        5000,
        5010,
        append(10, 3, 1),
        refused(
            Code::Aborted,
            "seq conflict on stream 10: expected next seq 3, stream head is 3: x",
        ),
    ));
    // ... and an unknown AdvanceEpoch that never took effect.
    h.push(op(1, 5020, 9000, Call::AdvanceEpoch, unknown()));
    h.push(op(
        2,
        9010,
        9020,
        Call::GetSession,
        Answer::Session {
            epoch: 1,
            created: None,
        },
    ));
    // A read that got no answer says nothing.
    h.push(op(0, 9030, 9040, Call::KeepAlive { stream: 10 }, unknown()));
    assert_ok(&h);
}

#[test]
fn an_unknown_write_may_take_effect_long_after_it_started() {
    let mut h = setup(1);
    h.push(op(1, 30, 100, Call::AdvanceEpoch, unknown()));
    h.push(op(
        2,
        200,
        210,
        Call::GetSession,
        Answer::Session {
            epoch: 1,
            created: None,
        },
    ));
    h.push(op(
        2,
        300,
        310,
        Call::GetSession,
        Answer::Session {
            epoch: 2,
            created: None,
        },
    ));
    assert_ok(&h);
}

#[test]
fn a_stale_epoch_from_a_deposed_leader_is_rejected() {
    let mut h = setup(0);
    h.push(op(
        1,
        20,
        30,
        Call::AdvanceEpoch,
        Answer::Advanced {
            epoch: 2,
            superseded: vec![10],
        },
    ));
    h.push(op(
        2,
        40,
        50,
        Call::OpenStream { epoch: 2 },
        refused(
            Code::FailedPrecondition,
            "stale epoch 2: the session's current epoch is 1",
        ),
    ));
    let w = assert_violation(&h);
    assert!(w
        .iter()
        .any(|o| matches!(o.call, Call::OpenStream { epoch: 2 })));
}

#[test]
fn head_3_when_the_head_was_7_is_rejected() {
    let mut h = setup(6);
    h.push(op(
        2,
        200,
        210,
        append(10, 7, 1),
        refused(
            Code::Aborted,
            "seq conflict on stream 10: expected next seq 7, stream head is 3 (a gap)",
        ),
    ));
    assert_violation(&h);
}

#[test]
fn not_found_for_a_stream_acknowledged_before_the_call_is_rejected() {
    let mut h = setup(0);
    h.push(op(
        2,
        20,
        30,
        append(10, 1, 1),
        refused(Code::NotFound, "stream 10 not found in this session"),
    ));
    let w = assert_violation(&h);
    // The witness keeps what proves it: the stream's creation and the refusal.
    assert!(w.iter().any(|o| matches!(o.answer, Answer::Opened { .. })));
    // A NOT_FOUND concurrent with the creation is fine.
    let mut h = setup(0);
    h[1].end = 100_000_000;
    h.push(op(
        2,
        20,
        30,
        append(10, 1, 1),
        refused(Code::NotFound, "stream 10 not found in this session"),
    ));
    assert_ok(&h);
}

#[test]
fn open_session_at_epoch_1_after_epoch_2_was_acknowledged_is_rejected() {
    let mut h = setup(0);
    h.push(op(
        1,
        20,
        30,
        Call::AdvanceEpoch,
        Answer::Advanced {
            epoch: 2,
            superseded: vec![10],
        },
    ));
    h.push(op(2, 40, 50, Call::OpenSession, opened_session(1, false)));
    assert_violation(&h);
}

#[test]
fn keep_alive_of_a_superseded_stream_is_rejected() {
    let mut h = setup(1);
    h.push(op(
        1,
        40,
        50,
        Call::AdvanceEpoch,
        Answer::Advanced {
            epoch: 2,
            superseded: vec![10],
        },
    ));
    h.push(op(2, 60, 70, Call::KeepAlive { stream: 10 }, Answer::Alive));
    assert_violation(&h);
    // Concurrent with the AdvanceEpoch it is fine.
    let mut h = setup(1);
    h.push(op(
        1,
        40,
        80,
        Call::AdvanceEpoch,
        Answer::Advanced {
            epoch: 2,
            superseded: vec![10],
        },
    ));
    h.push(op(2, 60, 70, Call::KeepAlive { stream: 10 }, Answer::Alive));
    assert_ok(&h);
}

#[test]
fn a_lost_acknowledged_append_is_rejected() {
    let mut h = setup(3);
    // The next leader lost seq 3: it accepts seq 3 again.
    h.push(op(1, 100, 110, append(10, 3, 1), appended(3, 3)));
    assert_violation(&h);
}

#[test]
fn a_retry_safe_refusal_is_a_claim_that_nothing_happened() {
    let mut h = setup(0);
    let mut status = Status::new(Code::Unavailable, "this node is not the leader");
    status
        .metadata_mut()
        .insert("cursorlog-retry", "safe".parse().unwrap());
    h.push(op(
        1,
        20,
        30,
        append(10, 1, 1),
        Answer::from_status(&status),
    ));
    // Yet seq 1 is there.
    h.push(op(
        2,
        40,
        50,
        Call::Resolve {
            stream: 10,
            epoch: 1,
        },
        Answer::Resolved {
            verdict: 1,
            current_epoch: Some(1),
            phase: Some(Phase::Open),
            head: Some(1),
        },
    ));
    assert_violation(&h);
}

#[test]
fn many_unknown_writes_stay_decidable() {
    // A cut-off leader times out on every call for a while: 40 unknown appends and opens.
    let mut h = setup(5);
    for k in 0..40 {
        let call = if k % 4 == 0 {
            Call::OpenSession
        } else {
            append(10, 6 + k % 3, 1)
        };
        h.push(op(1 + k as usize % 2, 100 + k, 3000 + k, call, unknown()));
    }
    h.push(op(0, 4000, 4010, append(10, 6, 2), appended(6, 7)));
    h.push(op(
        0,
        4020,
        4030,
        append(10, 9, 1),
        refused(
            Code::Aborted,
            "seq conflict on stream 10: expected next seq 9, stream head is 7: x",
        ),
    ));
    assert_ok(&h);
}

#[test]
fn the_report_names_the_session_and_its_witness() {
    let mut h = setup(6);
    h.push(op(
        2,
        200,
        210,
        append(10, 7, 1),
        refused(
            Code::Aborted,
            "seq conflict on stream 10: expected next seq 7, stream head is 3 (a gap)",
        ),
    ));
    // A second lie in the same session is reported too.
    h.push(op(1, 300, 310, Call::OpenSession, opened_session(1, true)));
    let report = check(&h, BUDGET);
    assert_eq!(report.sessions_with_violations, 1);
    assert_eq!(report.violations.len(), 2, "{}", report.render());
    let text = report.render();
    assert!(text.contains("VIOLATION in session \"S\""), "{text}");
    assert!(text.contains("stream head is 3"), "{text}");
}

#[test]
fn a_search_out_of_budget_is_undecided_not_passed() {
    let mut h = setup(5);
    h.push(op(1, 100, 110, append(10, 6, 1), appended(6, 6)));
    assert!(matches!(check_key(&h, 3), Verdict::Undecided));
    let report = check(&h, 3);
    assert_eq!(report.undecided, vec!["S".to_owned()]);
    assert_eq!(report.ok, 0);
}

pub(super) fn task(version: u64, status: i32, duplicate: bool) -> Answer {
    Answer::Task {
        version,
        status,
        duplicate,
        created: None,
    }
}

pub(super) fn update(input: bool, message: u64, expected: Option<u64>) -> Call {
    Call::UpdateTask {
        input,
        message,
        expected,
    }
}

/// The session's task created (version 1) and moved to input_required with message 1
/// (version 2), in sequence.
pub(super) fn task_setup() -> Vec<Op> {
    vec![
        op(
            0,
            0,
            5,
            Call::CreateTask,
            Answer::Task {
                version: 1,
                status: 1,
                duplicate: false,
                created: Some(true),
            },
        ),
        op(0, 10, 15, update(true, 1, None), task(2, 2, false)),
    ]
}

#[test]
fn a_task_history_with_retries_restatements_and_concurrent_writers_is_accepted() {
    let mut h = task_setup();
    // A create retried by its request key: the task as it is now.
    h.push(op(
        1,
        20,
        25,
        Call::CreateTask,
        Answer::Task {
            version: 2,
            status: 2,
            duplicate: false,
            created: Some(false),
        },
    ));
    // Restating writes nothing: same version, duplicate.
    h.push(op(0, 30, 35, update(true, 1, Some(2)), task(2, 2, true)));
    // Two concurrent changes: either order explains them.
    h.push(op(0, 40, 60, update(false, 2, None), task(4, 1, false)));
    h.push(op(1, 41, 59, update(true, 2, None), task(3, 2, false)));
    // A compare-and-set on a version that moved is refused with the true version.
    h.push(op(
        2,
        70,
        75,
        update(false, 1, Some(3)),
        refused(
            Code::Aborted,
            "task \"t\" is at version 4, not 3: read it again and retry",
        ),
    ));
    h.push(op(
        0,
        80,
        85,
        Call::FinishTask { expected: None },
        task(5, 3, false),
    ));
    // A retried end is a duplicate; any other change is refused: it ended.
    h.push(op(
        1,
        90,
        95,
        Call::FinishTask { expected: Some(4) },
        task(5, 3, true),
    ));
    h.push(op(
        2,
        100,
        105,
        update(false, 1, None),
        refused(
            Code::FailedPrecondition,
            "task is completed: task \"t\" ended and never changes again",
        ),
    ));
    h.push(op(
        0,
        110,
        115,
        Call::GetTask,
        Answer::TaskRead {
            found: Some((5, 3)),
        },
    ));
    assert_ok(&h);
}

#[test]
fn a_task_read_from_before_an_acknowledged_change_is_rejected() {
    let mut h = task_setup();
    h.push(op(
        1,
        20,
        25,
        Call::GetTask,
        Answer::TaskRead {
            found: Some((1, 1)),
        },
    ));
    assert_violation(&h);
}

#[test]
fn a_restated_change_that_bumps_the_version_is_rejected() {
    // Issue 30 item 7: a restating UpdateTask answered duplicate false at a new version.
    let mut h = task_setup();
    h.push(op(0, 20, 25, update(true, 1, None), task(3, 2, false)));
    assert_violation(&h);
}

#[test]
fn not_found_for_an_acknowledged_task_is_rejected() {
    let mut h = task_setup();
    h.push(op(
        1,
        20,
        25,
        update(false, 2, None),
        refused(Code::NotFound, "task not found: \"t\""),
    ));
    assert_violation(&h);
}

#[test]
fn an_unknown_task_write_may_have_taken_effect_or_not() {
    let mut h = task_setup();
    h.push(op(1, 20, 25, update(false, 2, None), unknown()));
    h.push(op(
        0,
        30,
        35,
        Call::GetTask,
        Answer::TaskRead {
            found: Some((3, 1)),
        },
    ));
    assert_ok(&h);
    let mut h = task_setup();
    h.push(op(1, 20, 25, update(false, 2, None), unknown()));
    h.push(op(
        0,
        30,
        35,
        Call::GetTask,
        Answer::TaskRead {
            found: Some((2, 2)),
        },
    ));
    assert_ok(&h);
}

#[test]
fn the_servers_task_refusals_parse_as_claims() {
    // The texts `server/src/status.rs` sends: a change here must change the parser too, or
    // every such refusal would be an unexplained answer.
    let claim = |code: Code, message: &str| match refused(code, message) {
        Answer::Refused { claim, .. } => claim,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        claim(
            Code::FailedPrecondition,
            "task is completed: task \"t\" ended and never changes again"
        ),
        Claim::TaskEnded { status: Some(3) }
    );
    assert_eq!(
        claim(Code::NotFound, "task not found: \"t\""),
        Claim::NoTask
    );
    assert_eq!(
        claim(
            Code::Aborted,
            "task \"t\" is at version 4, not 3: read it again and retry"
        ),
        Claim::TaskVersion(4)
    );
}
