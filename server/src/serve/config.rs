//! The engine configuration `cursorlog serve`'s flags describe, and the check that refuses
//! limits that cannot work together (before anything is opened).

use std::time::Duration;

use cursorlog_engine::Config;

use crate::ServeArgs;

/// Headroom above the payload limit for the rest of an append message, in bytes.
const MESSAGE_OVERHEAD_BYTES: usize = 64 * 1024;

/// The engine configuration the flags describe.
pub(super) fn engine_config(args: &ServeArgs) -> Config {
    let mut config = Config::new(&args.data_dir);
    config.sync = args.sync;
    if let Some(n) = args.segment_bytes {
        config.segment_bytes_max = n;
    }
    if let Some(n) = args.payload_bytes_max {
        config.payload_bytes_max = n;
    }
    if let Some(n) = args.batch_events_max {
        config.batch_events_max = n;
    }
    if let Some(n) = args.disk_reserve_bytes {
        config.disk_reserve_bytes = n;
    }
    if let Some(n) = args.index_cache_bytes {
        config.index_cache_bytes = n;
    }
    if let Some(n) = args.writer_queue_bytes_max {
        config.writer_queue_bytes_max = n;
    }
    if let Some(n) = args.open_streams_per_session_max {
        config.open_streams_per_session_max = n;
    }
    config.live_sessions_max = args.max_live_sessions.unwrap_or(config.live_sessions_max);
    config.leased_streams_max = args.max_leased_streams.unwrap_or(config.leased_streams_max);
    config.session_idle_ttl = match args.session_idle_ttl_secs {
        0 => None,
        secs => Some(Duration::from_secs(secs)),
    };
    let retention = &mut config.retention;
    retention.max_age = args.retention_max_age_secs.map(Duration::from_secs);
    retention.max_total_bytes = args.retention_max_bytes;
    retention.max_events_per_stream = args.retention_max_events_per_stream;
    if let Some(secs) = args.metadata_horizon_secs {
        retention.metadata_horizon = Duration::from_secs(secs);
    }
    if let Some(ms) = args.retention_check_interval_ms {
        retention.check_interval = Duration::from_millis(ms.max(1));
    }
    let tasks = &mut config.tasks;
    tasks.per_owner_max = args.max_tasks_per_owner.unwrap_or(tasks.per_owner_max);
    tasks.tasks_max = args.max_tasks.unwrap_or(tasks.tasks_max);
    if let Some(secs) = args.task_ttl_default_secs {
        tasks.ttl_default = Duration::from_secs(secs);
    }
    if let Some(secs) = args.task_ttl_max_secs {
        tasks.ttl_max = Duration::from_secs(secs);
    }
    if args.task_ttl_default_secs.is_none() {
        // A maximum below the default lowers the default too (both named: check_limits).
        tasks.ttl_default = tasks.ttl_default.min(tasks.ttl_max);
    }
    config
}

/// Refuses limits that cannot work together.
pub(super) fn check_limits(args: &ServeArgs, config: &Config) -> Result<(), String> {
    let payload_bytes = usize::try_from(config.payload_bytes_max).unwrap_or(usize::MAX);
    if args.grpc_message_bytes_max < payload_bytes.saturating_add(MESSAGE_OVERHEAD_BYTES) {
        return Err(format!(
            "--grpc-message-bytes-max {} is too small for --payload-bytes-max {}: it needs at \
             least {} bytes more",
            args.grpc_message_bytes_max, config.payload_bytes_max, MESSAGE_OVERHEAD_BYTES
        ));
    }
    if config.tasks.ttl_default > config.tasks.ttl_max {
        return Err(format!(
            "--task-ttl-default-secs {} is above --task-ttl-max-secs {}",
            config.tasks.ttl_default.as_secs(),
            config.tasks.ttl_max.as_secs()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> ServeArgs {
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let mut argv = vec!["cursorlog"];
        argv.extend_from_slice(extra);
        Wrap::try_parse_from(argv).unwrap().serve
    }

    #[test]
    fn message_limit_must_fit_a_payload() {
        let a = args(&[
            "--payload-bytes-max",
            "1048576",
            "--grpc-message-bytes-max",
            "1048576",
        ]);
        assert!(check_limits(&a, &engine_config(&a)).is_err());
        let a = args(&["--payload-bytes-max", "1048576"]);
        assert!(check_limits(&a, &engine_config(&a)).is_ok());
    }

    #[test]
    fn flags_reach_the_engine_config() {
        let a = args(&[
            "--segment-bytes",
            "4096",
            "--retention-max-age-secs",
            "60",
            "--metadata-horizon-secs",
            "5",
            "--sync",
            "never",
        ]);
        let c = engine_config(&a);
        assert_eq!(c.segment_bytes_max, 4096);
        assert_eq!(c.retention.max_age, Some(Duration::from_secs(60)));
        assert_eq!(c.retention.metadata_horizon, Duration::from_secs(5));
        assert_eq!(c.sync, cursorlog_engine::SyncPolicy::Never);
        assert_eq!(c.session_idle_ttl, Some(Duration::from_secs(3600)));
        let defaults = Config::new("x");
        assert_eq!(c.disk_reserve_bytes, defaults.disk_reserve_bytes);
        assert_eq!(c.index_cache_bytes, defaults.index_cache_bytes);
        let c = engine_config(&args(&[
            "--disk-reserve-bytes",
            "0",
            "--index-cache-bytes",
            "1048576",
            "--writer-queue-bytes-max",
            "2097152",
            "--open-streams-per-session-max",
            "8",
        ]));
        assert_eq!(c.disk_reserve_bytes, 0, "0 disables the reserve");
        assert_eq!(c.index_cache_bytes, 1 << 20);
        assert_eq!(c.writer_queue_bytes_max, 2 << 20);
        assert_eq!(c.open_streams_per_session_max, 8);
        let c = engine_config(&args(&["--session-idle-ttl-secs", "0"]));
        assert_eq!(c.session_idle_ttl, None, "0 never expires idle sessions");
        let c = engine_config(&args(&["--session-idle-ttl-secs", "90"]));
        assert_eq!(c.session_idle_ttl, Some(Duration::from_secs(90)));
    }

    #[test]
    fn task_flags_reach_the_engine_config() {
        let a = args(&[
            "--max-tasks-per-owner",
            "3",
            "--max-tasks",
            "7",
            "--task-ttl-default-secs",
            "60",
            "--task-ttl-max-secs",
            "120",
        ]);
        let c = engine_config(&a);
        assert_eq!(c.tasks.per_owner_max, 3);
        assert_eq!(c.tasks.tasks_max, 7);
        assert_eq!(c.tasks.ttl_default, Duration::from_secs(60));
        assert_eq!(c.tasks.ttl_max, Duration::from_secs(120));
        assert!(check_limits(&a, &c).is_ok());
        assert_eq!(
            engine_config(&args(&[])).tasks,
            cursorlog_engine::TaskLimits::default()
        );
        let a = args(&[
            "--task-ttl-default-secs",
            "200",
            "--task-ttl-max-secs",
            "100",
        ]);
        let err = check_limits(&a, &engine_config(&a)).unwrap_err();
        assert!(err.contains("--task-ttl-max-secs"), "{err}");
        let a = args(&["--task-ttl-max-secs", "100"]);
        assert_eq!(
            engine_config(&a).tasks.ttl_default,
            Duration::from_secs(100)
        );
        assert!(check_limits(&a, &engine_config(&a)).is_ok());
    }
}
