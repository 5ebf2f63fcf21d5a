//! A three-member `cursorlog` cluster of real processes for fault tests (issue 19 item 7).
//!
//! Every directed peer link i→j runs through its own [`Proxy`] (member i is started with
//! `--peer-route j=<proxy>`), so a test can cut, half-cut or heal any link; clients talk to
//! the members directly. The members are SIGKILLed, SIGSTOPped, restarted, wiped, and their
//! segment files damaged while they are down. [`Cluster::call`] is a client that follows the
//! `cursorlog-leader` hints and tells a failure that may have taken effect from one that did
//! not (`cursorlog-retry`, a timeout, a broken connection).

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use cursorlog_proto::v1::cursor_log_client::CursorLogClient;
use tempfile::TempDir;
use tokio::sync::OwnedMutexGuard;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::free_addr;
use crate::proxy::{Mode, Proxy};
use crate::{fault, pb, run_tool, Server, Start};

/// Members in the cluster.
pub const MEMBERS: usize = 3;
/// How long one client RPC may take before the harness gives up on it (outcome unknown).
pub const RPC_TIMEOUT: Duration = Duration::from_secs(3);
/// The bound of every wait for the cluster (elections and catch-up on a loaded machine).
pub const WAIT: Duration = Duration::from_secs(90);

/// A gRPC client of one member.
pub type Client = CursorLogClient<Channel>;

/// Who answered a call (see [`Cluster::call`]).
#[derive(Debug, Clone, Copy)]
pub struct Answered {
    /// An earlier attempt may have taken effect.
    pub uncertain: bool,
    /// The member that answered.
    pub member: usize,
}

/// How a call failed (see [`Cluster::call`]).
#[derive(Debug)]
pub struct CallError {
    /// The final status (not UNAVAILABLE: those are retried until the deadline).
    pub status: Status,
    /// An earlier attempt may have taken effect (timeout, broken connection,
    /// `cursorlog-retry: outcome-unknown`).
    pub uncertain: bool,
}

/// Member index of a `cursorlog-leader` hint, if it names one.
fn hinted(addrs: &[String], status: &Status) -> Option<usize> {
    let hint = status.metadata().get("cursorlog-leader")?.to_str().ok()?;
    addrs.iter().position(|a| a == hint)
}

/// True for an answer [`Cluster::call`] resends after: UNAVAILABLE, and a connection that
/// broke or closed under the call (the member died: the request may have taken effect).
fn retried(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    )
        // The member closed the connection (h2 GOAWAY, e.g. `too_many_resets` after the
        // harness's timeouts reset many calls): a transport failure, not an answer.
        || status.message().starts_with("h2 protocol error")
}

/// True when the UNAVAILABLE answer says nothing was proposed.
pub fn retry_is_safe(status: &Status) -> bool {
    status
        .metadata()
        .get("cursorlog-retry")
        .and_then(|v| v.to_str().ok())
        == Some("safe")
}

/// Three members, their data directories, and a proxy on every directed peer link.
#[derive(Debug)]
pub struct Cluster {
    /// Client (and `--peers`) address of each member.
    pub addrs: Vec<String>,
    dirs: Vec<TempDir>,
    channels: Vec<Channel>,
    /// `proxies[i][j]`: the link member i dials member j through (`None` on the diagonal).
    proxies: Vec<Vec<Option<Proxy>>>,
    nodes: Mutex<Vec<Option<Server>>>,
    extra: Vec<String>,
    /// The member clients try first (the last one that answered as leader).
    hint: AtomicUsize,
    /// Whether the members' logs were dumped already (a failure dumps them once).
    dumped: AtomicBool,
    /// Members run with `--fault-power-cut-boot` (a kill is a power cut): this boot number.
    power_cut_boot: Option<AtomicU64>,
    /// This cluster's turn: one runs at a time in a test process ([`ONE_AT_A_TIME`]).
    _turn: OwnedMutexGuard<()>,
}

