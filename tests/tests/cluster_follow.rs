//! A live `Read(follow)` on a cluster member ends, naming the new leader, the moment that
//! member stops leading — instead of waiting for events it will not apply in time (or ever,
//! if it is cut off) — and the client resumes on the new leader after its last event with
//! no duplicate and no gap (issue 19 item 3).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cursorlog_tests::{absorb, event, free_addr, pb, run_tool, start_member, ReadAll, Server};
use pb::cursor_log_client::CursorLogClient;
use tonic::transport::Channel;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(60);

async fn connect(addr: &str) -> CursorLogClient<Channel> {
    CursorLogClient::new(
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy(),
    )
}

/// The address of the member that accepts `OpenSession` (an idempotent write) now.
async fn leader(addrs: &[String]) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        for a in addrs {
            let r = connect(a)
                .await
                .open_session(pb::OpenSessionRequest {
                    session: "s".into(),
                    state: None,
                })
                .await;
            if r.is_ok() {
                return a.clone();
            }
        }
        assert!(Instant::now() < deadline, "no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn append(c: &mut CursorLogClient<Channel>, stream: u64, seq: u64) {
    c.append(pb::AppendRequest {
        session: "s".into(),
        stream,
        expected_next_seq: Some(seq),
        events: vec![event("progress", format!("event {seq}").as_bytes())],
    })
    .await
    .unwrap();
}

fn follow(cursor: String) -> pb::ReadRequest {
    pb::ReadRequest {
        session: "s".into(),
        last_event_id: cursor,
        declared_stream: None,
        follow: true,
        batch_events_max: 0,
        resume_own_stream: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_on_a_deposed_leader_ends_with_the_new_leader_and_resumes_there_exactly_once() {
    let addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let _servers: Vec<Server> = (0..3)
        .map(|i| start_member(i + 1, &addrs, dirs[i].path(), &[]))
        .collect();
    let first = leader(&addrs).await;
    let mut c = connect(&first).await;
    let stream = c
        .open_stream(pb::OpenStreamRequest {
            session: "s".into(),
            epoch: 1,
            correlation: None,
            lease_ms: None,
        })
        .await
        .unwrap()
        .into_inner()
        .stream;
    for seq in 1..=3 {
        append(&mut c, stream, seq).await;
    }
    let mut reading = c
        .read(follow(format!("1-{stream}-0")))
        .await
        .unwrap()
        .into_inner();
    let mut got = ReadAll::default();
    while got.events.len() < 3 {
        absorb(&mut got, reading.message().await.unwrap().unwrap());
    }

    // The leader leaves the cluster: it stops leading, and its live follow says where to go.
    let first_id = addrs.iter().position(|a| *a == first).unwrap() + 1;
    let (status, out, err) = run_tool(&[
        "cluster",
        "remove",
        "--id",
        &first_id.to_string(),
        "--members",
        &addrs.join(","),
    ]);
    assert!(status.success(), "{out}\n{err}");
    let ended = tokio::time::timeout(WAIT, reading.message())
        .await
        .expect("the follow ends when its member stops leading")
        .unwrap_err();
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
    let hint = ended
        .metadata()
        .get("cursorlog-leader")
        .map(|v| v.to_str().unwrap().to_owned());
    let rest: Vec<String> = addrs.iter().filter(|a| **a != first).cloned().collect();
    let next = match hint {
        Some(h) => h,
        None => leader(&rest).await,
    };
    assert_ne!(next, first);

    // The client resumes after the last event it received, on the new leader.
    let last = got.events.last().unwrap();
    let cursor = format!("1-{stream}-{}", last.seq);
    let mut c = connect(&leader(&rest).await).await;
    for seq in 4..=6 {
        append(&mut c, stream, seq).await;
    }
    c.complete(pb::CompleteRequest {
        session: "s".into(),
        stream,
        expected_next_seq: Some(7),
        terminal: Some(event("result", b"done")),
    })
    .await
    .unwrap();
    let mut reading = c.read(follow(cursor)).await.unwrap().into_inner();
    let mut rest_of_it = ReadAll::default();
    while rest_of_it.end.is_none() {
        let msg = tokio::time::timeout(WAIT, reading.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        absorb(&mut rest_of_it, msg);
    }
    let seqs: Vec<u64> = got
        .events
        .iter()
        .chain(&rest_of_it.events)
        .map(|e| e.seq)
        .collect();
    assert_eq!(
        seqs,
        (1..=7).collect::<Vec<_>>(),
        "every event exactly once"
    );
}
