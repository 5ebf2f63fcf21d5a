//! The checker on hand-built histories of the stream calls beyond append and complete:
//! aborts, the streamed and batched write paths, and follows (a `Read` with `follow`, whose
//! delivered events name the call that wrote them).

use super::tests::*;
use super::*;
use tonic::Code;

fn abort(stream: u64, tag: u64, frame: bool) -> Call {
    Call::Abort { stream, tag, frame }
}

fn ended(terminal_seq: u64) -> Answer {
    Answer::Completed {
        terminal_seq,
        duplicate: false,
    }
}

fn follow() -> Call {
    Call::Follow {
        stream: 10,
        epoch: 1,
    }
}

/// Events `1..=n` of stream 10 as `setup` wrote them (one call per seq).
fn delivered(n: u64) -> Vec<Delivered> {
    (1..=n)
        .map(|seq| Delivered {
            seq,
            tag: tag_of(10, seq),
            k: 0,
        })
        .collect()
}

fn followed(events: Vec<Delivered>, end: FollowEnd) -> Answer {
    Answer::Followed { events, end }
}

#[test]
fn an_abort_ends_the_stream_at_its_head_or_after_its_frame() {
    let mut h = setup(2);
    h.push(op(1, 50, 55, abort(10, 900, true), ended(3)));
    h.push(op(
        2,
        60,
        65,
        append(10, 4, 1),
        refused(
            Code::FailedPrecondition,
            "stream 10 is terminated (aborted) at seq 3",
        ),
    ));
    h.push(op(
        0,
        70,
        75,
        abort(10, 901, false),
        refused(
            Code::FailedPrecondition,
            "stream 10 is terminated (aborted) at seq 3",
        ),
    ));
    assert_ok(&h);

    let mut h = setup(2);
    h.push(op(1, 50, 55, abort(10, 900, false), ended(2)));
    assert_ok(&h);
}

#[test]
fn an_abort_at_the_wrong_seq_or_twice_is_rejected() {
    // Without a frame the terminal seq is the head, not after it.
    let mut h = setup(2);
    h.push(op(1, 50, 55, abort(10, 900, false), ended(3)));
    assert_violation(&h);
    // An abort never conflicts with the head: it names no expected seq.
    let mut h = setup(2);
    h.push(op(
        1,
        50,
        55,
        abort(10, 900, false),
        refused(
            Code::Aborted,
            "seq conflict on stream 10: expected next seq 3, stream head is 2",
        ),
    ));
    assert_violation(&h);
    // A second abort is no retry: the stream had ended.
    let mut h = setup(2);
    h.push(op(1, 50, 55, abort(10, 900, false), ended(2)));
    h.push(op(2, 60, 65, abort(10, 901, false), ended(2)));
    assert_violation(&h);
}

#[test]
fn writes_through_append_stream_and_append_batch_are_the_same_writes() {
    let mut h = setup(1);
    h.push(op(
        1,
        40,
        45,
        Call::Append {
            stream: 10,
            expected: 2,
            events: 2,
            tag: tag_of(10, 2),
            via: Via::Stream,
        },
        appended(2, 3),
    ));
    h.push(op(
        2,
        50,
        55,
        Call::Complete {
            stream: 10,
            expected: 4,
            tag: tag_of(10, 4),
            via: Via::Batch,
        },
        ended(4),
    ));
    assert_ok(&h);
    // A false head claim from a batched append is caught as the unary call's would be.
    h.push(op(
        0,
        60,
        65,
        Call::Append {
            stream: 10,
            expected: 2,
            events: 1,
            tag: 7,
            via: Via::Batch,
        },
        refused(Code::Aborted, "seq conflict: stream head is 1"),
    ));
    assert_violation(&h);
}

#[test]
fn a_follow_that_saw_events_as_they_were_written_is_accepted() {
    let mut h = setup(3);
    // Concurrent with the appends of seqs 2 and 3: it may have seen only some of them.
    h.push(op(
        1,
        25,
        48,
        follow(),
        followed(delivered(2), FollowEnd::Open),
    ));
    // After the stream completed at 4: every event, then the end.
    h.push(op(
        0,
        60,
        65,
        Call::Complete {
            stream: 10,
            expected: 4,
            tag: tag_of(10, 4),
            via: Via::Unary,
        },
        ended(4),
    ));
    h.push(op(
        2,
        50,
        80,
        follow(),
        followed(
            delivered(4),
            FollowEnd::Ended {
                phase: Some(Phase::Completed),
                terminal_seq: 4,
            },
        ),
    ));
    assert_ok(&h);
}

#[test]
fn a_follow_delivering_what_no_call_wrote_there_is_rejected() {
    // An event of another call at an acknowledged seq (a deposed leader's own write).
    let mut h = setup(3);
    let mut events = delivered(3);
    events[2].tag = 555;
    h.push(op(1, 60, 70, follow(), followed(events, FollowEnd::Open)));
    assert_violation(&h);
    // An event past every write.
    let mut h = setup(2);
    let mut events = delivered(2);
    events.push(Delivered {
        seq: 3,
        tag: tag_of(10, 3),
        k: 0,
    });
    h.push(op(1, 60, 70, follow(), followed(events, FollowEnd::Open)));
    assert_violation(&h);
    // A gap.
    let mut h = setup(3);
    let mut events = delivered(3);
    events.remove(1);
    h.push(op(1, 60, 70, follow(), followed(events, FollowEnd::Open)));
    assert_violation(&h);
}

#[test]
fn a_follow_ended_before_the_streams_end_or_at_another_seq_is_rejected() {
    // The stream is open: no end may be reported.
    let mut h = setup(2);
    h.push(op(
        1,
        60,
        70,
        follow(),
        followed(
            delivered(2),
            FollowEnd::Ended {
                phase: Some(Phase::Completed),
                terminal_seq: 2,
            },
        ),
    ));
    assert_violation(&h);
    // Aborted at 2, reported ended at 1 with an event missing.
    let mut h = setup(2);
    h.push(op(1, 50, 55, abort(10, 900, false), ended(2)));
    h.push(op(
        2,
        60,
        70,
        follow(),
        followed(
            delivered(1),
            FollowEnd::Ended {
                phase: Some(Phase::Aborted),
                terminal_seq: 1,
            },
        ),
    ));
    assert_violation(&h);
    // An odd end is never explained.
    let mut h = setup(1);
    h.push(op(
        1,
        60,
        70,
        follow(),
        followed(delivered(1), FollowEnd::Odd("a gap".into())),
    ));
    assert_violation(&h);
}

#[test]
fn a_delivered_payload_names_its_call() {
    assert_eq!(
        Delivered::parse(7, b"h12/4294967299/1"),
        Some(Delivered {
            seq: 7,
            tag: 4_294_967_299,
            k: 1
        })
    );
    assert_eq!(Delivered::parse(7, b"not ours"), None);
}