/// Serialises the clusters of one test process. Two 3-member clusters of debug builds on a
/// 2-core CI machine starve each other's heartbeats: a fault test run beside the large-entry
/// catch-up test saw no progress for 90 s (CI at `b6c9fca`). Tests measure faults, not that.
static ONE_AT_A_TIME: LazyLock<Arc<tokio::sync::Mutex<()>>> = LazyLock::new(Arc::default);

impl Cluster {
    /// Starts three members with `extra` flags (timings, segment size) on fresh directories,
    /// once any other cluster of this test process has ended.
    ///
    /// # Panics
    /// When a proxy or a member does not start.
    pub async fn start(extra: &[&str]) -> Self {
        Self::start_as(extra, false).await
    }

    /// As [`Cluster::start`], but every member holds its writes in memory until their
    /// fdatasync (the hidden `--fault-power-cut-boot`), so [`Cluster::kill`] is a power cut
    /// of that member and [`Cluster::power_cut_all`] one of the whole cluster.
    ///
    /// # Panics
    /// As [`Cluster::start`].
    pub async fn start_with_power_cuts(extra: &[&str]) -> Self {
        Self::start_as(extra, true).await
    }

    async fn start_as(extra: &[&str], power_cuts: bool) -> Self {
        let turn = Arc::clone(&ONE_AT_A_TIME).lock_owned().await;
        let addrs: Vec<String> = (0..MEMBERS).map(|_| free_addr()).collect();
        let mut proxies = Vec::new();
        for i in 0..MEMBERS {
            let mut row = Vec::new();
            for (j, addr) in addrs.iter().enumerate() {
                row.push(if i == j {
                    None
                } else {
                    let target: SocketAddr = addr.parse().expect("a socket address");
                    Some(Proxy::start(target).await.expect("start a link proxy"))
                });
            }
            proxies.push(row);
        }
        let channels = addrs
            .iter()
            .map(|a| {
                Channel::from_shared(format!("http://{a}"))
                    .expect("a valid uri")
                    .connect_timeout(Duration::from_secs(2))
                    .connect_lazy()
            })
            .collect();
        let cluster = Self {
            addrs,
            dirs: (0..MEMBERS)
                .map(|_| tempfile::tempdir().expect("temp dir"))
                .collect(),
            channels,
            proxies,
            nodes: Mutex::new((0..MEMBERS).map(|_| None).collect()),
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            hint: AtomicUsize::new(0),
            dumped: AtomicBool::new(false),
            power_cut_boot: power_cuts.then(|| AtomicU64::new(1)),
            _turn: turn,
        };
        for i in 0..MEMBERS {
            cluster.restart(i);
        }
        cluster
    }

