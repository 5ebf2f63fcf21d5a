//! Tasks on a three-member cluster, with real processes (issue 20 item 5): a task polled
//! across a failover of cursorlog itself never goes backwards (no `completed`, then
//! `working`; no version seen twice with different content), of a cancel racing a
//! completion exactly one ends the task, the same status on the next leader, and a follower
//! points task calls to the leader.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cursorlog_tests::{free_addr, pb, start_member, Server};
use pb::tasks_client::TasksClient;
use tonic::transport::Channel;
use tonic::{Code, Status};

type Client = TasksClient<Channel>;

const WAIT: Duration = Duration::from_secs(90);

struct Cluster {
    addrs: Vec<String>,
    nodes: Vec<Server>,
    _dirs: Vec<tempfile::TempDir>,
    clients: Vec<Client>,
    alive: Vec<bool>,
    leader: usize,
}

impl Cluster {
    async fn start() -> Self {
        let addrs: Vec<String> = (0..3).map(|_| free_addr()).collect();
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let nodes: Vec<Server> = (0..3)
            .map(|i| start_member(i + 1, &addrs, dirs[i].path(), &[]))
            .collect();
        let mut clients = Vec::new();
        for node in &nodes {
            clients.push(TasksClient::new(node.channel().await));
        }
        Self {
            addrs,
            nodes,
            _dirs: dirs,
            clients,
            alive: vec![true; 3],
            leader: 0,
        }
    }

    fn kill_leader(&mut self) -> usize {
        let l = self.leader;
        self.nodes[l].kill();
        self.alive[l] = false;
        l
    }
}

