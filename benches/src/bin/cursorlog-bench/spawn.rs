//! `--spawn`: start `cursorlog serve` on a temporary data directory on the repository's disk,
//! wait for its `listening on ADDR` line, and stop it (SIGTERM, then SIGKILL) at the end.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::BoxError;

/// How long the server may take to print `listening on`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long it may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A `cursorlog serve` child process; killed when dropped.
#[derive(Debug)]
pub struct Spawned {
    child: Child,
    /// The address it listens on.
    pub addr: String,
    /// Where its stderr goes (inside the temporary directory).
    pub log_path: PathBuf,
    /// Its data directory (inside the temporary directory).
    pub data_dir: PathBuf,
    dir: Option<TempDir>,
}

/// The `cursorlog` binary next to this executable (`target/<profile>/cursorlog`).
pub fn default_server_bin() -> Result<PathBuf, BoxError> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or("executable without a directory")?;
    let path = dir.join(format!("cursorlog{}", std::env::consts::EXE_SUFFIX));
    if !path.is_file() {
        return Err(format!(
            "{} does not exist: build it with `cargo build --release -p cursorlog-server` \
             (same profile as this binary) or pass --server-bin",
            path.display()
        )
        .into());
    }
    Ok(path)
}

impl Spawned {
    /// Starts `bin serve --listen 127.0.0.1:0 --data-dir <temp>/data --sync <sync> <extra>`.
    pub fn start(bin: &Path, sync: &str, extra: &[String]) -> Result<Self, BoxError> {
        let dir = tempfile::Builder::new()
            .prefix("cursorlog-loadgen-")
            .tempdir_in(cursorlog_benches::bench_root())?;
        let data = dir.path().join("data");
        let log_path = dir.path().join("server.log");
        let mut s = Self::start_at(bin, "127.0.0.1:0", &data, &log_path, sync, extra)?;
        s.dir = Some(dir);
        Ok(s)
    }

    /// Starts `bin serve --listen <listen> --data-dir <data> --sync <sync> <extra>` with its
    /// stderr appended to `log_path`; the caller owns (and removes) both paths.
    pub fn start_at(
        bin: &Path,
        listen: &str,
        data: &Path,
        log_path: &Path,
        sync: &str,
        extra: &[String],
    ) -> Result<Self, BoxError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)?;
        let mut child = Command::new(bin)
            .arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--data-dir")
            .arg(data)
            .arg("--sync")
            .arg(sync)
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let out = child.stdout.take().ok_or("no stdout pipe")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    // Keep draining so the server never blocks on a full pipe.
                    continue;
                }
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(a) = line.strip_prefix("listening on ") {
                        break a.trim().to_owned();
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let log = std::fs::read_to_string(log_path).unwrap_or_default();
                    return Err(
                        format!("cursorlog did not print `listening on`; stderr:\n{log}").into(),
                    );
                }
            }
        };
        eprintln!(
            "spawned {} (pid {}) on {addr}, data in {}, sync {sync}",
            bin.display(),
            child.id(),
            data.display()
        );
        Ok(Self {
            child,
            addr,
            log_path: log_path.to_owned(),
            data_dir: data.to_owned(),
            dir: None,
        })
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Keeps the data directory after the run (prints where it is).
    pub fn keep_data(&mut self) {
        if let Some(dir) = self.dir.take() {
            eprintln!("keeping {}", dir.keep().display());
        }
    }

    /// SIGTERM, wait up to 30 s, then SIGKILL. Returns a note when the exit was not clean.
    pub fn stop(&mut self) -> Option<String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(format!("cursorlog had already exited: {status}"));
        }
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        if sent.map(|s| s.success()).unwrap_or(false) {
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                match self.child.try_wait() {
                    Ok(Some(status)) if status.success() => return None,
                    Ok(Some(status)) => return Some(format!("cursorlog exited with {status}")),
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => return Some(format!("waiting for cursorlog: {e}")),
                }
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Some("cursorlog did not stop on SIGTERM within 30 s; killed".to_owned())
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
