//! Three replicated cursorlog nodes in one process, over loopback gRPC, each on its own data
//! directory: the engine's writes go through openraft on the leader, every node applies the
//! committed entries, and all serve the same sessions, streams and events — through a leader
//! change and a restart of the old leader (issue 19 items 2 and 3).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
mod common;

use common::{batch, blocking, Cluster, SEGMENT_BYTES};
use cursorlog_engine::{Error, NewEvent, OpenStream, Proposed};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_serve_the_same_log_through_a_leader_change_and_a_restart() {
    let mut cluster = Cluster::start(SEGMENT_BYTES).await;
    let leader = cluster.leader(None).await;
    let engine = cluster.nodes[&leader].node.engine().clone();
    let stream = blocking(&engine, |e| {
        let s = e.open_session("s").unwrap();
        let st = e
            .open_stream(OpenStream {
                session: "s".into(),
                epoch: s.epoch,
                correlation: Some("req-1".into()),
                lease_ms: None,
            })
            .unwrap();
        e.append(batch(st.stream, 1, 4)).unwrap();
        e.append(batch(st.stream, 5, 4)).unwrap();
        // A retry of an acknowledged batch is answered with the same seqs, not appended.
        e.append(batch(st.stream, 5, 4)).unwrap();
        st.stream
    })
    .await;

    // A follower refuses writes and names the leader.
    let follower = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let refused = blocking(cluster.nodes[&follower].node.engine(), |e| {
        e.open_session("t")
    })
    .await;
    match refused {
        Err(Error::NotLeader { leader: Some(addr) }) => {
            assert_eq!(addr, cluster.members[&leader].addr);
        }
        other => panic!("a follower must answer NotLeader with the leader: {other:?}"),
    }
    assert!(matches!(
        cluster.nodes[&follower].node.linearizable().await,
        Err(Proposed::NotLeader { .. })
    ));

    let views = cluster.converged(leader).await;
    assert!(views[0].contains("head: 8"), "{}", views[0]);
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");

    // The leader goes away: another is elected and continues the same stream.
    drop(engine);
    cluster.nodes.remove(&leader).unwrap().stop().await;
    let new_leader = cluster.leader(Some(leader)).await;
    let engine = cluster.nodes[&new_leader].node.engine().clone();
    blocking(&engine, move |e| {
        e.append(batch(stream, 9, 4)).unwrap();
        e.complete(
            "s",
            stream,
            Some(13),
            NewEvent::new("result", b"done".to_vec()),
        )
        .unwrap();
    })
    .await;

    // The old leader restarts on its directory and catches up.
    cluster.restart(leader).await;
    let views = cluster.converged(new_leader).await;
    assert!(
        views[0].contains("head: 13") && views[0].contains("Completed"),
        "{}",
        views[0]
    );
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");

    // A follower's directory is wiped: restarted empty, it is sent the whole log again.
    let wiped = *cluster.nodes.keys().find(|id| **id != new_leader).unwrap();
    cluster.wipe(wiped).await;
    cluster.restart(wiped).await;
    let engine = cluster.nodes[&new_leader].node.engine().clone();
    blocking(&engine, |e| {
        e.open_session("after-wipe").unwrap();
    })
    .await;
    let views = cluster.converged(new_leader).await;
    assert!(views.iter().all(|v| v == &views[0]), "{views:#?}");
    cluster.stop().await;
}

/// A leader that shrinks its cluster to itself and grows it back keeps the lead through every
/// promotion: a new voter set starts its own quorum clock, so the check-quorum watch does not
/// read the first promotion as "cut off" and hand the lead to the learner mid-change (the
/// flake that turned CI red in `two_wiped_members_with_the_founder_never_form_a_second_cluster`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_keeps_the_lead_while_it_promotes_learners() {
    use openraft::ChangeMembers;
    use std::collections::{BTreeMap, BTreeSet};

    let cluster = Cluster::start(SEGMENT_BYTES).await;
    let leader = cluster.leader(None).await;
    let raft = cluster.nodes[&leader].node.raft().clone();
    let others: BTreeSet<_> = cluster
        .members
        .keys()
        .copied()
        .filter(|id| *id != leader)
        .collect();
    for round in 0..8 {
        raft.change_membership(ChangeMembers::RemoveVoters(others.clone()), false)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the leader shrinks to itself: {e}"));
        raft.change_membership(ChangeMembers::RemoveNodes(others.clone()), false)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the learners are dropped: {e}"));
        let learners: BTreeMap<_, _> = others
            .iter()
            .map(|id| (*id, cluster.members[id].clone()))
            .collect();
        raft.change_membership(ChangeMembers::AddNodes(learners), false)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the learners come back: {e}"));
        raft.change_membership(ChangeMembers::AddVoterIds(others.clone()), false)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the leader promotes them: {e}"));
        let status = cluster.nodes[&leader].node.status();
        assert_eq!(
            status.leader.map(|(id, _)| id),
            Some(leader),
            "round {round}: the lead moved during a promotion"
        );
    }
    cluster.stop().await;
}
