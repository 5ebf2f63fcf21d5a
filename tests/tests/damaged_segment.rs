//! No query of death: a sealed segment damaged under a running server (cut short by
//! something outside cursorlog, or overwritten) answers `DATA_LOSS` for the damaged range,
//! naming the offset, and the server keeps serving: the same stream after the damage, other
//! streams, and the damaged range again (still `DATA_LOSS`, never a crash).
//!
//! Before sealed segments were read with positional reads, they were memory-mapped and a
//! read of a range cut off the file was a SIGBUS that killed the server (exit 135).

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cursorlog_tests::{
    append, assert_contiguous, open_stream, pb, read_all, read_request, ReadAll, Server,
};
use pb::cursor_log_client::CursorLogClient;
use tonic::transport::Channel;
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(30);
/// Small segments: each holds at most ~64 of the 1 KiB events (plus one group).
const SEGMENT_BYTES: &str = "65536";
const PAYLOAD: [u8; 1024] = [0x5a; 1024];
const A_EVENTS: u64 = 300;
const B_EVENTS: u64 = 100;
const GROUP: usize = 5;

/// The segment files of `dir`, in LSN order (their names sort by base LSN).
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    files.sort();
    files
}

async fn fill(c: &mut CursorLogClient<Channel>, session: &str, events: u64) -> (u64, u64) {
    let (epoch, stream) = open_stream(c, session, None, None).await;
    let group: Vec<&[u8]> = vec![&PAYLOAD[..]; GROUP];
    for _ in 0..events / GROUP as u64 {
        append(c, session, stream, "k", &group).await;
    }
    (epoch, stream)
}

/// A server whose stream "a" (300 events) spans at least five segments, followed by stream
/// "b" (100 events) in later ones. Returns the server, both (epoch, stream) pairs and the
/// second segment file (sealed, in the middle of "a").
async fn server_with_two_streams() -> (Server, (u64, u64), (u64, u64), PathBuf) {
    let server = Server::start(&["--segment-bytes", SEGMENT_BYTES, "--sync", "never"]);
    let mut c = server.client().await;
    let a = fill(&mut c, "a", A_EVENTS).await;
    let a_files = segment_files(&server.data_dir);
    assert!(
        a_files.len() >= 5,
        "test setup: stream a spans {} segments",
        a_files.len()
    );
    let b = fill(&mut c, "b", B_EVENTS).await;
    assert!(segment_files(&server.data_dir).len() > a_files.len());
    (server, a, b, a_files[1].clone())
}

async fn read_from(
    c: &mut CursorLogClient<Channel>,
    session: &str,
    (epoch, stream): (u64, u64),
    after: u64,
) -> ReadAll {
    let cursor = format!("{epoch}-{stream}-{after}");
    read_all(c, read_request(session, &cursor, false), TIMEOUT).await
}

/// The read of "a" from its start ends in `DATA_LOSS` naming an offset, after a contiguous
/// prefix of the events before the damage (possibly none).
async fn expect_data_loss(server: &mut Server, a: (u64, u64)) {
    let mut c = server.client().await;
    let all = read_from(&mut c, "a", a, 0).await;
    let Some(status) = all.error.clone() else {
        panic!(
            "reading across the damaged segment must fail, got {} events",
            all.events.len()
        );
    };
    if status.code() != Code::DataLoss {
        let exit =
            matches!(status.code(), Code::Unavailable | Code::Unknown).then(|| server.wait_exit());
        panic!(
            "expected DATA_LOSS, got {status:?}; server exit: {exit:?}; stderr tail: {}",
            tail(&server.logs())
        );
    }
    assert!(status.message().contains("offset"), "{status:?}");
    let delivered = all.events.len() as u64;
    assert!(delivered < A_EVENTS, "the damaged range was served");
    if delivered > 0 {
        assert_contiguous(&all.events, 1, delivered);
    }
}

fn tail(logs: &str) -> &str {
    let start = logs.len().saturating_sub(2000);
    logs.get(start..).unwrap_or(logs)
}

/// After the damage: the rest of "a", all of "b", and the damaged range once more.
async fn expect_everything_else_served(server: &mut Server, a: (u64, u64), b: (u64, u64)) {
    let mut c = server.client().await;
    let after = read_from(&mut c, "a", a, A_EVENTS - 10).await;
    assert!(after.error.is_none(), "{:?}", after.error);
    assert_contiguous(&after.events, A_EVENTS - 9, A_EVENTS);

    let other = read_from(&mut c, "b", b, 0).await;
    assert!(other.error.is_none(), "{:?}", other.error);
    assert_contiguous(&other.events, 1, B_EVENTS);

    // The same damaged range again: the same answer, not a crash.
    expect_data_loss(server, a).await;
    let stats = c.stats(pb::StatsRequest {}).await.unwrap().into_inner();
    assert!(stats.segments >= 6, "{stats:?}");
    // Appends still work too.
    append(&mut c, "b", b.1, "k", &[b"after"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_segment_cut_short_under_a_running_server_answers_data_loss_for_that_range() {
    let (mut server, a, b, damaged) = server_with_two_streams().await;
    let before = std::fs::metadata(&damaged).unwrap().len();
    assert!(before > 8192, "test setup: {before} bytes");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&damaged)
        .unwrap()
        .set_len(8192)
        .unwrap();

    expect_data_loss(&mut server, a).await;
    let name = damaged.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        server.wait_for_log(&name),
        "the server log names the damaged file {name}"
    );
    expect_everything_else_served(&mut server, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_segment_overwritten_under_a_running_server_answers_data_loss_for_that_range() {
    let (mut server, a, b, damaged) = server_with_two_streams().await;
    let len = std::fs::metadata(&damaged).unwrap().len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&damaged)
        .unwrap();
    file.write_all_at(&[0xff; 512], len / 2).unwrap();
    file.sync_all().unwrap();

    expect_data_loss(&mut server, a).await;
    expect_everything_else_served(&mut server, a, b).await;
}
