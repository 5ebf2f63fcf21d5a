//! The options of `cursorlog serve`. Every option has a `CURSORLOG_*` environment variable,
//! except the hidden, test-only fault injection flag.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use cursorlog_engine::SyncPolicy;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colours only when stderr is a terminal).
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Options of `cursorlog serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Data directory (created if missing).
    #[arg(long, env = "CURSORLOG_DATA_DIR", default_value = "./cursorlog-data")]
    pub data_dir: PathBuf,
    /// gRPC listen address; port 0 picks a free port (printed on stdout).
    #[arg(long, env = "CURSORLOG_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Durability of acknowledged appends: `always` (fdatasync before every ack),
    /// `interval:<ms>` (bounded loss window on power failure) or `never`.
    #[arg(long, env = "CURSORLOG_SYNC", default_value = "always")]
    pub sync: SyncPolicy,
    /// Seal a segment and start a new one at this many bytes [default: 64 MiB].
    #[arg(long, env = "CURSORLOG_SEGMENT_BYTES")]
    pub segment_bytes: Option<u64>,
    /// Largest accepted event payload in bytes [default: 1 MiB].
    #[arg(long, env = "CURSORLOG_PAYLOAD_BYTES_MAX")]
    pub payload_bytes_max: Option<u32>,
    /// Most events accepted in one append [default: 1024].
    #[arg(long, env = "CURSORLOG_BATCH_EVENTS_MAX")]
    pub batch_events_max: Option<u32>,
    /// Evict events older than this many seconds (whole segments at a time).
    #[arg(long, env = "CURSORLOG_RETENTION_MAX_AGE_SECS")]
    pub retention_max_age_secs: Option<u64>,
    /// Keep the log below this many bytes by evicting the oldest segments.
    #[arg(long, env = "CURSORLOG_RETENTION_MAX_BYTES")]
    pub retention_max_bytes: Option<u64>,
    /// Keep at most this many of each stream's newest events.
    #[arg(long, env = "CURSORLOG_RETENTION_MAX_EVENTS_PER_STREAM")]
    pub retention_max_events_per_stream: Option<u64>,
    /// Remember terminated streams and expired sessions this many seconds after they ended,
    /// so late cursors get STREAM_TERMINATED / CURSOR_EVICTED [default: 86400].
    #[arg(long, env = "CURSORLOG_METADATA_HORIZON_SECS")]
    pub metadata_horizon_secs: Option<u64>,
    /// Run the background retention pass this often, in milliseconds [default: 10000].
    #[arg(long, env = "CURSORLOG_RETENTION_CHECK_INTERVAL_MS")]
    pub retention_check_interval_ms: Option<u64>,
    /// Refuse appends (RESOURCE_EXHAUSTED) while the data directory's file system has less
    /// than this many bytes free; reads, verdicts and retention go on. 0 disables the check
    /// [default: 256 MiB].
    #[arg(long, env = "CURSORLOG_DISK_RESERVE_BYTES")]
    pub disk_reserve_bytes: Option<u64>,
    /// Memory for the index's page cache, in bytes [default: 64 MiB].
    #[arg(long, env = "CURSORLOG_INDEX_CACHE_BYTES")]
    pub index_cache_bytes: Option<u64>,
    /// Bytes of requests the writer queues before callers wait (back-pressure)
    /// [default: 64 MiB].
    #[arg(long, env = "CURSORLOG_WRITER_QUEUE_BYTES_MAX")]
    pub writer_queue_bytes_max: Option<u64>,
    /// Most open streams per session; one more OpenStream is RESOURCE_EXHAUSTED
    /// [default: 1024].
    #[arg(long, env = "CURSORLOG_OPEN_STREAMS_PER_SESSION_MAX")]
    pub open_streams_per_session_max: Option<u32>,
    /// Most live (not expired) sessions; one more OpenSession is RESOURCE_EXHAUSTED until
    /// some expire. A live idle session costs ~1.9 KiB of memory [default: 1000000, ~1.8 GiB].
    #[arg(
        long,
        env = "CURSORLOG_MAX_LIVE_SESSIONS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_live_sessions: Option<u64>,
    /// Most open streams holding a producer lease; one more OpenStream with a lease is
    /// RESOURCE_EXHAUSTED until some end. Lease-less streams do not count [default: 100000].
    #[arg(
        long,
        env = "CURSORLOG_MAX_LEASED_STREAMS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_leased_streams: Option<u64>,
    /// Most tasks one owner may have that are not deleted; one more CreateTask is
    /// RESOURCE_EXHAUSTED until some are deleted or expire [default: 10000].
    #[arg(
        long,
        env = "CURSORLOG_MAX_TASKS_PER_OWNER",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_tasks_per_owner: Option<u64>,
    /// Most tasks of all owners together that are not deleted [default: 1000000].
    #[arg(
        long,
        env = "CURSORLOG_MAX_TASKS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_tasks: Option<u64>,
    /// The TTL of a task created without one, in seconds [default: 3600].
    #[arg(
        long,
        env = "CURSORLOG_TASK_TTL_DEFAULT_SECS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub task_ttl_default_secs: Option<u64>,
    /// The longest TTL a task is granted, in seconds: a longer or unlimited one is clamped to
    /// it [default: 86400].
    #[arg(
        long,
        env = "CURSORLOG_TASK_TTL_MAX_SECS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub task_ttl_max_secs: Option<u64>,
    /// Expire a session that no call has named for this many seconds (its open streams are
    /// aborted); 0 never expires idle sessions.
    #[arg(long, env = "CURSORLOG_SESSION_IDLE_TTL_SECS", default_value_t = 3600)]
    pub session_idle_ttl_secs: u64,
    /// Most Read calls (replaying or following) and WatchTask calls running at once; one
    /// more is refused with RESOURCE_EXHAUSTED at once.
    #[arg(
        long,
        env = "CURSORLOG_READ_CALLS_MAX",
        default_value_t = 16384,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub read_calls_max: u32,
    /// Most threads for engine calls that block (resolves, session and outcome lookups,
    /// catch-up reads, stats); further calls queue for a free thread. Writes wait for their
    /// group commit without one. Bounds memory: each thread costs a stack and an allocator
    /// heap (~3 MiB each, measured), and the pool never shrinks under steady traffic (its
    /// idle threads take turns, so none idles long enough to retire), so its size is what it
    /// will reach. These calls are short positional reads of segments and the index: a few
    /// threads per core keep the cores busy.
    #[arg(
        long,
        env = "CURSORLOG_BLOCKING_THREADS",
        default_value_t = 8,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub blocking_threads: u16,
    /// Serve Prometheus text metrics over plain HTTP on this address; a bare port means
    /// 127.0.0.1:PORT. A non-loopback address needs auth (see --allow-insecure-plaintext-token)
    /// or --allow-unauthenticated-metrics.
    #[arg(long, env = "CURSORLOG_METRICS_LISTEN", value_parser = parse_metrics_listen)]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the metrics page without the bearer token, also on a non-loopback address (it
    /// holds counters only: no session ids, no events).
    #[arg(long, env = "CURSORLOG_ALLOW_UNAUTHENTICATED_METRICS")]
    pub allow_unauthenticated_metrics: bool,
    /// Require `authorization: Bearer <token>` on every cursorlog RPC (health and reflection
    /// stay open). Prefer --auth-token-file or CURSORLOG_AUTH_TOKEN: argv is visible in `ps`.
    #[arg(long, env = "CURSORLOG_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// Read the bearer token from this file (surrounding whitespace is ignored).
    #[arg(long, env = "CURSORLOG_AUTH_TOKEN_FILE", conflicts_with = "auth_token")]
    pub auth_token_file: Option<PathBuf>,
    /// Allow a bearer token on a non-loopback listener without TLS (the token crosses the
    /// network in clear). Logged as a warning at every start.
    #[arg(long, env = "CURSORLOG_ALLOW_INSECURE_PLAINTEXT_TOKEN")]
    pub allow_insecure_plaintext_token: bool,
    /// Allow listening on a non-loopback address without an auth token.
    #[arg(long, env = "CURSORLOG_ALLOW_INSECURE_NON_LOOPBACK")]
    pub allow_insecure_non_loopback: bool,
    /// PEM certificate chain for TLS (needs --tls-key).
    #[arg(long, env = "CURSORLOG_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS (needs --tls-cert).
    #[arg(long, env = "CURSORLOG_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Largest gRPC message accepted or sent, in bytes; must exceed the payload limit. A
    /// larger request is refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "CURSORLOG_GRPC_MESSAGE_BYTES_MAX", default_value_t = 16 * 1024 * 1024)]
    pub grpc_message_bytes_max: usize,
    /// On SIGINT/SIGTERM, wait at most this many seconds for in-flight calls to finish.
    #[arg(long, env = "CURSORLOG_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    pub shutdown_grace_secs: u64,
    /// Most client connections served at once; one more is closed as soon as it is accepted
    /// (health has its own room: see --connections-reserved).
    #[arg(
        long,
        env = "CURSORLOG_CONNECTIONS_MAX",
        default_value_t = 4096,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub connections_max: u32,
    /// Connections accepted beyond --connections-max that may only call the gRPC health
    /// service (every other call on them is RESOURCE_EXHAUSTED), so probes get in while the
    /// server is full. The metrics page has its own listener.
    #[arg(long, env = "CURSORLOG_CONNECTIONS_RESERVED", default_value_t = 8)]
    pub connections_reserved: u32,
    /// Close a connection whose HTTP/2 preface (or, with TLS, whose TLS handshake) has not
    /// arrived this many seconds after it was accepted.
    #[arg(
        long,
        env = "CURSORLOG_HANDSHAKE_TIMEOUT_SECS",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub handshake_timeout_secs: u64,
    /// Send an HTTP/2 PING on every connection this often; 0 sends none.
    #[arg(
        long,
        env = "CURSORLOG_HTTP2_KEEPALIVE_INTERVAL_SECS",
        default_value_t = 30
    )]
    pub http2_keepalive_interval_secs: u64,
    /// Close a connection whose peer has not answered a keepalive PING within this many
    /// seconds (a dead peer, or one that stopped reading).
    #[arg(
        long,
        env = "CURSORLOG_HTTP2_KEEPALIVE_TIMEOUT_SECS",
        default_value_t = 20,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub http2_keepalive_timeout_secs: u64,
    /// Bytes of responses one Read call may hold while it replays stored events and its
    /// client is not reading; the call then pauses (reads nothing more from the log) until
    /// the client reads again. Room for many events per read is what makes a replay fast.
    #[arg(
        long,
        env = "CURSORLOG_READ_BUFFER_BYTES",
        default_value_t = crate::read_slots::BUFFER_BYTES_DEFAULT,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub read_buffer_bytes: u32,
    /// The same once the call has caught up and follows live events (at most
    /// `--read-buffer-bytes`): what a follower whose client stopped reading holds.
    #[arg(
        long,
        env = "CURSORLOG_FOLLOW_BUFFER_BYTES",
        default_value_t = crate::read_slots::FOLLOW_BUFFER_BYTES_DEFAULT,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub follow_buffer_bytes: u32,
    /// Bytes of responses all Read calls together may hold; when they are spent, Read calls
    /// pause until clients read.
    #[arg(
        long,
        env = "CURSORLOG_READ_BUFFER_BYTES_TOTAL",
        default_value_t = 256 * 1024 * 1024,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub read_buffer_bytes_total: u64,
    /// Stay up, read-only, when the storage engine is poisoned (a failed write or fsync), for
    /// an operator to look at. By default a poisoned server drains and exits with status 1
    /// by itself, so a plain `Restart=on-failure` supervisor recovers it.
    #[arg(long, env = "CURSORLOG_STAY_UP_WHEN_POISONED")]
    pub stay_up_when_poisoned: bool,
    /// Log line format on stderr.
    #[arg(long, env = "CURSORLOG_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// TEST ONLY: the N-th fdatasync of a segment file fails with EIO, which poisons the
    /// engine. For testing supervisors and alerting; never set it in production. Hidden from
    /// --help and deliberately without an environment variable.
    #[arg(long, hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub fault_fail_fsync_after: Option<u64>,
    /// TEST ONLY: every write stays in this process's memory until its file's fdatasync, so
    /// a SIGKILL loses what a power cut may lose; N numbers the simulated boot (pass a new N
    /// after each simulated power cut). For crash tests of whole clusters; never set it in
    /// production. Hidden from --help and deliberately without an environment variable.
    #[arg(long, hide = true, conflicts_with = "fault_fail_fsync_after")]
    pub fault_power_cut_boot: Option<u64>,
    /// Replication: this node's id in a cluster (with `--peers`). Without it, cursorlog runs
    /// as one node, exactly as before.
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
    /// Whether `--auth-token` was given on the command line (visible in `ps`), as opposed to
    /// `CURSORLOG_AUTH_TOKEN`. Set by `main` from clap's value source.
    #[arg(skip)]
    pub auth_token_on_argv: bool,
}

/// `--metrics-listen`: `PORT` (loopback) or `IP:PORT`.
fn parse_metrics_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse::<SocketAddr>().map_err(|_| {
        format!(
            "{text:?} is neither a port (bound on 127.0.0.1) nor an address like 127.0.0.1:9464"
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_bare_metrics_port_is_loopback() {
        assert_eq!(
            parse_metrics_listen("9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(
            parse_metrics_listen("0.0.0.0:9464").unwrap(),
            "0.0.0.0:9464".parse().unwrap()
        );
        assert_eq!(
            parse_metrics_listen("[::1]:1").unwrap(),
            "[::1]:1".parse().unwrap()
        );
        let err = parse_metrics_listen("metrics.example:9464").unwrap_err();
        assert!(err.contains("metrics.example"), "{err}");
        assert!(parse_metrics_listen("70000").is_err());
    }
}
