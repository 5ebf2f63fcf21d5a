//! `cursorlog`: the cursorlog gRPC server and its offline tools.
//!
//! - `cursorlog serve` (also the default with no subcommand) opens the data directory,
//!   recovers it and serves `cursorlog.v1.CursorLog`, the gRPC health protocol and server
//!   reflection. Every flag has a `CURSORLOG_*` environment variable.
//! - `cursorlog verify <dir>` checks every segment offline and exits non-zero on corruption.
//! - `cursorlog inspect <dir>` prints the sessions, streams and segments of a data directory.
//!
//! Logs go to stderr through `tracing` (filter with `RUST_LOG`, default `info`). Once the
//! server listens it prints exactly one line `listening on ADDR` to stdout, with the bound
//! port, so scripts can start it on port 0.

/// mimalloc rather than glibc malloc: with the writer, acker, flusher and runtime threads
/// allocating concurrently, glibc's malloc and free were about a third of the append path's
/// instructions; measured in `benches/README.md`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod admin;
mod append_stream;
mod convert;
mod metrics;
mod serve;
mod service;
mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use cursorlog_engine::SyncPolicy;

/// Durable event log and resumption-cursor oracle for MCP Streamable-HTTP front-ends.
#[derive(Debug, Parser)]
#[command(
    name = "cursorlog",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Options of `serve`, which runs when no subcommand is given.
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the gRPC API (the default).
    Serve(Box<ServeArgs>),
    /// Check every segment of a data directory offline; exits 1 on corruption.
    Verify {
        /// The data directory (not in use by a running server).
        dir: PathBuf,
        /// Truncate a torn tail of the last segment (what the next open would do anyway).
        /// Refuses damage whose repair would drop acknowledged records.
        #[arg(long)]
        repair: bool,
        /// With --repair: cut the log at the first damaged frame even when valid, possibly
        /// acknowledged records follow it; later segments are deleted and the index rebuilt.
        #[arg(long, requires = "repair")]
        accept_loss: bool,
    },
    /// Print the sessions, streams and segments of a data directory. Opens the directory like
    /// the server does (recovery may truncate a torn tail), so it must not be in use.
    Inspect {
        /// The data directory (not in use by a running server).
        dir: PathBuf,
    },
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
    /// Serve Prometheus text metrics over plain HTTP on this address.
    #[arg(long, env = "CURSORLOG_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Require `authorization: Bearer <token>` on every cursorlog RPC (health and reflection
    /// stay open).
    #[arg(long, env = "CURSORLOG_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// Allow listening on a non-loopback address without an auth token.
    #[arg(long, env = "CURSORLOG_ALLOW_INSECURE_NON_LOOPBACK")]
    pub allow_insecure_non_loopback: bool,
    /// PEM certificate chain for TLS (needs --tls-key).
    #[arg(long, env = "CURSORLOG_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS (needs --tls-cert).
    #[arg(long, env = "CURSORLOG_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Largest gRPC message accepted or sent, in bytes; must exceed the payload limit.
    #[arg(long, env = "CURSORLOG_GRPC_MESSAGE_BYTES_MAX", default_value_t = 16 * 1024 * 1024)]
    pub grpc_message_bytes_max: usize,
    /// On SIGINT/SIGTERM, wait at most this many seconds for in-flight calls to finish.
    #[arg(long, env = "CURSORLOG_SHUTDOWN_GRACE_SECS", default_value_t = 30)]
    pub shutdown_grace_secs: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        None => serve::run(cli.serve),
        Some(Command::Serve(args)) => serve::run(*args),
        Some(Command::Verify {
            dir, repair: false, ..
        }) => admin::verify(&dir),
        Some(Command::Verify {
            dir,
            repair: true,
            accept_loss,
        }) => admin::repair(&dir, accept_loss),
        Some(Command::Inspect { dir }) => admin::inspect(&dir),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_subcommand_means_serve_with_defaults() {
        let cli = Cli::try_parse_from(["cursorlog"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.listen, "127.0.0.1:50051".parse().unwrap());
        assert_eq!(cli.serve.data_dir, PathBuf::from("./cursorlog-data"));
        assert_eq!(cli.serve.sync, SyncPolicy::Always);
    }

    #[test]
    fn serve_flags_parse() {
        let cli = Cli::try_parse_from([
            "cursorlog",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--sync",
            "interval:5",
            "--retention-max-events-per-stream",
            "100",
        ])
        .unwrap();
        let Some(Command::Serve(args)) = cli.command else {
            panic!("expected serve")
        };
        assert_eq!(args.sync, SyncPolicy::Interval(5));
        assert_eq!(args.retention_max_events_per_stream, Some(100));
        assert!(Cli::try_parse_from(["cursorlog", "--sync", "sometimes"]).is_err());
        assert!(Cli::try_parse_from(["cursorlog", "--tls-cert", "c.pem"]).is_err());
    }
}
