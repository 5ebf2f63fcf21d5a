//! The `cursorlog` command line: offline `verify` and `inspect`, and argument handling.
//! (The gRPC scenarios live in the `cursorlog-tests` crate; this file also makes
//! `cargo test --workspace` build the binary they start.)

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use cursorlog_engine::{Append, Config, Engine, NewEvent, OpenStream};

fn cursorlog(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cursorlog"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// Writes a small log spread over several segments.
fn populate(dir: &Path) {
    let mut config = Config::new(dir);
    config.segment_bytes_max = 4096;
    let engine = Engine::open(config).unwrap();
    let session = engine.open_session("cli-session").unwrap();
    let stream = engine
        .open_stream(OpenStream {
            session: "cli-session".into(),
            epoch: session.epoch,
            correlation: Some("req-9".into()),
            lease_ms: None,
        })
        .unwrap();
    for i in 0..40 {
        engine
            .append(Append {
                session: "cli-session".into(),
                stream: stream.stream,
                expected_next_seq: None,
                events: vec![NewEvent::new(
                    "progress",
                    vec![u8::try_from(i).unwrap(); 300],
                )],
            })
            .unwrap();
    }
    engine.close().unwrap();
}

fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = walk(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn verify_accepts_a_clean_directory_and_inspect_lists_it() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path());
    let out = cursorlog(&["verify", dir.path().to_str().unwrap()]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "verify failed: {report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!report.contains("CORRUPT"), "{report}");

    let out = cursorlog(&["inspect", dir.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("cli-session"), "{text}");
    assert!(text.contains("req-9"), "{text}");
    assert!(text.contains("open"), "{text}");
    assert!(text.contains("segments ("), "{text}");
}

#[test]
fn verify_exits_non_zero_on_a_corrupt_sealed_segment() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path());
    let segments = segment_files(dir.path());
    assert!(
        segments.len() >= 2,
        "expected several segments: {segments:?}"
    );
    // Flip a byte in the middle of the first (sealed) segment's records.
    let victim = &segments[0];
    let mut bytes = std::fs::read(victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xFF;
    std::fs::write(victim, bytes).unwrap();
    let out = cursorlog(&["verify", dir.path().to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn verify_of_a_missing_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let out = cursorlog(&["verify", missing.to_str().unwrap()]);
    assert!(!out.status.success());
}

#[test]
fn help_lists_the_subcommands() {
    let out = cursorlog(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for word in ["serve", "verify", "inspect", "--listen", "--data-dir"] {
        assert!(
            text.contains(word),
            "--help does not mention {word}: {text}"
        );
    }
    let out = cursorlog(&["serve", "--sync", "sometimes"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sync"));
}

#[test]
fn verify_repair_refuses_lossy_cuts_unless_loss_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path());
    let segments = segment_files(dir.path());
    assert!(segments.len() >= 3);
    // Damage a sealed segment: repairing it would drop acknowledged records.
    let mut bytes = std::fs::read(&segments[0]).unwrap();
    bytes[200] ^= 0x20;
    std::fs::write(&segments[0], bytes).unwrap();
    let d = dir.path().to_str().unwrap();

    let refused = cursorlog(&["verify", "--repair", d]);
    let text = String::from_utf8_lossy(&refused.stdout);
    assert_eq!(refused.status.code(), Some(1), "{text}");
    assert!(
        text.contains("--accept-loss"),
        "says what to do next: {text}"
    );
    assert_eq!(
        segment_files(dir.path()).len(),
        segments.len(),
        "nothing was touched"
    );

    let repaired = cursorlog(&["verify", "--repair", "--accept-loss", d]);
    let text = String::from_utf8_lossy(&repaired.stdout);
    assert!(repaired.status.success(), "{text}");
    assert!(text.contains("valid records dropped"), "{text}");
    assert!(cursorlog(&["verify", d]).status.success());
}

/// CRC-32 (IEEE, reflected; what FORMAT.md's frames carry), bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// A newer build's record (a type this build does not know, CRC valid) as the last frame:
/// repair never cuts it, even with `--accept-loss`, and says which build to run instead.
#[test]
fn verify_repair_never_cuts_a_newer_builds_record() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path());
    let last = segment_files(dir.path()).pop().unwrap();
    let mut bytes = std::fs::read(&last).unwrap();
    // FORMAT.md: 80-byte segment header; 48-byte frame headers (body_len at 0, CRC-32 of
    // bytes 8.. and the body at 4, record type at 44).
    let (mut at, mut frame) = (80, 80);
    while at < bytes.len() {
        frame = at;
        at += 48 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    bytes[frame + 44] = 200;
    let crc = crc32(&bytes[frame + 8..]);
    bytes[frame + 4..frame + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&last, &bytes).unwrap();
    let d = dir.path().to_str().unwrap();
    for args in [
        &["verify", "--repair", d][..],
        &["verify", "--repair", "--accept-loss", d],
    ] {
        let out = cursorlog(args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains("newer cursorlog"), "says what to do: {text}");
        assert!(!text.contains("--accept-loss"), "{text}");
        assert!(std::fs::read(&last).unwrap() == bytes, "nothing was cut");
    }
}

#[test]
fn verify_repair_truncates_a_torn_tail_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path());
    let last = segment_files(dir.path()).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let d = dir.path().to_str().unwrap();
    let out = cursorlog(&["verify", "--repair", d]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("0 valid records dropped"), "{text}");
    assert!(std::fs::metadata(&last).unwrap().len() < len - 5);
}
