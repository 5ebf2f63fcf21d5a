//! Two clusters on one machine, one of them misconfigured: cluster B's `--peers` names a member
//! of cluster A as its member 3 (a reused port, a stale configuration; CI once handed two
//! test clusters one port). A's member must refuse B's Raft traffic, by cluster identity, and
//! both clusters keep working: A with all three members, B with the two it really has.
//! Without the identity, A's member would take B's votes and entries as its own cluster's
//! (both have a node 1 in term 1) and mix two clusters' entries in one log.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cursorlog_tests::{event, free_addr, pb, read_all, read_request, start_member, Server};
use tonic::Code;

/// The bound of one wait (elections on a loaded 2-core machine included).
const WAIT: Duration = Duration::from_secs(60);

/// The first of `nodes` that accepts an idempotent write (opens `session`): the leader.
async fn leader(nodes: &[&Server], session: &str) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        for (i, node) in nodes.iter().enumerate() {
            let opened = node
                .client()
                .await
                .open_session(pb::OpenSessionRequest {
                    session: session.into(),
                    state: None,
                })
                .await;
            match opened {
                Ok(_) => return i,
                Err(s) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
            }
        }
        assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens a stream in `session` on `node` and appends `n` events to it; the stream's id.
async fn write(node: &Server, session: &str, n: u64) -> u64 {
    let mut c = node.client().await;
    let epoch = c
        .open_session(pb::OpenSessionRequest {
            session: session.into(),
            state: None,
        })
        .await
        .unwrap()
        .into_inner()
        .epoch;
    let stream = c
        .open_stream(pb::OpenStreamRequest {
            session: session.into(),
            epoch,
            correlation: None,
            lease_ms: None,
        })
        .await
        .unwrap()
        .into_inner()
        .stream;
    c.append(pb::AppendRequest {
        session: session.into(),
        stream,
        expected_next_seq: Some(1),
        events: (1..=n)
            .map(|i| event("progress", format!("{session} {i}").as_bytes()))
            .collect(),
    })
    .await
    .unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_refuses_raft_traffic_of_another_cluster_and_both_clusters_keep_working() {
    let a_addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let a_dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let a: Vec<Server> = (0..3)
        .map(|i| start_member(i + 1, &a_addrs, a_dirs[i].path(), &[]))
        .collect();
    let a_refs: Vec<&Server> = a.iter().collect();
    let a_leader = leader(&a_refs, "a-probe").await;
    let before = write(&a[a_leader], "a-before", 5).await;

    // Cluster B: two real members; its member 3 is A's member 2's address.
    let b_addrs = vec![free_addr(), free_addr(), a_addrs[1].clone()];
    let b_dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let b: Vec<Server> = (0..2)
        .map(|i| start_member(i + 1, &b_addrs, b_dirs[i].path(), &[]))
        .collect();

    assert!(
        a[1].wait_for_log("refused Raft traffic"),
        "A's member 2 did not refuse cluster B's requests; its log:\n{}",
        a[1].logs()
    );
    // B forms and serves with the two members it has.
    let b_refs: Vec<&Server> = b.iter().collect();
    let b_leader = leader(&b_refs, "b-probe").await;
    let b_stream = write(&b[b_leader], "b-only", 3).await;

    // A still has all three members: with its leader's log checked on every member below,
    // and A's member 2 never a member of B.
    let a_leader = leader(&a_refs, "a-probe").await;
    let after = write(&a[a_leader], "a-after", 4).await;
    for (session, stream, n) in [("a-before", before, 5), ("a-after", after, 4)] {
        let all = read_all(
            &mut a[a_leader].client().await,
            read_request(session, &format!("1-{stream}-0"), false),
            WAIT,
        )
        .await;
        assert_eq!(all.events.len(), n, "{session}: {all:?}");
    }
    // Stop A's leader: the other two (member 2 included) elect among themselves and hold
    // everything A acknowledged, which a member that took B's entries would not.
    let mut a = a;
    a.swap_remove(a_leader).kill();
    let survivors: Vec<&Server> = a.iter().collect();
    let next = leader(&survivors, "a-probe").await;
    for (session, stream, n) in [("a-before", before, 5), ("a-after", after, 4)] {
        let all = read_all(
            &mut survivors[next].client().await,
            read_request(session, &format!("1-{stream}-0"), false),
            WAIT,
        )
        .await;
        assert_eq!(all.events.len(), n, "{session} after A's failover: {all:?}");
    }
    // And B's events are B's alone: A does not resume B's cursor.
    let on_a = survivors[next]
        .client()
        .await
        .resolve(pb::ResolveRequest {
            session: "b-only".into(),
            last_event_id: format!("1-{b_stream}-3"),
            declared_stream: None,
        })
        .await;
    if let Ok(resolution) = on_a {
        assert_ne!(
            resolution.get_ref().verdict,
            pb::Verdict::Resumable as i32,
            "cluster A resumes a cursor of cluster B: {resolution:?}"
        );
    }
}