/// Runs `call` on whichever live member leads, trying each in turn (the last leader first)
/// until one answers with anything but UNAVAILABLE or a transport error, every 100 ms up to
/// [`WAIT`] (an election after a kill takes a few seconds).
async fn on_leader<T, F, Fut>(c: &mut Cluster, mut call: F) -> Result<T, Status>
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        for k in 0..3 {
            let i = (c.leader + k) % 3;
            if !c.alive[i] {
                continue;
            }
            match call(c.clients[i].clone()).await {
                Err(s) if matches!(s.code(), Code::Unavailable | Code::Unknown) => {}
                other => {
                    c.leader = i;
                    return other;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader answered within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn task_ids() -> Vec<String> {
    (0..4).map(|i| format!("t{i}")).collect()
}

/// How far along a status is: running (0) or ended (1).
fn rank(s: pb::TaskStatus) -> u8 {
    u8::from(matches!(
        s,
        pb::TaskStatus::Completed | pb::TaskStatus::Failed | pb::TaskStatus::Cancelled
    ))
}

/// Polls every task on whichever member answers, until `stop`, checking that nothing a
/// poll saw ever goes backwards; returns how many polls found each task.
async fn poll_monotonic(clients: Vec<Client>, stop: Arc<AtomicBool>) -> usize {
    let mut seen: HashMap<String, (u64, pb::TaskStatus, Option<String>)> = HashMap::new();
    let mut polls = 0;
    while !stop.load(Ordering::Acquire) {
        for c in &clients {
            for id in task_ids() {
                let got = c
                    .clone()
                    .get_task(pb::GetTaskRequest {
                        owner: "s:a".into(),
                        task_id: id.clone(),
                        include_outcome: false,
                    })
                    .await;
                let Ok(r) = got else { continue };
                let r = r.into_inner();
                let Some(task) = r.view.and_then(|v| v.task) else {
                    continue;
                };
                polls += 1;
                let now = (task.version, task.status(), task.status_message.clone());
                if let Some(before) = seen.get(&id) {
                    assert!(
                        now.0 >= before.0,
                        "{id}: version went back: {before:?} then {now:?}"
                    );
                    assert!(
                        rank(now.1) >= rank(before.1),
                        "{id}: status went back: {before:?} then {now:?}"
                    );
                    if rank(before.1) == 1 {
                        assert_eq!(now.1, before.1, "{id}: an ended task changed");
                    }
                    if now.0 == before.0 {
                        assert_eq!(now, *before, "{id}: one version, two contents");
                    }
                }
                seen.insert(id, now);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    polls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_polled_across_a_failover_never_goes_backwards() {
    let mut c = Cluster::start().await;
    for id in task_ids() {
        on_leader(&mut c, |mut cl| {
            let id = id.clone();
            async move {
                cl.create_task(pb::CreateTaskRequest {
                    owner: "s:a".into(),
                    task_id: id.clone(),
                    request_key: format!("r-{id}"),
                    ..Default::default()
                })
                .await
            }
        })
        .await
        .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn(poll_monotonic(c.clients.clone(), Arc::clone(&stop)));
    let mut killed = None;
    for round in 1..=6u64 {
        if round == 3 {
            killed = Some(c.kill_leader());
        }
        for id in task_ids() {
            // A blind retry of an update needs its expected version: a retry whose first
            // attempt applied is ABORTED, and the task already says what it was to say.
            let message = format!("round {round}");
            let r = on_leader(&mut c, |mut cl| {
                let (id, message) = (id.clone(), message.clone());
                async move {
                    cl.update_task(pb::UpdateTaskRequest {
                        owner: "s:a".into(),
                        task_id: id,
                        expected_version: Some(round),
                        status: pb::TaskStatus::Working.into(),
                        status_message: Some(message),
                        ..Default::default()
                    })
                    .await
                }
            })
            .await;
            match r {
                Ok(_) => {}
                Err(s) if s.code() == Code::Aborted => {}
                Err(s) => panic!("update of {id} in round {round}: {s:?}"),
            }
        }
    }
    for id in task_ids() {
        on_leader(&mut c, |mut cl| {
            let id = id.clone();
            async move {
                cl.finish_task(pb::FinishTaskRequest {
                    owner: "s:a".into(),
                    task_id: id,
                    status: pb::TaskStatus::Completed.into(),
                    outcome: Some(pb::TaskOutcome {
                        kind: pb::task_outcome::Kind::Result.into(),
                        json: b"{\"content\":[]}".to_vec(),
                    }),
                    ..Default::default()
                })
                .await
            }
        })
        .await
        .unwrap();
    }
    stop.store(true, Ordering::Release);
    let polls = poller.await.unwrap();
    assert!(polls > 0, "the poller saw the tasks");
    assert!(killed.is_some());
    for id in task_ids() {
        let got = on_leader(&mut c, |mut cl| {
            let id = id.clone();
            async move {
                cl.get_task(pb::GetTaskRequest {
                    owner: "s:a".into(),
                    task_id: id,
                    include_outcome: true,
                })
                .await
            }
        })
        .await
        .unwrap()
        .into_inner();
        let view = got.view.unwrap();
        let task = view.task.unwrap();
        assert_eq!(task.status(), pb::TaskStatus::Completed, "{id}");
        assert_eq!(task.version, 8, "{id}: created, six updates, finished");
        assert_eq!(task.status_message(), "round 6", "{id}");
        assert_eq!(view.outcome.unwrap().json, b"{\"content\":[]}".to_vec());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_a_cancel_racing_a_completion_one_wins_and_the_next_leader_agrees() {
    let mut c = Cluster::start().await;
    on_leader(&mut c, |mut cl| async move {
        cl.create_task(pb::CreateTaskRequest {
            owner: "s:a".into(),
            task_id: "t".into(),
            request_key: "r".into(),
            ..Default::default()
        })
        .await
    })
    .await
    .unwrap();
    let leader = c.clients[c.leader].clone();
    let finish = |mut cl: Client, status: pb::TaskStatus| async move {
        cl.finish_task(pb::FinishTaskRequest {
            owner: "s:a".into(),
            task_id: "t".into(),
            status: status.into(),
            ..Default::default()
        })
        .await
    };
    let (a, b) = tokio::join!(
        finish(leader.clone(), pb::TaskStatus::Completed),
        finish(leader.clone(), pb::TaskStatus::Cancelled)
    );
    let winner = match (&a, &b) {
        (Ok(_), Err(s)) if s.code() == Code::FailedPrecondition => pb::TaskStatus::Completed,
        (Err(s), Ok(_)) if s.code() == Code::FailedPrecondition => pb::TaskStatus::Cancelled,
        other => panic!("exactly one end wins: {other:?}"),
    };
    c.kill_leader();
    let got = on_leader(&mut c, |mut cl| async move {
        cl.get_task(pb::GetTaskRequest {
            owner: "s:a".into(),
            task_id: "t".into(),
            include_outcome: false,
        })
        .await
    })
    .await
    .unwrap()
    .into_inner();
    let task = got.view.unwrap().task.unwrap();
    assert_eq!(
        task.status(),
        winner,
        "the next leader holds the winner's end"
    );
    assert_eq!(task.version, 2);
    // And the loser's retry still loses there.
    let loser = if winner == pb::TaskStatus::Completed {
        pb::TaskStatus::Cancelled
    } else {
        pb::TaskStatus::Completed
    };
    let again = on_leader(&mut c, |cl| finish(cl, loser)).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
}

/// A follower answers task reads and writes as it does for the event log: UNAVAILABLE, with
/// the leader in the `cursorlog-leader` header and `cursorlog-retry: safe`; following the
/// hint finds the task the leader created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_points_to_the_leader_which_has_the_task() {
    let mut c = Cluster::start().await;
    let create = |id: &str| pb::CreateTaskRequest {
        owner: "s:a".into(),
        task_id: id.into(),
        request_key: format!("r-{id}"),
        ..Default::default()
    };
    let first = create("t1");
    let created = on_leader(&mut c, |mut cl| {
        let first = first.clone();
        async move { cl.create_task(first).await }
    })
    .await
    .unwrap()
    .into_inner();
    let leader = c.leader;
    let follower = (leader + 1) % 3;
    let get = pb::GetTaskRequest {
        owner: "s:a".into(),
        task_id: "t1".into(),
        ..Default::default()
    };
    let read = c.clients[follower].get_task(get.clone()).await.unwrap_err();
    let write = c.clients[follower]
        .create_task(create("t2"))
        .await
        .unwrap_err();
    for status in [&read, &write] {
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        let header = |name: &str| {
            status
                .metadata()
                .get(name)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(header("cursorlog-leader"), c.addrs[leader], "{status:?}");
        assert_eq!(header("cursorlog-retry"), "safe");
    }
    let found = c.clients[leader].get_task(get).await.unwrap().into_inner();
    assert_eq!(found.view.unwrap().task, created.task);
}
