//! The data directory's lock is released the moment an engine is dropped, even in a process
//! that starts child processes. In a binary of its own: the test forks continuously, and a
//! forked child also holds copies of other tests' files until it execs (an unlinked segment
//! on a size-limited tmpfs would keep its space, and the tmpfs could not be unmounted).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cursorlog_engine::{Config, Engine, Error, SyncPolicy};

/// A forked child holds a copy of every descriptor until it execs, and a `flock` lock belongs
/// to the open file, not to the descriptor: closing the engine's descriptor alone leaves the
/// lock held by the child for that moment, and a reopen fails with `Locked`. That is how the
/// reopens in `faults.rs` failed now and then on a busy machine (4 copies of that binary
/// beside two CPU hogs: 5 of 200 runs) while its tmpfs test ran `mount`. Failed (27-29 of 30
/// reopens refused) until the engine unlocked the lock explicitly when dropped.
#[test]
fn a_dropped_engine_releases_its_directory_while_the_process_starts_children() {
    const REOPENS: usize = 30;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(dir.path());
    cfg.sync = SyncPolicy::Never;
    let stop = Arc::new(AtomicBool::new(false));
    let spawner = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut spawned = 0_u32;
            while !stop.load(Ordering::Acquire) {
                let _ = std::process::Command::new("true").status();
                spawned += 1;
            }
            spawned
        })
    };
    let mut refused = 0;
    for _ in 0..REOPENS {
        match Engine::open(cfg.clone()) {
            Ok(e) => {
                e.close().unwrap();
                drop(e);
            }
            Err(Error::Locked { .. }) => refused += 1,
            Err(other) => panic!("reopen failed: {other}"),
        }
    }
    stop.store(true, Ordering::Release);
    let spawned = spawner.join().unwrap();
    assert_eq!(
        refused, 0,
        "{refused} of {REOPENS} reopens found the dropped engine's lock still held \
         ({spawned} children started meanwhile)"
    );
}
