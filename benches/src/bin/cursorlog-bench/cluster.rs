//! Three real `cursorlog serve --node-id … --peers …` processes for `cursorlog-bench
//! replicated`: each member on its own temporary data directory under the bench root and its
//! own loopback port (which is also its `--peers` address), started, SIGKILLed, stopped,
//! wiped and restarted one at a time; the leader is found the way a client finds it (a write
//! on a follower answers `UNAVAILABLE` with the `cursorlog-leader` header).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use crate::spawn::Spawned;
use crate::{pb, status_text, BoxError, Client};

/// Members of the cluster.
pub const MEMBERS: usize = 3;

/// A free loopback address (bound, then released for the server to bind).
fn free_addr() -> Result<String, BoxError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// A 3-member cluster of child processes; every member is killed when dropped.
pub struct Cluster {
    bin: PathBuf,
    sync: String,
    extra: Vec<String>,
    /// Each member's client (and peer) address; member `i` has node id `i + 1`.
    pub addrs: Vec<String>,
    root: TempDir,
    nodes: Vec<Option<Spawned>>,
    channels: Vec<Channel>,
}

impl Cluster {
    /// Starts three members with `extra` flags each (timing, `--server-arg`s).
    pub fn start(bin: &Path, sync: &str, extra: &[String]) -> Result<Self, BoxError> {
        let root = tempfile::Builder::new()
            .prefix("cursorlog-cluster-")
            .tempdir_in(cursorlog_benches::bench_root())?;
        let addrs = (0..MEMBERS)
            .map(|_| free_addr())
            .collect::<Result<Vec<_>, _>>()?;
        let channels = addrs
            .iter()
            .map(|a| {
                Ok(Endpoint::from_shared(format!("http://{a}"))?
                    .connect_timeout(Duration::from_secs(2))
                    .tcp_nodelay(true)
                    .connect_lazy())
            })
            .collect::<Result<Vec<_>, BoxError>>()?;
        let mut c = Self {
            bin: bin.to_owned(),
            sync: sync.to_owned(),
            extra: extra.to_vec(),
            addrs,
            root,
            nodes: (0..MEMBERS).map(|_| None).collect(),
            channels,
        };
        for i in 0..MEMBERS {
            c.start_node(i)?;
        }
        Ok(c)
    }

    /// The directory holding every member's data directory and log.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Keeps the members' directories and logs after the run (for a failed run's post-mortem).
    pub fn keep(&mut self) {
        self.root.disable_cleanup(true);
        eprintln!("keeping {}", self.root.path().display());
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.root.path().join(format!("node{}", i + 1))
    }

    /// The data directory's size in bytes (files only).
    pub fn data_bytes(&self, i: usize) -> u64 {
        fn walk(p: &Path) -> u64 {
            let Ok(entries) = std::fs::read_dir(p) else {
                return 0;
            };
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.data_dir(i))
    }

    /// Starts member `i` on its data directory (restarts it after a kill or stop).
    pub fn start_node(&mut self, i: usize) -> Result<(), BoxError> {
        let peers = self
            .addrs
            .iter()
            .enumerate()
            .map(|(j, a)| format!("{}={a}", j + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut args = vec![
            "--node-id".to_owned(),
            (i + 1).to_string(),
            "--peers".to_owned(),
            peers,
        ];
        args.extend(self.extra.iter().cloned());
        let log = self.root.path().join(format!("node{}.log", i + 1));
        let node = Spawned::start_at(
            &self.bin,
            &self.addrs[i],
            &self.data_dir(i),
            &log,
            &self.sync,
            &args,
        )?;
        self.nodes[i] = Some(node);
        Ok(())
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut n) = self.nodes[i].take() {
            n.kill();
        }
    }

    /// Stops member `i` with SIGTERM (SIGKILL after 30 s).
    pub fn stop(&mut self, i: usize) {
        if let Some(mut n) = self.nodes[i].take() {
            if let Some(note) = n.stop() {
                eprintln!("warning: member {}: {note}", i + 1);
            }
        }
    }

    /// Removes member `i`'s data directory (it must be stopped).
    pub fn wipe(&self, i: usize) -> Result<(), BoxError> {
        let dir = self.data_dir(i);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        Ok(())
    }

    /// Whether member `i` runs.
    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].is_some()
    }

    /// Member `i`'s process id, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].as_ref().map(Spawned::pid)
    }

    /// A client of member `i` (a lazily connected channel that reconnects after restarts).
    pub fn client(&self, i: usize) -> Client {
        pb::cursor_log_client::CursorLogClient::new(self.channels[i].clone())
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024)
    }

    /// The member `cursorlog-leader` names in `s`, if any.
    pub fn hinted(&self, s: &tonic::Status) -> Option<usize> {
        let hint = s.metadata().get("cursorlog-leader")?.to_str().ok()?;
        self.addrs.iter().position(|a| a == hint)
    }

    /// The member that accepts a write now: asks each running member to open `session` (an
    /// idempotent write); a follower answers `UNAVAILABLE` with the leader's address in the
    /// `cursorlog-leader` header, which is tried next. Fails after `timeout`.
    pub async fn leader(&self, session: &str, timeout: Duration) -> Result<usize, BoxError> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no member running");
        loop {
            let mut i = 0;
            let mut tried = 0;
            while i < MEMBERS && tried < 2 * MEMBERS {
                tried += 1;
                if !self.is_up(i) {
                    i += 1;
                    continue;
                }
                let mut request = tonic::Request::new(pb::OpenSessionRequest {
                    session: session.to_owned(),
                    state: None,
                });
                request.set_timeout(Duration::from_secs(5));
                match self.client(i).open_session(request).await {
                    Ok(_) => return Ok(i),
                    Err(s) if s.code() == Code::Unavailable => {
                        last = format!("member {}: {}", i + 1, status_text(&s));
                        match self.hinted(&s) {
                            Some(h) if h != i && self.is_up(h) => i = h,
                            _ => i += 1,
                        }
                    }
                    Err(s) => {
                        last = format!("member {}: {}", i + 1, status_text(&s));
                        i += 1;
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("no leader within {timeout:?}; last answer: {last}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..MEMBERS {
            self.kill(i);
        }
    }
}
