//! What the soak samples from outside the server: its resident set, its open file descriptors
//! (from `/proc/<pid>`, so only for a server on this machine), its data directory's size, and
//! a control: the disk's own `fdatasync` latency, measured beside the server, so a change in
//! append latency can be told apart from a change in the disk under it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::report::{histogram, record};
use crate::BoxError;

/// The server's resident set size in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> Result<u64, BoxError> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    parse_vm_rss(&status).ok_or_else(|| format!("{path} has no parsable VmRSS line").into())
}

/// The server's anonymous resident memory in bytes (`RssAnon` of `/proc/<pid>/status`: its
/// heap and stacks, not the page cache it maps or the kernel's socket buffers).
pub fn rss_anon_bytes(pid: u32) -> Result<u64, BoxError> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    status_kib(&status, "RssAnon:")
        .and_then(|kib| kib.checked_mul(1024))
        .ok_or_else(|| format!("{path} has no parsable RssAnon line").into())
}

/// The `kB` value of the `/proc/<pid>/status` line starting with `key`.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    let value = status.lines().find_map(|l| l.strip_prefix(key))?;
    value.trim().strip_suffix("kB")?.trim().parse().ok()
}

/// `VmRSS:   1234 kB` → bytes.
fn parse_vm_rss(status: &str) -> Option<u64> {
    let value = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib = value
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    kib.checked_mul(1024)
}

/// How many threads the server runs (`Threads` of `/proc/<pid>/status`): not judged, but a
/// thread is a stack and an allocator heap, so it explains RSS steps.
pub fn thread_count(pid: u32) -> Result<u64, BoxError> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    parse_threads(&status).ok_or_else(|| format!("{path} has no parsable Threads line").into())
}

/// `Threads:  4` → 4.
fn parse_threads(status: &str) -> Option<u64> {
    let value = status.lines().find_map(|l| l.strip_prefix("Threads:"))?;
    value.trim().parse().ok()
}

/// How many file descriptors the server has open (entries of `/proc/<pid>/fd`).
pub fn fd_count(pid: u32) -> Result<u64, BoxError> {
    let path = format!("/proc/{pid}/fd");
    let entries = std::fs::read_dir(&path).map_err(|e| format!("listing {path}: {e}"))?;
    Ok(entries.count() as u64)
}

/// Disk space used by everything under `dir`, in bytes: allocated blocks, like `du`, so a
/// preallocated or sparse file counts what it really occupies. Files that vanish while it
/// walks (retention deleting a segment) are skipped, not errors.
pub fn dir_bytes(dir: &Path) -> Result<u64, BoxError> {
    let mut total = 0u64;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d != dir => continue,
            Err(e) => return Err(format!("listing {}: {e}", d.display()).into()),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total = total.saturating_add(meta.blocks().saturating_mul(512));
            }
        }
    }
    Ok(total)
}

/// A thread that appends 512 bytes to a file and `fdatasync`s it every `every`, like a
/// one-event group commit, and records how long each took. The file starts over every 16 MiB
/// and is removed when the probe is dropped.
#[derive(Debug)]
pub struct FsyncProbe {
    latencies: Arc<Mutex<Histogram<u64>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl FsyncProbe {
    /// Starts probing with a file in `dir` (put it on the server's file system).
    pub fn start(dir: &Path, every: Duration) -> Result<Self, BoxError> {
        let path = dir.join(format!("fsync-probe-{}", std::process::id()));
        let open = |p: &Path| -> std::io::Result<File> {
            OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(p)
        };
        let mut file = open(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
        let latencies = Arc::new(Mutex::new(histogram()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (latencies, stop, path) = (Arc::clone(&latencies), Arc::clone(&stop), path.clone());
            std::thread::Builder::new()
                .name("fsync-probe".into())
                .spawn(move || {
                    let body = [b'x'; 512];
                    let mut written = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        if written >= 16 * 1024 * 1024 {
                            match open(&path) {
                                Ok(f) => file = f,
                                Err(_) => return,
                            }
                            written = 0;
                        }
                        if file
                            .write_all(&body)
                            .and_then(|()| file.sync_data())
                            .is_err()
                        {
                            return; // No figure rather than a wrong one: the column stays empty.
                        }
                        written += body.len() as u64;
                        record(
                            &mut latencies
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner),
                            t.elapsed(),
                        );
                        std::thread::sleep(every.saturating_sub(t.elapsed()));
                    }
                })?
        };
        Ok(Self {
            latencies,
            stop,
            thread: Some(thread),
            path,
        })
    }

    /// The latencies since the last call (and starts a new interval).
    pub fn take(&self) -> Histogram<u64> {
        let mut h = self
            .latencies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::replace(&mut *h, histogram())
    }
}

impl Drop for FsyncProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_kib() {
        let status = "Name:\tcursorlog\nVmPeak:\t  9000 kB\nVmRSS:\t   2048 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(2048 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\tlots kB\n"), None);
        assert_eq!(parse_threads(status), Some(4));
        assert_eq!(parse_threads("Threads:\tmany\n"), None);
    }

    #[test]
    fn this_process_is_probed() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).expect("own rss") > 0);
        // At least stdin/stdout/stderr and the directory handle used to list them.
        assert!(fd_count(pid).expect("own fds") >= 3);
    }

    #[test]
    fn the_fsync_probe_records_and_cleans_up() {
        let dir = tempfile::tempdir().expect("temp dir");
        let probe = FsyncProbe::start(dir.path(), Duration::from_millis(1)).expect("probe");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = 0;
        while seen < 3 && Instant::now() < deadline {
            std::thread::yield_now();
            seen += probe.take().len();
        }
        assert!(seen >= 3, "{seen} fdatasyncs recorded in 30 s");
        drop(probe);
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0);
    }

    #[test]
    fn dir_bytes_counts_nested_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(dir_bytes(dir.path()).expect("empty dir"), 0);
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("a"), vec![1u8; 10_000]).expect("write a");
        std::fs::write(dir.path().join("sub/b"), vec![2u8; 50_000]).expect("write b");
        let bytes = dir_bytes(dir.path()).expect("dir bytes");
        assert!(bytes >= 60_000, "{bytes} bytes for 60,000 bytes of data");
        assert!(dir_bytes(&dir.path().join("missing")).is_err());
    }
}
