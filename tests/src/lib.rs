//! Helpers for the end-to-end tests: start the real `cursorlog` binary on `127.0.0.1:0` with
//! a temporary data directory, connect gRPC clients to it, and stop it (SIGTERM or kill).
//!
//! The binary is found next to the test executable's directory (`target/<profile>/cursorlog`);
//! `cargo test --workspace` builds it. Set `CURSORLOG_BIN` to test another build.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test helpers"
)]

use std::io::{BufRead, BufReader, Read as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use cursorlog_proto::v1 as pb;
use cursorlog_proto::v1::cursor_log_client::CursorLogClient;
pub use ports::free_addr;
use tempfile::TempDir;
use tonic::transport::Channel;

pub mod cluster;
pub mod fault;
pub mod history;
pub mod ports;
pub mod proxy;

/// How long the binary may take to start listening (debug builds, recovery).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the binary may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// The `cursorlog` binary under test.
///
/// # Panics
/// When it has not been built.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CURSORLOG_BIN") {
        return PathBuf::from(path);
    }
    // Test executables live in target/<profile>/deps/; the binary in target/<profile>/.
    let exe = std::env::current_exe().expect("current test executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile> directory");
    let path = profile_dir.join(format!("cursorlog{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "{} does not exist: run `cargo build -p cursorlog-server` first (cargo test --workspace \
         builds it), or set CURSORLOG_BIN",
        path.display()
    );
    // `cargo test -p cursorlog-tests` alone does not rebuild another package's binary; refuse
    // to test a binary older than the sources it is built from.
    let built = path
        .metadata()
        .and_then(|m| m.modified())
        .expect("binary mtime");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let sources = [
        "server/src",
        "server/Cargo.toml",
        "engine/src",
        "engine/Cargo.toml",
        "replication/src",
        "replication/Cargo.toml",
    ];
    let protos = [
        "proto/src",
        "proto/proto",
        "proto/build.rs",
        "proto/Cargo.toml",
    ];
    for source in sources.iter().chain(&protos) {
        if let Some(newer) = newer_than(&workspace.join(source), built) {
            panic!(
                "{} is older than {}: run `cargo build -p cursorlog-server` (or test with \
                 `cargo test --workspace`)",
                path.display(),
                newer.display()
            );
        }
    }
    path
}

/// A file at or under `path` modified after `time`, if any.
fn newer_than(path: &Path, time: std::time::SystemTime) -> Option<PathBuf> {
    if path.is_file() {
        let modified = path.metadata().and_then(|m| m.modified()).ok()?;
        return (modified > time).then(|| path.to_path_buf());
    }
    let entries = std::fs::read_dir(path).ok()?;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if let Some(found) = newer_than(&entry.path(), time) {
            return Some(found);
        }
    }
    None
}

/// A running `cursorlog serve` child process. Killed when dropped.
#[derive(Debug)]
pub struct Server {
    child: Child,
    /// The gRPC address it listens on.
    pub addr: SocketAddr,
    /// The metrics address, when started with `--metrics-listen`.
    pub metrics_addr: Option<SocketAddr>,
    /// Its data directory.
    pub data_dir: PathBuf,
    stdout_lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Captured>,
    _temp: Option<TempDir>,
}

/// A child's stderr as read so far, with a signal for every piece read: waiting for a log
/// line waits for the read that brings it, not for a guessed time.
#[derive(Debug, Default)]
struct Captured {
    text: Mutex<String>,
    /// Notified after every read from the pipe.
    grew: Condvar,
}

/// How to start a server: [`Server::start_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Start<'a> {
    /// The data directory (kept); `None`: a fresh temporary one.
    pub data_dir: Option<&'a Path>,
    /// `--listen`; `None`: `127.0.0.1:0`.
    pub listen: Option<&'a str>,
    /// More arguments after `serve --listen .. --data-dir ..`.
    pub args: &'a [&'a str],
    /// Environment variables to set (every other `CURSORLOG_*` variable is removed).
    pub env: &'a [(&'a str, &'a str)],
}

impl Server {
    /// Starts a server on a fresh temporary data directory.
    pub fn start(extra_args: &[&str]) -> Self {
        Self::start_with(Start {
            args: extra_args,
            ..Start::default()
        })
    }

    /// Starts a server on `data_dir` (kept after the server stops).
    pub fn start_in(data_dir: &Path, extra_args: &[&str]) -> Self {
        Self::start_with(Start {
            data_dir: Some(data_dir),
            args: extra_args,
            ..Start::default()
        })
    }

