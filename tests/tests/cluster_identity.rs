//! Two clusters on one machine, one of them misconfigured: cluster B's `--peers` names a member
//! of cluster A as its member 3 (a reused port, a stale configuration; CI once handed two
//! test clusters one port). B's founder asks every peer before it forms (issue 30 item 4):
//! A's member answers with a formed log, so B forms nothing, says so, and `cluster init`
//! refuses too; A keeps working with all three members. (Before, B formed with the two
//! members it has and A's member refused B's Raft traffic by cluster identity, which
//! `identity.rs`'s tests still check: a refused request changes nothing.)

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cursorlog_tests::{
    event, free_addr, pb, read_all, read_request, run_tool, start_member, ReadAll, Server,
};
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

/// Reads `cursor` of `session` to its end on whichever of `nodes` leads, asking again when
/// the member read from stopped leading before it answered (UNAVAILABLE).
async fn read_on_leader(nodes: &[&Server], session: &str, cursor: &str) -> ReadAll {
    let deadline = Instant::now() + WAIT;
    loop {
        let at = leader(nodes, "a-probe").await;
        let all = read_all(
            &mut nodes[at].client().await,
            read_request(session, cursor, false),
            WAIT,
        )
        .await;
        match &all.error {
            Some(s) if s.code() == Code::Unavailable && Instant::now() < deadline => {}
            _ => return all,
        }
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
async fn a_cluster_does_not_form_beside_a_member_of_another_and_that_one_keeps_working() {
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

    // B's founder asks its peers before it forms: A's member 2 answers with a formed log, so
    // B forms nothing (A's member never gets B's votes or entries) and says so.
    assert!(
        b[0].wait_for_log("this member forms no cluster"),
        "B's member 1 did not refuse to form beside a formed log; its log:\n{}",
        b[0].logs()
    );
    assert!(
        b[0].logs().contains(&a_addrs[1]),
        "the refusal names the member holding the log: {}",
        b[0].logs()
    );
    // `cluster init` on B is refused for the same reason, naming that member.
    let (status, out, err) = tokio::task::block_in_place(|| {
        run_tool(&["cluster", "init", "--members", &b_addrs[..2].join(",")])
    });
    assert!(!status.success(), "init formed B beside A's member: {out}");
    assert!(err.contains("holds a formed log"), "{err}");
    assert!(
        !a[1].logs().contains("refused Raft traffic"),
        "B sent Raft traffic to A's member although it never formed:\n{}",
        a[1].logs()
    );

    // A still has all three members: with its leader's log checked on every member below.
    let a_leader = leader(&a_refs, "a-probe").await;
    let after = write(&a[a_leader], "a-after", 4).await;
    for (session, stream, n) in [("a-before", before, 5), ("a-after", after, 4)] {
        let all = read_on_leader(&a_refs, session, &format!("1-{stream}-0")).await;
        assert_eq!(all.events.len(), n, "{session}: {all:?}");
    }
    // Stop A's leader: the other two (member 2 included) elect among themselves and hold
    // everything A acknowledged, which a member that took B's entries would not.
    let mut a = a;
    a.swap_remove(a_leader).kill();
    let survivors: Vec<&Server> = a.iter().collect();
    for (session, stream, n) in [("a-before", before, 5), ("a-after", after, 4)] {
        let all = read_on_leader(&survivors, session, &format!("1-{stream}-0")).await;
        assert_eq!(all.events.len(), n, "{session} after A's failover: {all:?}");
    }
    drop(b);
}
