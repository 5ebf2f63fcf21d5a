//! Operating a replicated cluster with `cursorlog cluster …` against real processes: status
//! shows one leader and every member's indexes; a fourth member joins as a learner, is
//! promoted to voter and a founding member is removed, while a client keeps appending —
//! every acknowledged event is still there, in order, afterwards (issue 19 item 5).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use cursorlog_tests::{
    event, free_addr, http_get, metric, pb, read_all, read_request, run_tool, start_member, Server,
};
use pb::cursor_log_client::CursorLogClient;
use tonic::transport::Channel;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(60);

fn start(id: usize, addrs: &[String], dir: &std::path::Path) -> Server {
    start_member(id, addrs, dir, &["--metrics-listen", "127.0.0.1:0"])
}

async fn connect(addr: &str) -> CursorLogClient<Channel> {
    CursorLogClient::new(
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy(),
    )
}

/// Appends `events` (one per call) to a new stream, following leader hints and retrying
/// with expected_next_seq; returns the stream and how many were acknowledged.
async fn writer(addrs: Vec<String>, events: u64) -> (u64, u64) {
    let mut at = 0usize;
    let deadline = Instant::now() + WAIT * 2;
    let mut c = connect(&addrs[at]).await;
    let stream = loop {
        let opened = async {
            c.open_session(pb::OpenSessionRequest {
                session: "w".into(),
                state: None,
            })
            .await?;
            c.open_stream(pb::OpenStreamRequest {
                session: "w".into(),
                epoch: 1,
                correlation: None,
                lease_ms: None,
            })
            .await
        }
        .await;
        match opened {
            Ok(r) => break r.into_inner().stream,
            Err(s) => {
                assert!(
                    matches!(s.code(), Code::Unavailable | Code::Unknown),
                    "{s:?}"
                );
                at = (at + 1) % addrs.len();
                c = connect(&addrs[at]).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(Instant::now() < deadline);
    };
    let mut seq = 1;
    while seq <= events {
        let r = c
            .append(pb::AppendRequest {
                session: "w".into(),
                stream,
                expected_next_seq: Some(seq),
                events: vec![event("progress", format!("event {seq}").as_bytes())],
            })
            .await;
        match r {
            Ok(_) => seq += 1,
            // A member that went away (removed, killed) answers with a transport error:
            // the append carries expected_next_seq, so it is retried on another member.
            Err(s) if matches!(s.code(), Code::Unavailable | Code::Unknown) => {
                match s.metadata().get("cursorlog-leader") {
                    Some(l) => c = connect(l.to_str().unwrap()).await,
                    None => {
                        at = (at + 1) % addrs.len();
                        c = connect(&addrs[at]).await;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            Err(s) => panic!("append {seq}: {s:?}"),
        }
        assert!(Instant::now() < deadline, "the writer stalled at {seq}");
    }
    (stream, seq - 1)
}

/// The rows of `cluster status` output whose role is leader.
fn leader_rows(status: &str) -> Vec<String> {
    status
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(2) == Some("leader"))
        .map(str::to_owned)
        .collect()
}

fn cluster(args: &[&str], members: &str) -> String {
    let mut argv = vec!["cluster"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--members", members]);
    let (status, out, err) = run_tool(&argv);
    assert!(status.success(), "cluster {args:?}: {out}\n{err}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_get_promoted_and_leave_under_load_without_losing_an_event() {
    let addrs: Vec<String> = (0..4).map(|_| free_addr()).collect();
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    // Members 1–3 form the cluster (member 4 is in their --peers list but not in the
    // membership member 1 forms: it joins below).
    let founding: Vec<String> = addrs[..3].to_vec();
    let mut servers: Vec<Server> = (1..=3)
        .map(|i| start(i, &founding, dirs[i - 1].path()))
        .collect();
    let members3 = founding.join(",");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        let out = tokio::task::spawn_blocking({
            let m = members3.clone();
            move || cluster(&["status"], &m)
        })
        .await
        .unwrap();
        if !leader_rows(&out).is_empty() {
            break out;
        }
        assert!(Instant::now() < deadline, "no leader: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(leader_rows(&status).len(), 1, "{status}");
    // Each member's metrics say who leads, in which term, and (on the leader) the lag.
    let pages: Vec<String> = servers
        .iter()
        .map(|s| http_get(s.metrics_addr.unwrap(), &[]))
        .collect();
    let leaders: u64 = pages
        .iter()
        .map(|p| metric(p, "cursorlog_raft_is_leader").unwrap())
        .sum();
    assert_eq!(leaders, 1, "{pages:#?}");
    let leader_page = pages
        .iter()
        .find(|p| metric(p, "cursorlog_raft_is_leader") == Some(1))
        .unwrap();
    assert!(metric(leader_page, "cursorlog_raft_term").unwrap() >= 1);
    assert_eq!(
        leader_page
            .matches("cursorlog_raft_follower_lag_entries{node=")
            .count(),
        2,
        "{leader_page}"
    );

    let load = tokio::spawn(writer(founding.clone(), 60));
    servers.push(start(4, &addrs, dirs[3].path()));
    let all = addrs.join(",");
    let out = tokio::task::spawn_blocking({
        let a = addrs[3].clone();
        let m = members3.clone();
        move || cluster(&["add-learner", "--id", "4", "--addr", &a], &m)
    })
    .await
    .unwrap();
    assert!(out.contains("learners: 4="), "{out}");
    let out = tokio::task::spawn_blocking({
        let m = all.clone();
        move || cluster(&["promote", "--id", "4"], &m)
    })
    .await
    .unwrap();
    assert!(
        out.contains("4=") && out.contains("learners: \n") || out.ends_with("learners: \n"),
        "{out}"
    );
    // Remove a founding member that is not the leader.
    let status = tokio::task::spawn_blocking({
        let m = all.clone();
        move || cluster(&["status"], &m)
    })
    .await
    .unwrap();
    let leader_row = status
        .lines()
        .find(|l| l.contains(" leader "))
        .unwrap()
        .to_owned();
    let gone = (1..=3)
        .find(|i| !leader_row.starts_with(&addrs[i - 1]))
        .unwrap();
    let out = tokio::task::spawn_blocking({
        let m = all.clone();
        move || cluster(&["remove", "--id", &gone.to_string()], &m)
    })
    .await
    .unwrap();
    assert!(
        !out.contains(&format!("{gone}={}", addrs[gone - 1])),
        "{out}"
    );
    servers[gone - 1].kill();

    let (stream, acked) = load.await.unwrap();
    assert_eq!(acked, 60);
    // Every acknowledged event, in order, from whoever leads now.
    let remaining: Vec<String> = (1..=4)
        .filter(|i| *i != gone)
        .map(|i| addrs[i - 1].clone())
        .collect();
    let deadline = Instant::now() + WAIT;
    let events = loop {
        let mut found = None;
        for a in &remaining {
            let mut c = connect(a).await;
            // Only the leader answers verdicts: ask each member, read from the one that does.
            let verdict = c
                .resolve(pb::ResolveRequest {
                    session: "w".into(),
                    last_event_id: format!("1-{stream}-0"),
                    declared_stream: None,
                })
                .await;
            if verdict.is_err() {
                continue;
            }
            let mut request = read_request("w", &format!("1-{stream}-0"), false);
            request.resume_own_stream = true;
            let all = read_all(&mut c, request, WAIT).await;
            if all.error.is_none() && all.resolution.is_some() {
                found = Some(all.events);
                break;
            }
        }
        if let Some(events) = found {
            break events;
        }
        assert!(Instant::now() < deadline, "no member serves the stream");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=60).collect::<Vec<_>>());
    for e in &events {
        assert_eq!(&e.payload[..], format!("event {}", e.seq).as_bytes());
    }

    // Stopped, a member's directory is inspected as a member's (its log up to the committed
    // entry), and a single-node `serve` refuses it before writing anything.
    for s in &mut servers {
        s.kill();
    }
    let member = dirs[3].path().to_str().unwrap();
    let (status, out, err) = run_tool(&["inspect", member]);
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("cluster member: yes"), "{out}");
    assert!(out.contains("committed"), "{out}");
    let (status, out, err) = run_tool(&["serve", "--listen", "127.0.0.1:0", "--data-dir", member]);
    assert!(!status.success(), "{out}");
    assert!(err.contains("--node-id"), "{err}");
}

/// Members started with `--join` form nothing by themselves (no log, no leader) until
/// `cluster init`; then they elect a leader and take writes; a second `init` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_started_with_join_wait_for_cluster_init() {
    let addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let _servers: Vec<Server> = (1..=3)
        .map(|i| start_member(i, &addrs, dirs[i - 1].path(), &["--join"]))
        .collect();
    let members = addrs.join(",");
    // Without --join, member 1 writes the cluster's first entry before it listens.
    let status = tokio::task::spawn_blocking({
        let m = members.clone();
        move || cluster(&["status"], &m)
    })
    .await
    .unwrap();
    let logs: Vec<&str> = status
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(5))
        .collect();
    assert_eq!(
        logs,
        ["-", "-", "-"],
        "no member may have a log yet:\n{status}"
    );
    assert!(leader_rows(&status).is_empty(), "{status}");

    let out = tokio::task::spawn_blocking({
        let m = members.clone();
        move || cluster(&["init"], &m)
    })
    .await
    .unwrap();
    assert!(
        out.contains("formed the cluster") && out.contains("leads"),
        "{out}"
    );
    let (_, acked) = writer(addrs.clone(), 5).await;
    assert_eq!(acked, 5);

    let (status, out, err) = run_tool(&["cluster", "init", "--members", &members]);
    assert!(!status.success(), "a second init succeeded: {out}");
    assert!(err.contains("already formed"), "{err}");
}
