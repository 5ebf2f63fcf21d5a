//! Log output: `tracing` lines on stderr, filtered by `RUST_LOG` (default `info`), as text
//! or JSON. Text carries ANSI colours only when stderr is a terminal, so a redirected log
//! (a file, journald, a pipe) holds no escape codes.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use crate::LogFormat;

/// Installs the global subscriber. Call once, before anything logs.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(use_colour()).init(),
        // JSON never carries colour codes (they would end up inside string values).
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// Colours on stderr: only for a terminal, and never with `NO_COLOR` set (no-color.org).
fn use_colour() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && std::io::stderr().is_terminal()
}
