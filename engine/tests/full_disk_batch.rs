//! A refusal is a claim about the state, and on a single node it may be planned against a
//! group of its own batch that the disk then refuses (issue 30 item 1, the review's R3 on a
//! single node): it must not be released as if that group had been written.
//!
//! The writer is held in the fdatasync of one append (a gate in the file system) while two
//! appends queue behind it: A, at the next seq, and B, at the same seq with other events.
//! They are planned in one batch, A first, so B is refused as a seq conflict against A's
//! head. The disk is then full for A's write: A is refused `DiskFull`, and B must be too, not
//! "stream head is 3", which would claim a head the log never had.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cursorlog_engine::{
    Append, Config, Engine, Error, FaultyFs, FileSystem, NewEvent, OpenStream, SegmentFile,
    SyncPolicy,
};

/// Syncs wait while the gate is shut; writes fail with ENOSPC while `full`.
#[derive(Debug, Default)]
struct Gate {
    shut: Mutex<(bool, usize)>,
    changed: Condvar,
    full: AtomicBool,
}

impl Gate {
    fn shut(&self) {
        self.shut.lock().unwrap().0 = true;
    }

    fn open(&self) {
        self.shut.lock().unwrap().0 = false;
        self.changed.notify_all();
    }

    /// Waits until a sync is held at the gate.
    fn wait_for_a_held_sync(&self) {
        let held = self.shut.lock().unwrap();
        let (guard, timeout) = self
            .changed
            .wait_timeout_while(held, Duration::from_secs(60), |(_, waiting)| *waiting == 0)
            .unwrap();
        drop(guard);
        assert!(!timeout.timed_out(), "no sync reached the gate");
    }

    fn pass(&self) {
        let mut s = self.shut.lock().unwrap();
        s.1 += 1;
        self.changed.notify_all();
        s = self.changed.wait_while(s, |(shut, _)| *shut).unwrap();
        s.1 -= 1;
    }
}

#[derive(Debug)]
struct GatedFs {
    inner: FaultyFs,
    gate: Arc<Gate>,
}

#[derive(Debug)]
struct GatedFile {
    inner: Arc<dyn SegmentFile>,
    gate: Arc<Gate>,
}

impl SegmentFile for GatedFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.gate.full.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "test: disk full",
            ));
        }
        self.inner.write_all_at(buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.gate.pass();
        self.inner.sync_data()
    }
    fn set_len_and_sync(&self, len: u64) -> io::Result<()> {
        self.inner.set_len_and_sync(len)
    }
}

impl GatedFs {
    fn wrap(&self, f: io::Result<Arc<dyn SegmentFile>>) -> io::Result<Arc<dyn SegmentFile>> {
        f.map(|inner| {
            Arc::new(GatedFile {
                inner,
                gate: Arc::clone(&self.gate),
            }) as Arc<dyn SegmentFile>
        })
    }
}

impl FileSystem for GatedFs {
    fn create_new(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        self.wrap(self.inner.create_new(path))
    }
    fn open(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        self.wrap(self.inner.open(path))
    }
    fn open_read_only(&self, path: &Path) -> io::Result<Arc<dyn SegmentFile>> {
        self.wrap(self.inner.open_read_only(path))
    }
    fn boot_id(&self) -> Option<[u8; 16]> {
        self.inner.boot_id()
    }
    fn available_bytes(&self, dir: &Path) -> io::Result<u64> {
        self.inner.available_bytes(dir)
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.inner.read(path)
    }
    fn len(&self, path: &Path) -> io::Result<u64> {
        self.inner.len(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
        self.inner.list(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
}

fn append(stream: u64, seq: u64, payload: &[u8]) -> Append {
    Append {
        session: "s".into(),
        stream,
        expected_next_seq: Some(seq),
        events: vec![NewEvent::new("p", payload.to_vec())],
    }
}

#[tokio::test]
async fn a_refusal_planned_against_a_group_the_full_disk_refused_is_not_released() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let fs = GatedFs {
        inner: FaultyFs::new(7),
        gate: Arc::clone(&gate),
    };
    let mut config = Config::new(dir.path());
    config.sync = SyncPolicy::Always;
    config.disk_reserve_bytes = 0;
    let e = Engine::open_with_fs(config, Arc::new(fs)).unwrap();
    let epoch = e.open_session("s").unwrap().epoch;
    let s = e
        .open_stream(OpenStream {
            session: "s".into(),
            epoch,
            correlation: None,
            lease_ms: None,
        })
        .unwrap()
        .stream;
    e.append_async(append(s, 1, b"one")).await.unwrap();

    // The writer is held in the fdatasync of seq 2, so A and B queue behind it, in order.
    gate.shut();
    let held = e.queue_append(append(s, 2, b"two")).await.unwrap();
    let held = tokio::spawn(held);
    tokio::task::spawn_blocking({
        let gate = Arc::clone(&gate);
        move || gate.wait_for_a_held_sync()
    })
    .await
    .unwrap();
    let a = e.queue_append(append(s, 3, b"A")).await.unwrap();
    let b = e
        .queue_append(append(s, 3, b"B, other events"))
        .await
        .unwrap();
    // Seq 2 is synced; then the disk is full for the batch of A and B.
    gate.full.store(true, Ordering::Release);
    gate.open();
    assert_eq!(held.await.unwrap().unwrap().last_seq, 2);
    match a.await {
        Err(Error::DiskFull { .. }) => {}
        other => panic!("A: expected DiskFull, got {other:?}"),
    }
    match b.await {
        Err(Error::DiskFull { .. }) => {}
        other => panic!(
            "B was planned against A, which the disk refused: it must be refused as A was, \
             not answered {other:?}"
        ),
    }
    // The stream's head is 2: what B would have claimed (3) never held.
    assert_eq!(e.read("s", s, 0, 10).unwrap().head, 2);
    assert!(!e.is_poisoned());
}
