//! Failure is visible: a poisoned engine turns health NOT_SERVING, appends UNAVAILABLE,
//! `cursorlog_poisoned 1`, a log line that says what to do, and a non-zero exit status; a
//! restart serves everything acknowledged before the fault. A disk below its free-space
//! reserve is an answer (RESOURCE_EXHAUSTED), not a failure. Logs carry no colour codes when
//! stderr is not a terminal, and come as JSON with `--log-format json`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use cursorlog_tests::{
    assert_contiguous, event, health, http_get, metric, open_stream, pb, read_all, read_request,
    resolve, Server, Start,
};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_is_visible_and_a_restart_serves_everything_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    // The operator's mode: it stays up, read-only, until SIGTERM.
    let mut server = Server::start_with(Start {
        data_dir: Some(dir.path()),
        args: &[
            "--fault-fail-fsync-after",
            "8",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        env: &[("CURSORLOG_STAY_UP_WHEN_POISONED", "true")],
        ..Start::default()
    });
    assert!(server.wait_for_log("TEST ONLY: --fault-fail-fsync-after 8"));
    let channel = server.channel().await;
    let mut watch = HealthClient::new(channel.clone())
        .watch(HealthCheckRequest {
            service: "cursorlog.v1.CursorLog".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);

    // Append one event per call (one fsync each, sync=always) until the injected EIO.
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let mut acked = Vec::new();
    let failure = loop {
        assert!(acked.len() < 100, "no fsync failed after 100 appends");
        let payload = format!("event {}", acked.len() + 1).into_bytes();
        let r = c
            .append(pb::AppendRequest {
                session: "s".into(),
                stream,
                expected_next_seq: Some(acked.len() as u64 + 1),
                events: vec![event("progress", &payload)],
            })
            .await;
        match r {
            Ok(_) => acked.push(payload),
            Err(status) => break status,
        }
    };
    assert!(
        !acked.is_empty(),
        "the fault hit before any append: {failure:?}"
    );
    assert_eq!(failure.code(), Code::Unavailable, "{failure:?}");

    // Health turns NOT_SERVING (a watch, not a poll), overall too.
    let changed = tokio::time::timeout(TIMEOUT, async {
        loop {
            let m = watch.message().await.unwrap().expect("health watch ended");
            if m.status() == ServingStatus::NotServing {
                break;
            }
        }
    })
    .await;
    assert!(changed.is_ok(), "health never turned NOT_SERVING");
    assert_eq!(health(&channel, "").await, ServingStatus::NotServing);

    // Every write is refused with UNAVAILABLE and says why; verdicts still work.
    let r = c
        .append(pb::AppendRequest {
            session: "s".into(),
            stream,
            expected_next_seq: None,
            events: vec![event("progress", b"after")],
        })
        .await;
    let status = r.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.message().contains("poisoned"), "{status:?}");
    let r = resolve(&mut c, "s", &format!("{epoch}-{stream}-1"), None).await;
    assert_eq!(r.verdict(), pb::Verdict::Resumable);
    let stats = c.stats(pb::StatsRequest {}).await.unwrap().into_inner();
    assert!(stats.poisoned);

    // The metric and the log line.
    let metrics_addr = server.metrics_addr.unwrap();
    let page = tokio::task::spawn_blocking(move || http_get(metrics_addr, &[]))
        .await
        .unwrap();
    assert_eq!(metric(&page, "cursorlog_poisoned"), Some(1), "{page}");
    assert!(server.wait_for_log("POISONED"));
    let logs = server.logs();
    assert!(logs.contains("restart cursorlog"), "{logs}");

    // SIGTERM: a non-zero exit, so a supervisor restarts it. The open health watch does not
    // hold the shutdown: it ends.
    let exit = server.terminate();
    let watch_ended = tokio::time::timeout(TIMEOUT, async {
        while let Ok(Some(m)) = watch.message().await {
            assert_eq!(m.status(), ServingStatus::NotServing);
        }
    })
    .await;
    assert!(watch_ended.is_ok(), "the health watch must end at shutdown");
    assert!(
        !server.logs().contains("still running after"),
        "shutdown waited for in-flight calls: {}",
        server.logs()
    );
    assert!(
        !exit.success(),
        "a poisoned server must exit non-zero: {exit:?}"
    );
    assert!(
        server
            .logs()
            .contains("poisoned by a failed write or fsync"),
        "{}",
        server.logs()
    );
    drop(server);

    // Restarted without the fault: everything acknowledged is there, in order. The append
    // whose fsync failed was never acknowledged: it may or may not have reached the disk.
    let server = Server::start_in(dir.path(), &[]);
    let mut c = server.client().await;
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{stream}-0"), false),
        TIMEOUT,
    )
    .await;
    assert!(all.error.is_none(), "{:?}", all.error);
    let n = acked.len() as u64;
    assert!(
        all.events.len() as u64 == n || all.events.len() as u64 == n + 1,
        "{} events after {n} acknowledged",
        all.events.len()
    );
    assert_contiguous(&all.events[..acked.len()], 1, n);
    for (e, payload) in all.events.iter().zip(&acked) {
        assert_eq!(&e.payload[..], &payload[..]);
    }
    if let Some(extra) = all.events.get(acked.len()) {
        assert_eq!(&extra.payload[..], format!("event {}", n + 1).as_bytes());
    }
    assert_eq!(
        health(&server.channel().await, "").await,
        ServingStatus::Serving
    );
    // And it takes writes again.
    let r = c
        .append(pb::AppendRequest {
            session: "s".into(),
            stream,
            expected_next_seq: None,
            events: vec![event("progress", b"again")],
        })
        .await;
    assert!(r.is_ok(), "{r:?}");
}