    /// The `cursorlog serve` arguments of member `i` after `--listen` and `--data-dir`.
    fn args(&self, i: usize) -> Vec<String> {
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
            "--disk-reserve-bytes".to_owned(),
            "0".to_owned(),
        ];
        for (j, proxy) in self.proxies[i].iter().enumerate() {
            if let Some(p) = proxy {
                args.push("--peer-route".to_owned());
                args.push(format!("{}={}", j + 1, p.addr()));
            }
        }
        if let Some(boot) = &self.power_cut_boot {
            args.push("--fault-power-cut-boot".to_owned());
            args.push(boot.load(Ordering::Relaxed).to_string());
        }
        args.extend(self.extra.iter().cloned());
        args
    }

    /// Cuts the power of every member at once: SIGKILLs them all (with
    /// [`Cluster::start_with_power_cuts`], what they had not synced is lost) and starts a
    /// new boot, so recovery sees one. Restart them with [`Cluster::restart`].
    ///
    /// # Panics
    /// When the cluster was not started with power cuts.
    pub fn power_cut_all(&self) {
        let Some(boot) = &self.power_cut_boot else {
            panic!("power_cut_all needs Cluster::start_with_power_cuts")
        };
        let servers: Vec<Server> = {
            let mut nodes = self.nodes.lock().expect("nodes lock");
            nodes.iter_mut().filter_map(Option::take).collect()
        };
        tokio::task::block_in_place(|| {
            for mut s in servers {
                s.kill();
            }
        });
        boot.fetch_add(1, Ordering::Relaxed);
    }

    /// SIGTERMs every running member at once (one `kill` for all, so none outlives the
    /// others long enough to elect and append) and waits for each to exit.
    ///
    /// # Panics
    /// When a member does not exit.
    pub fn stop_all(&self) {
        let mut servers: Vec<Server> = {
            let mut nodes = self.nodes.lock().expect("nodes lock");
            nodes.iter_mut().filter_map(Option::take).collect()
        };
        let mut args = vec!["-TERM".to_owned()];
        args.extend(servers.iter().map(|s| s.pid().to_string()));
        tokio::task::block_in_place(|| {
            let sent = std::process::Command::new("kill")
                .args(&args)
                .status()
                .expect("run kill");
            assert!(sent.success(), "kill -TERM failed");
            for s in &mut servers {
                s.wait_exit();
            }
        });
    }

    /// The digests `cursorlog inspect --digest` prints for member `i`'s directory (the
    /// member must be stopped): its committed log, and the sessions and streams rebuilt
    /// from it.
    ///
    /// # Panics
    /// When the command fails.
    pub fn digests(&self, i: usize) -> String {
        let dir = self.dir(i).to_str().expect("utf-8 data dir").to_owned();
        let (status, out, err) =
            tokio::task::block_in_place(|| run_tool(&["inspect", "--digest", &dir]));
        if !status.success() {
            self.fail(&format!(
                "inspect --digest on member {}: {out}\n{err}",
                i + 1
            ));
        }
        out
    }

    /// Starts member `i` on its directory (it must not be running); panics when it does
    /// not start listening (use [`Cluster::try_restart`] to observe a refusal).
    pub fn restart(&self, i: usize) {
        if let Err(why) = self.try_restart(i) {
            panic!("member {} did not start: {why}", i + 1);
        }
    }

    /// Starts member `i` on its directory; `Err` with what it printed when it exits before
    /// listening.
    ///
    /// # Errors
    /// The start failure's panic message (it holds the member's stderr).
    pub fn try_restart(&self, i: usize) -> Result<(), String> {
        let args = self.args(i);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let start = || {
            Server::start_with(Start {
                data_dir: Some(self.dirs[i].path()),
                listen: Some(&self.addrs[i]),
                args: &args,
                ..Start::default()
            })
        };
        let started = tokio::task::block_in_place(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(start))
        });
        match started {
            Ok(server) => {
                let mut nodes = self.nodes.lock().expect("nodes lock");
                assert!(nodes[i].is_none(), "member {} is already running", i + 1);
                nodes[i] = Some(server);
                Ok(())
            }
            Err(panic) => Err(panic
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "(no message)".to_owned())),
        }
    }

    /// True when member `i` is running (possibly paused).
    pub fn is_up(&self, i: usize) -> bool {
        self.nodes.lock().expect("nodes lock")[i].is_some()
    }

    /// SIGKILLs member `i` (paused or not) and reaps it.
    pub fn kill(&self, i: usize) {
        let server = self.nodes.lock().expect("nodes lock")[i].take();
        if let Some(mut s) = server {
            tokio::task::block_in_place(|| s.kill());
        }
    }

    /// SIGTERMs member `i` and waits for a clean exit.
    pub fn stop(&self, i: usize) {
        let server = self.nodes.lock().expect("nodes lock")[i].take();
        if let Some(mut s) = server {
            tokio::task::block_in_place(|| s.terminate());
        }
    }

    fn pid(&self, i: usize) -> u32 {
        self.nodes.lock().expect("nodes lock")[i]
            .as_ref()
            .expect("member is running")
            .pid()
    }

    /// SIGSTOPs member `i` (returns once every thread is stopped).
    pub fn pause(&self, i: usize) {
        fault::pause(self.pid(i)).expect("SIGSTOP");
    }

    /// SIGCONTs member `i`.
    pub fn resume(&self, i: usize) {
        fault::resume(self.pid(i)).expect("SIGCONT");
    }

    /// Everything member `i` logged so far (empty when it is down).
    pub fn logs(&self, i: usize) -> String {
        self.nodes.lock().expect("nodes lock")[i]
            .as_ref()
            .map(Server::logs)
            .unwrap_or_default()
    }

    /// Member `i`'s data directory.
    pub fn dir(&self, i: usize) -> &Path {
        self.dirs[i].path()
    }

    /// Deletes everything in member `i`'s data directory (it must be down).
    pub fn wipe(&self, i: usize) {
        assert!(!self.is_up(i), "wipe a running member");
        for entry in std::fs::read_dir(self.dir(i))
            .expect("read data dir")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path).expect("remove dir");
            } else {
                std::fs::remove_file(&path).expect("remove file");
            }
        }
    }

    /// Member `i`'s segment files in log order.
    pub fn segments(&self, i: usize) -> Vec<PathBuf> {
        let mut segs: Vec<PathBuf> = walk(self.dir(i))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "seg"))
            .collect();
        segs.sort();
        segs
    }

    /// Sets the mode of link i→j.
    pub fn link(&self, i: usize, j: usize, mode: Mode) {
        self.proxies[i][j]
            .as_ref()
            .expect("no link from a member to itself")
            .set_mode(mode);
    }

    /// Every link back to [`Mode::Pass`].
    pub fn heal(&self) {
        for row in &self.proxies {
            for p in row.iter().flatten() {
                p.set_mode(Mode::Pass);
            }
        }
    }

    /// Cuts member `i` off: `out` stops its bytes to the others, `inbound` the others' bytes
    /// to it (both: a full partition). Each link carries both directions of the calls its
    /// initiator makes, so a one-way cut is a half-blackhole on both links of each pair.
    pub fn isolate(&self, i: usize, out: bool, inbound: bool) {
        for j in (0..MEMBERS).filter(|j| *j != i) {
            let (from_i, to_i) = match (out, inbound) {
                (true, true) => (Mode::Blackhole, Mode::Blackhole),
                (true, false) => (Mode::BlackholeUpstream, Mode::BlackholeDownstream),
                (false, true) => (Mode::BlackholeDownstream, Mode::BlackholeUpstream),
                (false, false) => (Mode::Pass, Mode::Pass),
            };
            self.link(i, j, from_i);
            self.link(j, i, to_i);
        }
    }

    /// A client of member `i` (the connection is made lazily and remade after restarts).
    pub fn client(&self, i: usize) -> Client {
        CursorLogClient::new(self.channels[i].clone())
    }

    /// A `cursorlog.v1.Tasks` client of member `i` (on the same lazy connection).
    pub fn tasks(&self, i: usize) -> crate::pb::tasks_client::TasksClient<Channel> {
        crate::pb::tasks_client::TasksClient::new(self.channels[i].clone())
    }

    /// The member clients try first.
    pub fn hint(&self) -> usize {
        self.hint.load(Ordering::Relaxed)
    }

    /// Runs `rpc` on the leader: follows `cursorlog-leader` hints, tries the other members
    /// when none is named, and resends the same request after any UNAVAILABLE or timeout
    /// until `WAIT` passes. Any answer but UNAVAILABLE ends the call.
    ///
    /// Returns the answer, which member gave it, and whether an earlier attempt may have
    /// taken effect.
    ///
    /// # Errors
    /// A status other than UNAVAILABLE.
    ///
    /// # Panics
    /// When no member answers within [`WAIT`].
    pub async fn call<T, F, Fut>(&self, what: &str, mut rpc: F) -> Result<(T, Answered), CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let deadline = Instant::now() + WAIT;
        let mut target = self.hint();
        let mut uncertain = false;
        let mut misses = 0_u32;
        loop {
            let answer = tokio::time::timeout(RPC_TIMEOUT, rpc(self.client(target))).await;
            let status = match answer {
                Ok(Ok(response)) => {
                    self.hint.store(target, Ordering::Relaxed);
                    let by = Answered {
                        uncertain,
                        member: target,
                    };
                    return Ok((response.into_inner(), by));
                }
                Ok(Err(status)) if !retried(&status) => {
                    return Err(CallError { status, uncertain })
                }
                Ok(Err(status)) => Some(status),
                Err(_elapsed) => None,
            };
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "{what}: no member answered within {WAIT:?} (last: {status:?})"
                ));
            }
            // Only an explicit `safe` proves nothing was proposed.
            uncertain |= !status.as_ref().is_some_and(retry_is_safe);
            match status.as_ref().and_then(|s| hinted(&self.addrs, s)) {
                Some(leader) if leader != target => target = leader,
                _ => {
                    target = (target + 1) % MEMBERS;
                    misses += 1;
                    let backoff = Duration::from_millis(u64::from(misses.min(6)) * 25);
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }

    /// The member that commits a write now, excluding `not` (an isolated or paused old
    /// leader that may still believe it leads): asks each other member to open the
    /// harness's session (idempotent) until one accepts, following hints.
    ///
    /// # Panics
    /// When none does within [`WAIT`].
    pub async fn leader(&self, not: Option<usize>) -> usize {
        let deadline = Instant::now() + WAIT;
        let mut backoff = 10;
        loop {
            for i in (0..MEMBERS).filter(|i| Some(*i) != not) {
                if !self.is_up(i) {
                    continue;
                }
                let mut c = self.client(i);
                let open = c.open_session(pb::OpenSessionRequest {
                    session: "harness".into(),
                    state: None,
                });
                if let Ok(Ok(_)) = tokio::time::timeout(RPC_TIMEOUT, open).await {
                    self.hint.store(i, Ordering::Relaxed);
                    return i;
                }
            }
            if Instant::now() >= deadline {
                self.fail(&format!("no leader (excluding {not:?}) within {WAIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(backoff)).await;
            backoff = (backoff * 2).min(200);
        }
    }

    /// Member `i`'s highest written log sequence number (Stats is answered locally).
    pub async fn last_lsn(&self, i: usize) -> Option<u64> {
        let mut c = self.client(i);
        let stats = c.stats(pb::StatsRequest {});
        match tokio::time::timeout(RPC_TIMEOUT, stats).await {
            Ok(Ok(s)) => Some(s.into_inner().last_lsn),
            _ => None,
        }
    }

    /// Waits until every running member has written at least what `leader` has now (a
    /// restarted or wiped follower caught up), so the next fault never takes the only
    /// complete copy.
    ///
    /// # Panics
    /// When they do not within [`WAIT`].
    pub async fn wait_caught_up(&self, leader: usize) {
        let deadline = Instant::now() + WAIT;
        let target = loop {
            if let Some(lsn) = self.last_lsn(leader).await {
                break lsn;
            }
            assert!(Instant::now() < deadline, "leader stats unavailable");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for i in (0..MEMBERS).filter(|i| self.is_up(*i)) {
            loop {
                if self.last_lsn(i).await.is_some_and(|l| l >= target) {
                    break;
                }
                if Instant::now() >= deadline {
                    self.fail(&format!(
                        "member {} did not catch up to lsn {target} within {WAIT:?}",
                        i + 1
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Makes member `t` the leader: cuts every other member's outgoing links (their
    /// heartbeats and vote requests), so only `t` can win an election, waits until `t`
    /// commits a write, then heals. When `t` cannot win (its log is behind, which the cut
    /// stops the leader from repairing), heals, lets the leader bring `t` up to date, and
    /// tries again.
    ///
    /// # Panics
    /// When `t` does not lead after five tries.
    pub async fn force_leader(&self, t: usize) {
        for attempt in 1..=5 {
            for i in (0..MEMBERS).filter(|i| *i != t) {
                for j in (0..MEMBERS).filter(|j| *j != i) {
                    self.link(i, j, Mode::Blackhole);
                }
            }
            let deadline = Instant::now() + WAIT / 6;
            let led = loop {
                let mut c = self.client(t);
                let open = c.open_session(pb::OpenSessionRequest {
                    session: "harness".into(),
                    state: None,
                });
                if let Ok(Ok(_)) = tokio::time::timeout(RPC_TIMEOUT, open).await {
                    break true;
                }
                if Instant::now() >= deadline {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            self.heal();
            if led {
                self.hint.store(t, Ordering::Relaxed);
                return;
            }
            eprintln!(
                "member {} did not win (try {attempt}): healing first",
                t + 1
            );
            let leader = self.leader(None).await;
            self.wait_caught_up(leader).await;
        }
        self.fail(&format!("member {} did not lead after five tries", t + 1));
    }

    /// Waits until member `i`'s log holds `needle`.
    ///
    /// # Panics
    /// When it does not within [`WAIT`].
    pub async fn wait_for_log(&self, i: usize, needle: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.logs(i).contains(needle) {
            if Instant::now() >= deadline {
                self.fail(&format!("member {} never logged {needle:?}", i + 1));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `cursorlog cluster force-new` on stopped member `i` (a lost quorum's survivor becomes
    /// a one-member cluster, README "Formation and recovery"); its report.
    ///
    /// # Panics
    /// When the command fails.
    pub fn force_new(&self, i: usize) -> String {
        let dir = self.dir(i).to_str().expect("utf-8 data dir").to_owned();
        let id = (i + 1).to_string();
        let (status, out, err) = tokio::task::block_in_place(|| {
            run_tool(&["cluster", "force-new", "--data-dir", &dir, "--node-id", &id])
        });
        if !status.success() {
            self.fail(&format!(
                "force-new on member {} failed: {out}\n{err}",
                i + 1
            ));
        }
        out
    }

    /// A `cursorlog cluster` command (`add-learner`, `promote`, …) against member `at`.
    ///
    /// # Panics
    /// When the command fails.
    pub fn admin(&self, at: usize, args: &[&str]) {
        let mut argv = vec!["cluster"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["--members", &self.addrs[at]]);
        let (status, out, err) = tokio::task::block_in_place(|| run_tool(&argv));
        if !status.success() {
            self.fail(&format!("cluster {args:?}: {out}\n{err}"));
        }
    }

    /// Adds member `i` (running on an empty directory) back through the leader `at`:
    /// `cluster add-learner`, then `cluster promote`.
    ///
    /// # Panics
    /// When either command fails.
    pub fn add_back(&self, at: usize, i: usize) {
        let id = (i + 1).to_string();
        self.admin(at, &["add-learner", "--id", &id, "--addr", &self.addrs[i]]);
        self.admin(at, &["promote", "--id", &id]);
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

impl Cluster {
    /// Panics with `why`, saying it first and then dumping the members' logs (a CI excerpt
    /// that keeps only the head of the output still shows what failed).
    fn fail(&self, why: &str) -> ! {
        eprintln!("cluster harness: {why}; the members' logs follow");
        self.dump_logs();
        panic!("{why}");
    }

    /// Prints the last lines of every running member's log (a failure's context); the whole
    /// logs go to `$CURSORLOG_CLUSTER_LOGS/member-N.log` when that is set.
    pub fn dump_logs(&self) {
        self.dumped.store(true, Ordering::Relaxed);
        let Ok(mut nodes) = self.nodes.lock() else {
            return;
        };
        for (i, node) in nodes.iter_mut().enumerate() {
            let Some(node) = node else { continue };
            let mut logs = node.logs();
            if let Some(status) = node.exited() {
                logs.push_str(&format!(
                    "(the harness: this member's process has ended: {status})\n"
                ));
            }
            if let Some(dir) = std::env::var_os("CURSORLOG_CLUSTER_LOGS") {
                let path = Path::new(&dir).join(format!("member-{}.log", i + 1));
                let _ = std::fs::write(path, &logs);
            }
            let lines: Vec<&str> = logs.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            eprintln!(
                "---- member {} ({}) log tail ----\n{tail}",
                i + 1,
                self.addrs[i]
            );
        }
    }
}

/// Dumps the members' logs ([`Cluster::dump_logs`]) when dropped during a panic: hold one in
/// a test so every failure shows what the members said.
#[derive(Debug)]
pub struct DumpOnPanic(pub Arc<Cluster>);

impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.0.dumped.load(Ordering::Relaxed) {
            self.0.dump_logs();
        }
    }
}