    /// Starts a server as `start` says.
    pub fn start_with(start: Start<'_>) -> Self {
        let temp = match start.data_dir {
            Some(_) => None,
            None => Some(tempfile::tempdir().unwrap()),
        };
        let data_dir = start
            .data_dir
            .or(temp.as_ref().map(TempDir::path))
            .unwrap()
            .to_path_buf();
        let mut command = Command::new(binary());
        command
            .arg("serve")
            .arg("--listen")
            .arg(start.listen.unwrap_or("127.0.0.1:0"))
            .arg("--data-dir")
            .arg(&data_dir)
            .args(start.args);
        clean_env(&mut command);
        command.envs(start.env.iter().copied());
        let mut child = command
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cursorlog");
        let stderr = Arc::new(Captured::default());
        let mut err_pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = [0_u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.text
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
                sink.grew.notify_all();
            }
        });
        let stdout_lines = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&stdout_lines);
        let out_pipe = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out_pipe).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        let mut metrics_addr = None;
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(a) = line.strip_prefix("metrics listening on ") {
                        metrics_addr = Some(a.parse().unwrap());
                    } else if let Some(a) = line.strip_prefix("listening on ") {
                        break a.parse::<SocketAddr>().unwrap();
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait();
                    // The child was the pipe's only writer: once it is gone the reader
                    // reaches end of file, having read everything it logged.
                    let _ = stderr_reader.join();
                    panic!(
                        "cursorlog did not print `listening on` (exit: {status:?}); stderr:\n{}",
                        stderr.text.lock().unwrap()
                    );
                }
            }
        };
        Self {
            child,
            addr,
            metrics_addr,
            data_dir,
            stdout_lines,
            stderr,
            _temp: temp,
        }
    }

    /// A new gRPC client connection (one per simulated front-end replica).
    pub async fn client(&self) -> CursorLogClient<Channel> {
        CursorLogClient::new(self.channel().await)
    }

    /// A new connection to the server.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.connect_addr()))
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("connect to cursorlog")
    }

    /// The address to connect to: `addr`, with an unspecified IP (`0.0.0.0`) as loopback.
    pub fn connect_addr(&self) -> SocketAddr {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        addr
    }

    /// Everything the server logged to stderr so far.
    pub fn logs(&self) -> String {
        self.stderr.text.lock().unwrap().clone()
    }

    /// Waits (up to 10 s) until the server's stderr contains `needle`; false if it never does.
    /// Stderr is read by another thread, so a line logged just before the `listening on` line
    /// on stdout may arrive a little later.
    pub fn wait_for_log(&self, needle: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut text = self.stderr.text.lock().unwrap();
        while !text.contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            text = self.stderr.grew.wait_timeout(text, left).unwrap().0;
        }
        true
    }

    /// Every line printed to stdout so far.
    pub fn stdout(&self) -> Vec<String> {
        self.stdout_lines.lock().unwrap().clone()
    }

    /// How the process ended, if it has (a member that died under a test says how: a signal
    /// leaves no line in its own log).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `SIGKILL`s the process (no shutdown path runs) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the process to exit.
    ///
    /// # Panics
    /// When it does not exit within 30 s.
    pub fn terminate(&mut self) -> ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
        self.wait_exit()
    }

    /// Waits for the process to exit on its own.
    ///
    /// # Panics
    /// When it does not exit within 30 s.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let child = &mut self.child;
        // A helper thread blocks in `wait` (the exit is the event); past the deadline the
        // process is killed, which ends that `wait` too, and the test fails.
        let exited = std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            scope.spawn(move || {
                let _ = tx.send(child.wait());
            });
            match rx.recv_timeout(STOP_TIMEOUT) {
                Ok(status) => Some(status.unwrap()),
                Err(_) => {
                    let _ = Command::new("kill").args(["-KILL", &pid]).status();
                    None
                }
            }
        });
        exited.unwrap_or_else(|| {
            panic!(
                "cursorlog did not exit within {STOP_TIMEOUT:?}; stderr:\n{}",
                self.logs()
            )
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Removes every inherited `CURSORLOG_*` variable (but `CURSORLOG_BIN`) from `command`, so a
/// developer's environment cannot change what a test starts.
fn clean_env(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let name = key.to_string_lossy();
        if name.starts_with("CURSORLOG_") && name != "CURSORLOG_BIN" {
            command.env_remove(&key);
        }
    }
}

/// Runs the binary with `args` to completion (for `verify`, `inspect`): status, stdout, stderr.
pub fn run_tool(args: &[&str]) -> (ExitStatus, String, String) {
    run_tool_env(args, &[])
}

/// [`run_tool`] with environment variables set (and other `CURSORLOG_*` ones removed). A
/// `serve` that unexpectedly starts is killed after 30 s so the test fails instead of hanging.
pub fn run_tool_env(args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String, String) {
    let mut command = Command::new(binary());
    command.args(args);
    clean_env(&mut command);
    let child = command
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(STOP_TIMEOUT).is_err() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = done_tx.send(());
    let _ = watchdog.join();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A plain HTTP/1.1 `GET /metrics` to `addr` with extra header lines; the whole response.
pub fn http_get(addr: SocketAddr, headers: &[&str]) -> String {
    use std::io::Write as _;
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut request = String::from("GET /metrics HTTP/1.1\r\nhost: test\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    socket.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).unwrap();
    response
}

/// The value of metric `name` (no labels) on a metrics page, if present.
pub fn metric(page: &str, name: &str) -> Option<u64> {
    page.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok())?
    })
}

