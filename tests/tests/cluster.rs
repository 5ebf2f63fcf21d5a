//! Three real `cursorlog serve --node-id … --peers …` processes on one machine (issue 19):
//! writes go to the leader; a follower answers `UNAVAILABLE` naming the leader (in the
//! message and the `cursorlog-leader` header) and never a verdict of its own; killing the
//! leader with SIGKILL loses no acknowledged event, and the new leader continues the same
//! stream; a killed member restarted on its directory catches up and can lead.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cursorlog_tests::{event, free_addr, pb, read_all, read_request, start_member, Server};
use tonic::Code;

/// The bound of one wait (elections on a loaded 2-core machine included).
const WAIT: Duration = Duration::from_secs(60);

struct Cluster {
    addrs: Vec<String>,
    dirs: Vec<tempfile::TempDir>,
    nodes: Vec<Option<Server>>,
}

impl Cluster {
    fn start_node(&mut self, i: usize) {
        self.nodes[i] = Some(start_member(i + 1, &self.addrs, self.dirs[i].path(), &[]));
    }

    fn new() -> Self {
        let mut c = Self {
            addrs: (0..3).map(|_| free_addr()).collect(),
            dirs: (0..3).map(|_| tempfile::tempdir().unwrap()).collect(),
            nodes: vec![None, None, None],
        };
        for i in 0..3 {
            c.start_node(i);
        }
        c
    }

    async fn client(
        &self,
        i: usize,
    ) -> pb::cursor_log_client::CursorLogClient<tonic::transport::Channel> {
        self.nodes[i].as_ref().unwrap().client().await
    }

    /// The member that accepts a write now: tries each live member, follows the leader
    /// hints, until one opens `session` (an idempotent write).
    async fn leader(&self, session: &str) -> usize {
        let deadline = Instant::now() + WAIT;
        loop {
            for i in 0..3 {
                if self.nodes[i].is_none() {
                    continue;
                }
                let mut c = self.client(i).await;
                match c
                    .open_session(pb::OpenSessionRequest {
                        session: session.into(),
                        state: None,
                    })
                    .await
                {
                    Ok(_) => return i,
                    Err(s) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
                }
            }
            assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn append(
    c: &mut pb::cursor_log_client::CursorLogClient<tonic::transport::Channel>,
    stream: u64,
    first: u64,
    n: u64,
) -> pb::AppendResponse {
    c.append(pb::AppendRequest {
        session: "s".into(),
        stream,
        expected_next_seq: Some(first),
        events: (first..first + n)
            .map(|i| event("progress", format!("event {i}").as_bytes()))
            .collect(),
    })
    .await
    .unwrap()
    .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_keep_every_acknowledged_event_across_a_leader_kill() {
    let mut cluster = Cluster::new();
    let leader = cluster.leader("s").await;
    let mut c = cluster.client(leader).await;
    let stream = c
        .open_stream(pb::OpenStreamRequest {
            session: "s".into(),
            epoch: 1,
            correlation: Some("call-1".into()),
            lease_ms: None,
        })
        .await
        .unwrap()
        .into_inner()
        .stream;
    let acked = append(&mut c, stream, 1, 5).await;
    let cursor5 = acked.event_ids.last().unwrap().clone();

    // A follower gives no verdict of its own: UNAVAILABLE, naming the leader.
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let err = cluster
        .client(follower)
        .await
        .resolve(pb::ResolveRequest {
            session: "s".into(),
            last_event_id: cursor5.clone(),
            declared_stream: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let hint = err
        .metadata()
        .get("cursorlog-leader")
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(hint, cluster.addrs[leader]);
    assert!(err.message().contains(&cluster.addrs[leader]), "{err:?}");

    // SIGKILL the leader: a new one is elected and serves every acknowledged event.
    cluster.nodes[leader].as_mut().unwrap().kill();
    cluster.nodes[leader] = None;
    let new_leader = cluster.leader("s").await;
    assert_ne!(new_leader, leader);
    let mut c = cluster.client(new_leader).await;
    let verdict = c
        .resolve(pb::ResolveRequest {
            session: "s".into(),
            last_event_id: cursor5.clone(),
            declared_stream: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(verdict.verdict(), pb::Verdict::Resumable, "{verdict:?}");
    // The stream continues at seq 6; a retry of an acknowledged batch is not appended twice.
    append(&mut c, stream, 6, 3).await;
    append(&mut c, stream, 6, 3).await;
    c.complete(pb::CompleteRequest {
        session: "s".into(),
        stream,
        expected_next_seq: Some(9),
        terminal: Some(event("result", b"done")),
    })
    .await
    .unwrap();

    // The killed member restarts on its directory; then the current leader is killed, so
    // the restarted member must have caught up for the cluster to serve everything.
    cluster.start_node(leader);
    cluster.nodes[new_leader].as_mut().unwrap().kill();
    cluster.nodes[new_leader] = None;
    let third = cluster.leader("s").await;
    let mut c = cluster.client(third).await;
    // The client resuming its own (finished) stream from its start gets all of it.
    let mut request = read_request("s", &format!("1-{stream}-0"), false);
    request.resume_own_stream = true;
    let all = read_all(&mut c, request, WAIT).await;
    assert!(all.error.is_none(), "{:?}", all.error);
    let seqs: Vec<u64> = all.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=9).collect::<Vec<_>>(), "{all:?}");
    for e in &all.events[..8] {
        assert_eq!(&e.payload[..], format!("event {}", e.seq).as_bytes());
    }
    assert_eq!(&all.events[8].payload[..], b"done");
}
