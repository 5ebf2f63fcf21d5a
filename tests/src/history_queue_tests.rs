//! The checker on hand-built histories of a task's queue and its cancellation: the answers
//! with no log entry (an empty dequeue) and the queue-full refusal are claims like any other.

use super::tests::*;
use super::*;
use tonic::Code;

fn enqueue(tag: u64) -> Call {
    Call::Enqueue { tag }
}

fn enqueued(qseq: u64) -> Answer {
    Answer::Enqueued {
        qseq,
        duplicate: false,
    }
}

fn dequeue(max: u32, tag: u64) -> Call {
    Call::Dequeue { max, tag }
}

fn dequeued(messages: &[(u64, u64)]) -> Answer {
    Answer::Dequeued {
        messages: messages.to_vec(),
        duplicate: false,
    }
}

fn full() -> Answer {
    refused(
        Code::ResourceExhausted,
        "the queue of task \"t\" is full: 4 messages (max 3); dequeue first",
    )
}

/// The task set up, then messages 100, 101 enqueued in sequence (qseqs 1, 2), ending at 35 ms.
fn queued() -> Vec<Op> {
    let mut h = task_setup();
    h.push(op(0, 20, 25, enqueue(100), enqueued(1)));
    h.push(op(0, 30, 35, enqueue(101), enqueued(2)));
    h
}

#[test]
fn messages_come_out_in_order_and_a_full_or_empty_queue_is_said_so() {
    let mut h = queued();
    h.push(op(1, 40, 45, enqueue(102), enqueued(3)));
    h.push(op(2, 50, 55, enqueue(103), full()));
    h.push(op(
        0,
        60,
        65,
        dequeue(2, 1),
        dequeued(&[(1, 100), (2, 101)]),
    ));
    h.push(op(1, 70, 75, dequeue(2, 2), dequeued(&[(3, 102)])));
    h.push(op(2, 80, 85, dequeue(1, 3), dequeued(&[])));
    // The queue outlives the task's end.
    h.push(op(0, 90, 95, Call::CancelTask, task(3, 5, false)));
    h.push(op(1, 100, 105, enqueue(104), enqueued(4)));
    assert_ok(&h);
}

#[test]
fn concurrent_dequeues_split_the_messages_in_some_order() {
    let mut h = queued();
    h.push(op(1, 40, 60, dequeue(1, 1), dequeued(&[(2, 101)])));
    h.push(op(2, 40, 60, dequeue(1, 2), dequeued(&[(1, 100)])));
    assert_ok(&h);
    // An unknown dequeue may have taken the first message.
    let mut h = queued();
    h.push(op(1, 40, 45, dequeue(1, 1), unknown()));
    h.push(op(2, 50, 55, dequeue(1, 2), dequeued(&[(2, 101)])));
    assert_ok(&h);
}

#[test]
fn an_empty_dequeue_while_messages_wait_is_rejected() {
    let mut h = queued();
    h.push(op(1, 40, 45, dequeue(1, 1), dequeued(&[])));
    assert_violation(&h);
}

#[test]
fn a_message_delivered_twice_or_out_of_order_is_rejected() {
    let mut h = queued();
    h.push(op(1, 40, 45, dequeue(1, 1), dequeued(&[(1, 100)])));
    h.push(op(2, 50, 55, dequeue(1, 2), dequeued(&[(1, 100)])));
    assert_violation(&h);
    let mut h = queued();
    h.push(op(1, 40, 45, dequeue(1, 1), dequeued(&[(2, 101)])));
    assert_violation(&h);
}

#[test]
fn a_full_queue_with_room_or_a_qseq_out_of_turn_is_rejected() {
    let mut h = queued();
    h.push(op(1, 40, 45, enqueue(102), full()));
    assert_violation(&h);
    let mut h = queued();
    h.push(op(1, 40, 45, enqueue(102), enqueued(2)));
    assert_violation(&h);
}

#[test]
fn a_cancel_ends_a_running_task_once() {
    let mut h = task_setup();
    h.push(op(0, 20, 25, Call::CancelTask, task(3, 5, false)));
    h.push(op(1, 30, 35, Call::CancelTask, task(3, 5, true)));
    h.push(op(
        2,
        40,
        45,
        Call::FinishTask { expected: None },
        refused(
            Code::FailedPrecondition,
            "task \"t\" is cancelled: a task that ended never changes",
        ),
    ));
    assert_ok(&h);
    // A second cancel that claims it ended the task again.
    let mut h = task_setup();
    h.push(op(0, 20, 25, Call::CancelTask, task(3, 5, false)));
    h.push(op(1, 30, 35, Call::CancelTask, task(4, 5, false)));
    assert_violation(&h);
    // "Already terminal" for a task still running.
    let mut h = task_setup();
    h.push(op(0, 20, 25, Call::CancelTask, task(2, 2, true)));
    assert_violation(&h);
}

#[test]
fn the_servers_queue_full_refusal_parses_as_a_claim() {
    assert!(matches!(
        full(),
        Answer::Refused {
            claim: Claim::QueueFull,
            ..
        }
    ));
    // Any other RESOURCE_EXHAUSTED (the server's own bounds) claims nothing.
    assert!(matches!(
        refused(Code::ResourceExhausted, "the writer queue is full"),
        Answer::Unknown { .. }
    ));
}