/// The health status of `service` ("" for the whole server).
pub async fn health(
    channel: &Channel,
    service: &str,
) -> tonic_health::pb::health_check_response::ServingStatus {
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    client
        .check(tonic_health::pb::HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .status()
}

/// The interceptor of [`client_with_token`].
pub type WithToken = tonic::service::interceptor::InterceptedService<Channel, BearerInterceptor>;

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Debug, Clone)]
pub struct BearerInterceptor(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

/// A cursorlog client that sends `authorization: Bearer <token>` on every call.
pub fn client_with_token(channel: Channel, token: &str) -> CursorLogClient<WithToken> {
    let value = format!("Bearer {token}").parse().unwrap();
    CursorLogClient::with_interceptor(channel, BearerInterceptor(value))
}

/// An event to append.
pub fn event(kind: &str, payload: &[u8]) -> pb::NewEvent {
    pb::NewEvent {
        kind: kind.to_owned(),
        correlation: None,
        payload: payload.to_vec(),
    }
}

/// Opens `session` and a stream in it; returns (epoch, stream).
pub async fn open_stream(
    client: &mut CursorLogClient<Channel>,
    session: &str,
    correlation: Option<&str>,
    lease_ms: Option<u64>,
) -> (u64, u64) {
    let epoch = client
        .open_session(pb::OpenSessionRequest {
            session: session.to_owned(),
            state: None,
        })
        .await
        .unwrap()
        .into_inner()
        .epoch;
    let opened = client
        .open_stream(pb::OpenStreamRequest {
            session: session.to_owned(),
            epoch,
            correlation: correlation.map(str::to_owned),
            lease_ms,
        })
        .await
        .unwrap()
        .into_inner();
    (opened.epoch, opened.stream)
}

/// Appends one event per payload, as one batch; returns the response.
pub async fn append(
    client: &mut CursorLogClient<Channel>,
    session: &str,
    stream: u64,
    kind: &str,
    payloads: &[&[u8]],
) -> pb::AppendResponse {
    client
        .append(pb::AppendRequest {
            session: session.to_owned(),
            stream,
            expected_next_seq: None,
            events: payloads.iter().map(|p| event(kind, p)).collect(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// Resolves `cursor` in `session`.
pub async fn resolve(
    client: &mut CursorLogClient<Channel>,
    session: &str,
    cursor: &str,
    declared_stream: Option<u64>,
) -> pb::Resolution {
    client
        .resolve(pb::ResolveRequest {
            session: session.to_owned(),
            last_event_id: cursor.to_owned(),
            declared_stream,
        })
        .await
        .unwrap()
        .into_inner()
}

/// What a whole Read call delivered.
#[derive(Debug, Default)]
pub struct ReadAll {
    /// The first message.
    pub resolution: Option<pb::Resolution>,
    /// Every event, in delivery order.
    pub events: Vec<pb::Event>,
    /// Number of event batch messages.
    pub batches: usize,
    /// The final `end` message, if any.
    pub end: Option<pb::StreamEnd>,
    /// Evicted runs reported (`gap` messages), in order, as (first seq, last seq).
    pub gaps: Vec<(u64, u64)>,
    /// The error the call ended with, if any.
    pub error: Option<tonic::Status>,
}

/// How far a Read call collected by [`read_all_watched`] has got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadProgress {
    /// The resolution (the first message) has arrived.
    pub resolved: bool,
    /// Events received so far.
    pub events: usize,
}

/// Collects a Read call to its end (with a timeout).
pub async fn read_all(
    client: &mut CursorLogClient<Channel>,
    request: pb::ReadRequest,
    timeout: Duration,
) -> ReadAll {
    read_all_watched(client, request, timeout, None).await
}

/// [`read_all`], publishing its progress after every message: a test waits on the watch for
/// the point it needs (a follower has its resolution, has caught up to the head) before it
/// acts, instead of sleeping and hoping the call got there.
pub async fn read_all_watched(
    client: &mut CursorLogClient<Channel>,
    request: pb::ReadRequest,
    timeout: Duration,
    progress: Option<tokio::sync::watch::Sender<ReadProgress>>,
) -> ReadAll {
    let mut all = ReadAll::default();
    // A refusal before the first message (a member that no longer leads answers
    // UNAVAILABLE) is the call's error, like one that ends the stream.
    let mut stream = match client.read(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            all.error = Some(status);
            return all;
        }
    };
    let collect = async {
        loop {
            match stream.message().await {
                Ok(Some(msg)) => {
                    absorb(&mut all, msg);
                    if let Some(p) = &progress {
                        p.send_replace(ReadProgress {
                            resolved: all.resolution.is_some(),
                            events: all.events.len(),
                        });
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    all.error = Some(status);
                    break;
                }
            }
        }
    };
    tokio::time::timeout(timeout, collect)
        .await
        .expect("read call did not end in time");
    all
}

/// Adds one Read message to `all`, checking the protocol's ordering rules.
pub fn absorb(all: &mut ReadAll, msg: pb::ReadResponse) {
    use pb::read_response::Item;
    assert!(all.end.is_none(), "message after the end message: {msg:?}");
    match msg.item.expect("read message without item") {
        Item::Resolution(r) => {
            assert!(all.resolution.is_none(), "second resolution");
            all.resolution = Some(r);
        }
        Item::Events(batch) => {
            assert!(all.resolution.is_some(), "events before the resolution");
            assert!(!batch.events.is_empty(), "empty event batch");
            all.batches += 1;
            all.events.extend(batch.events);
        }
        Item::End(end) => {
            assert!(all.resolution.is_some(), "end before the resolution");
            all.end = Some(end);
        }
        Item::Gap(gap) => {
            assert!(all.resolution.is_some(), "gap before the resolution");
            assert!(gap.first_seq <= gap.last_seq, "empty gap {gap:?}");
            if let Some(last) = all.events.last() {
                assert_eq!(
                    gap.first_seq,
                    last.seq + 1,
                    "gap does not follow the events"
                );
            }
            all.gaps.push((gap.first_seq, gap.last_seq));
        }
    }
}

/// A Read request.
pub fn read_request(session: &str, cursor: &str, follow: bool) -> pb::ReadRequest {
    pb::ReadRequest {
        session: session.to_owned(),
        last_event_id: cursor.to_owned(),
        declared_stream: None,
        follow,
        batch_events_max: 0,
        resume_own_stream: false,
    }
}

/// Asserts `events` are exactly seqs `from..=to` of one stream, in order.
pub fn assert_contiguous(events: &[pb::Event], from: u64, to: u64) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (from..=to).collect();
    assert_eq!(
        seqs, expected,
        "events are not exactly seqs {from}..={to} in order"
    );
}

/// Starts member `id` (from 1) of a cluster whose member `i + 1` listens on `addrs[i]`, on
/// `dir`, with 500 ms elections and 50 ms heartbeats (fast failover for tests), plus `extra`.
pub fn start_member(id: usize, addrs: &[String], dir: &Path, extra: &[&str]) -> Server {
    let peers = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let id_text = id.to_string();
    let mut args = vec![
        "--node-id",
        &id_text,
        "--peers",
        &peers,
        "--election-timeout-ms",
        "500",
        "--heartbeat-ms",
        "50",
    ];
    args.extend_from_slice(extra);
    Server::start_with(Start {
        data_dir: Some(dir),
        listen: Some(&addrs[id - 1]),
        args: &args,
        ..Start::default()
    })
}