/// By default a poisoned server needs no probe and no signal: it drains (an open follower
/// ends) and exits non-zero by itself, so a plain `Restart=on-failure` supervisor restarts
/// it, and the restart serves what was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_server_drains_and_exits_non_zero_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_in(dir.path(), &["--fault-fail-fsync-after", "6"]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    let mut follower = c
        .read(read_request("s", &format!("{epoch}-{stream}-0"), true))
        .await
        .unwrap()
        .into_inner();
    assert!(follower.message().await.unwrap().is_some());
    let mut acked = 0_u64;
    loop {
        assert!(acked < 100, "no fsync failed after 100 appends");
        let r = c
            .append(pb::AppendRequest {
                session: "s".into(),
                stream,
                expected_next_seq: Some(acked + 1),
                events: vec![event("progress", b"x")],
            })
            .await;
        match r {
            Ok(_) => acked += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                break;
            }
        }
    }
    // No signal: the process ends by itself, non-zero.
    let exit = server.wait_exit();
    assert!(
        !exit.success(),
        "a poisoned server must exit non-zero: {exit:?}"
    );
    assert_eq!(exit.code(), Some(1), "{exit:?}");
    let logs = server.logs();
    assert!(logs.contains("exits with status 1 by itself"), "{logs}");
    assert!(
        logs.contains("poisoned by a failed write or fsync"),
        "{logs}"
    );
    // The open follower was ended, not left hanging.
    let ended = tokio::time::timeout(TIMEOUT, async {
        loop {
            match follower.message().await {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the follower outlived the server");
    drop(server);

    // The supervisor's restart serves everything acknowledged.
    let server = Server::start_in(dir.path(), &[]);
    let mut c = server.client().await;
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{stream}-0"), false),
        TIMEOUT,
    )
    .await;
    assert!(all.error.is_none(), "{:?}", all.error);
    assert!(
        all.events.len() as u64 >= acked,
        "{} < {acked}",
        all.events.len()
    );
    assert_contiguous(&all.events[..acked as usize], 1, acked);
}

/// With free space below `--disk-reserve-bytes` every write that needs space is refused
/// with RESOURCE_EXHAUSTED (unary, streaming and batch alike) while reads and verdicts go
/// on; the server stays healthy and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_disk_reserve_writes_are_resource_exhausted_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_in(dir.path(), &[]);
    let mut c = server.client().await;
    let (epoch, stream) = open_stream(&mut c, "s", None, None).await;
    cursorlog_tests::append(&mut c, "s", stream, "progress", &[b"1", b"2"]).await;
    assert!(server.terminate().success());
    drop(server);

    // No file system has 2^64 - 1 bytes free.
    let mut server = Server::start_with(Start {
        data_dir: Some(dir.path()),
        args: &[
            "--disk-reserve-bytes",
            "18446744073709551615",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        ..Start::default()
    });
    let mut c = server.client().await;
    let append = |events: &[u8]| pb::AppendRequest {
        session: "s".into(),
        stream,
        expected_next_seq: None,
        events: vec![event("progress", events)],
    };
    let status = c.append(append(b"3")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("reserve"), "{status:?}");
    let status = c
        .open_session(pb::OpenSessionRequest {
            session: "new".into(),
            state: None,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let batch = c
        .append_batch(pb::AppendBatchRequest {
            items: vec![pb::BatchItem {
                item: Some(pb::batch_item::Item::Append(append(b"4"))),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let Some(pb::batch_result::Result::Failure(f)) = &batch.results[0].result else {
        panic!("{batch:?}");
    };
    assert_eq!(f.code, Code::ResourceExhausted as i32);
    let mut answers = c
        .append_stream(tokio_stream::iter(vec![append(b"5")]))
        .await
        .unwrap()
        .into_inner();
    let answer = tokio::time::timeout(TIMEOUT, answers.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let Some(pb::append_result::Result::Failure(f)) = answer.result else {
        panic!("{answer:?}");
    };
    assert_eq!(f.code, Code::ResourceExhausted as i32);

    // Reads and verdicts go on; nothing refused was written; the server is healthy.
    let all = read_all(
        &mut c,
        read_request("s", &format!("{epoch}-{stream}-0"), false),
        TIMEOUT,
    )
    .await;
    assert_contiguous(&all.events, 1, 2);
    let r = resolve(&mut c, "s", &format!("{epoch}-{stream}-2"), None).await;
    assert_eq!(r.verdict(), pb::Verdict::Resumable);
    assert_eq!(
        health(&server.channel().await, "").await,
        ServingStatus::Serving
    );
    let stats = c.stats(pb::StatsRequest {}).await.unwrap().into_inner();
    assert!(!stats.poisoned);
    assert!(stats.appends_refused_low_disk >= 4, "{stats:?}");
    let metrics_addr = server.metrics_addr.unwrap();
    let page = tokio::task::spawn_blocking(move || http_get(metrics_addr, &[]))
        .await
        .unwrap();
    assert!(metric(&page, "cursorlog_appends_refused_low_disk_total").unwrap() >= 4);
    assert!(
        metric(&page, "cursorlog_disk_free_bytes").is_some(),
        "{page}"
    );
    assert_eq!(metric(&page, "cursorlog_poisoned"), Some(0));
    assert!(server.terminate().success(), "{}", server.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_shutdown_still_exits_zero() {
    let mut server = Server::start(&[]);
    let mut c = server.client().await;
    open_stream(&mut c, "s", None, None).await;
    let exit = server.terminate();
    assert!(exit.success(), "{exit:?}: {}", server.logs());
}

#[test]
fn logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let mut server = Server::start(&[]);
    assert!(server.wait_for_log("listening on"));
    let _ = server.terminate();
    let logs = server.logs();
    assert!(logs.contains("INFO"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "escape codes in a redirected log: {logs:?}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let mut server = Server::start(&["--log-format", "json"]);
    assert!(server.wait_for_log("listening on"));
    let exit = server.terminate();
    assert!(exit.success());
    let logs = server.logs();
    let mut messages = Vec::new();
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        assert!(value["level"].is_string(), "{line}");
        assert!(value["timestamp"].is_string(), "{line}");
        messages.push(value["fields"]["message"].as_str().unwrap_or("").to_owned());
    }
    assert!(
        messages.iter().any(|m| m.contains("listening on")),
        "{messages:?}"
    );
    assert!(messages.iter().any(|m| m.contains("engine closed cleanly")));
    assert!(!logs.contains('\u{1b}'));
}
