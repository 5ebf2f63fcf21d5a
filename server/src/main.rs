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
/// instructions; measured in `benches/HISTORY.md`. The `system-allocator` feature keeps
/// glibc's, for heap profilers that hook malloc (heaptrack, valgrind).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod admin;
mod append_stream;
mod args;
mod auth;
mod cluster;
mod cluster_cli;
mod connections;
mod convert;
mod exposure;
mod fault;
mod frame_limit;
mod logging;
mod metrics;
mod metrics_http;
mod power_cut;
mod read_pipe;
mod read_slots;
mod reader;
mod serve;
mod service;
mod status;
mod task_stream;
mod task_watch;
mod tasks;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub use args::{LogFormat, ServeArgs};

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
    /// Operate a replicated cluster: status, add-learner, promote, remove.
    #[command(subcommand)]
    Cluster(cluster_cli::ClusterCommand),
    /// Print the sessions, streams and segments of a data directory. Opens the directory like
    /// the server does (recovery may truncate a torn tail), so it must not be in use.
    Inspect {
        /// The data directory (not in use by a running server).
        dir: PathBuf,
        /// Print only digests, one per line, for comparing members: a cluster member's log
        /// entries up to its committed entry, and the sessions and streams rebuilt from them.
        #[arg(long)]
        digest: bool,
    },
}

fn main() -> ExitCode {
    let cli = parse_cli();
    let log_format = match &cli.command {
        Some(Command::Serve(args)) => args.log_format,
        Some(_) => LogFormat::Text,
        None => cli.serve.log_format,
    };
    logging::init(log_format);
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
        Some(Command::Inspect { dir, digest }) => admin::inspect(&dir, digest),
        Some(Command::Cluster(command)) => cluster_cli::run(command),
    }
}

/// Parses argv (exiting with clap's message on error).
fn parse_cli() -> Cli {
    parse_cli_from(std::env::args_os()).unwrap_or_else(|err| err.exit())
}

/// Parses `argv` and records whether `--auth-token` came from it (where other users of the
/// machine can read it in `ps`) rather than from `CURSORLOG_AUTH_TOKEN`.
fn parse_cli_from<I, T>(argv: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Cli::command().try_get_matches_from(argv)?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    let (serve_matches, args) = match &mut cli.command {
        Some(Command::Serve(args)) => (matches.subcommand_matches("serve"), &mut **args),
        Some(_) => return Ok(cli),
        None => (Some(&matches), &mut cli.serve),
    };
    args.auth_token_on_argv = serve_matches
        .and_then(|m| m.value_source("auth_token"))
        .is_some_and(|source| source == ValueSource::CommandLine);
    Ok(cli)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use cursorlog_engine::SyncPolicy;

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

    #[test]
    fn a_token_on_argv_is_noticed() {
        let cli = parse_cli_from(["cursorlog", "--auth-token", "t"]).unwrap();
        assert!(cli.serve.auth_token_on_argv);
        let cli = parse_cli_from(["cursorlog", "serve", "--auth-token", "t"]).unwrap();
        let Some(Command::Serve(args)) = cli.command else {
            panic!("expected serve")
        };
        assert!(args.auth_token_on_argv);
        let cli = parse_cli_from(["cursorlog", "serve"]).unwrap();
        let Some(Command::Serve(args)) = cli.command else {
            panic!("expected serve")
        };
        assert!(!args.auth_token_on_argv);
        let dir = "/nonexistent";
        assert!(
            parse_cli_from(["cursorlog", "--auth-token", "t", "--auth-token-file", dir]).is_err()
        );
    }

    #[test]
    fn the_fault_flag_is_hidden_and_new_flags_parse() {
        let help = Cli::command().render_long_help().to_string();
        assert!(
            !help.contains("--fault"),
            "the fault flag must not be in --help"
        );
        assert!(help.contains("--read-calls-max") && help.contains("--session-idle-ttl-secs"));
        let cli = parse_cli_from([
            "cursorlog",
            "--fault-fail-fsync-after",
            "3",
            "--read-calls-max",
            "7",
            "--log-format",
            "json",
            "--blocking-threads",
            "3",
        ])
        .unwrap();
        assert_eq!(cli.serve.fault_fail_fsync_after, Some(3));
        assert_eq!(cli.serve.read_calls_max, 7);
        assert_eq!(cli.serve.log_format, LogFormat::Json);
        assert_eq!(cli.serve.blocking_threads, 3);
        let defaults = parse_cli_from(["cursorlog"]).unwrap();
        assert_eq!(
            defaults.serve.blocking_threads, 8,
            "a pool that never shrinks under steady traffic: keep it small by default"
        );
        assert!(parse_cli_from(["cursorlog", "--blocking-threads", "0"]).is_err());
        assert!(parse_cli_from(["cursorlog", "--read-calls-max", "0"]).is_err());
        assert!(parse_cli_from(["cursorlog", "--fault-fail-fsync-after", "0"]).is_err());
    }
}
