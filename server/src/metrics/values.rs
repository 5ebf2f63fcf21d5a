//! Values kept outside [`super::Metrics`] and read at each scrape: the engine's [`Stats`],
//! the Read slots and buffers, the connection counters. Each is a table of rows (exposed
//! name, type, help, how to read the value), encoded by prometheus-client's descriptor
//! encoder.

use std::fmt;
use std::sync::Arc;

use cursorlog_engine::Stats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use cursorlog_replication::{NodeStatus, ReplicatedNode};

use crate::connections::Connections;
use crate::read_slots::ReadSlots;

/// A metric's type on the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Counter,
    Gauge,
}

/// One metric of a table: `value` reads it from a `T` (`None`: not on this page).
#[derive(Debug)]
pub(super) struct Row<T> {
    /// The exposed name; a counter's ends in `_total`.
    name: &'static str,
    kind: Kind,
    help: &'static str,
    value: fn(&T) -> Option<u64>,
}

const fn counter<T>(
    name: &'static str,
    help: &'static str,
    value: fn(&T) -> Option<u64>,
) -> Row<T> {
    Row {
        name,
        kind: Kind::Counter,
        help,
        value,
    }
}

const fn gauge<T>(name: &'static str, help: &'static str, value: fn(&T) -> Option<u64>) -> Row<T> {
    Row {
        name,
        kind: Kind::Gauge,
        help,
        value,
    }
}

/// Encodes the rows of `table` with a value in `from`.
fn encode_rows<T>(
    encoder: &mut DescriptorEncoder<'_>,
    table: &[Row<T>],
    from: &T,
) -> Result<(), fmt::Error> {
    for row in table {
        let Some(value) = (row.value)(from) else {
            continue;
        };
        match row.kind {
            Kind::Counter => {
                let metric = ConstCounter::new(value);
                // prometheus-client appends `_total` to a counter's name.
                let family = row.name.strip_suffix("_total").ok_or(fmt::Error)?;
                metric.encode(encoder.encode_descriptor(
                    family,
                    row.help,
                    None,
                    metric.metric_type(),
                )?)?;
            }
            Kind::Gauge => {
                let metric = ConstGauge::new(value);
                metric.encode(encoder.encode_descriptor(
                    row.name,
                    row.help,
                    None,
                    metric.metric_type(),
                )?)?;
            }
        }
    }
    Ok(())
}

/// Every name the tables put on the page (the registry refuses them).
pub(super) fn names() -> impl Iterator<Item = &'static str> {
    SNAPSHOT
        .iter()
        .map(|r| r.name)
        .chain(CONNECTIONS.iter().map(|r| r.name))
        .chain(RAFT.iter().map(|r| r.name))
        .chain(std::iter::once(RAFT_LAG))
}

/// What one scrape reads from the engine and the Read slots.
#[derive(Debug)]
pub(super) struct Snapshot {
    stats: Stats,
    active_reads: u64,
    read_calls_max: u64,
    read_calls_refused: u64,
    reads_paused: u64,
    read_buffer_bytes: u64,
    read_buffer_bytes_max: u64,
}

impl Snapshot {
    /// `stats` with the Read slots' and buffers' counts now.
    pub(super) fn new(stats: Stats, reads: &ReadSlots) -> Self {
        let buffers = reads.buffers();
        Self {
            stats,
            active_reads: reads.active(),
            read_calls_max: reads.max(),
            read_calls_refused: reads.refused(),
            reads_paused: buffers.paused(),
            read_buffer_bytes: buffers.held(),
            read_buffer_bytes_max: buffers.budget(),
        }
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        encode_rows(&mut encoder, SNAPSHOT, self)
    }
}

/// The engine's statistics and the Read slots and buffers, in the page's order.
const SNAPSHOT: &[Row<Snapshot>] = &[
    counter(
        "cursorlog_events_appended_total",
        "Events appended since start.",
        |s| Some(s.stats.events_appended),
    ),
    counter(
        "cursorlog_payload_bytes_appended_total",
        "Event payload bytes appended since start.",
        |s| Some(s.stats.payload_bytes_appended),
    ),
    counter(
        "cursorlog_fsyncs_total",
        "fdatasync calls on the write path since start.",
        |s| Some(s.stats.fsyncs),
    ),
    counter(
        "cursorlog_commit_batches_total",
        "Group commits since start; records_written_total / commit_batches_total is the mean batch size.",
        |s| Some(s.stats.commit_batches),
    ),
    counter(
        "cursorlog_records_written_total",
        "Log records written since start.",
        |s| Some(s.stats.records_written),
    ),
    gauge("cursorlog_segments", "Segment files in the log.", |s| {
        Some(s.stats.segments)
    }),
    gauge("cursorlog_log_bytes", "Bytes in all segment files.", |s| {
        Some(s.stats.log_bytes)
    }),
    counter(
        "cursorlog_segments_deleted_total",
        "Segments deleted by retention since start.",
        |s| Some(s.stats.segments_deleted),
    ),
    gauge("cursorlog_sessions", "Sessions remembered.", |s| {
        Some(s.stats.sessions)
    }),
    gauge("cursorlog_streams", "Streams remembered.", |s| {
        Some(s.stats.streams)
    }),
    gauge(
        "cursorlog_last_lsn",
        "Highest log sequence number written.",
        |s| Some(s.stats.last_lsn),
    ),
    gauge(
        "cursorlog_recovery_microseconds",
        "How long recovery took when the data directory was opened.",
        |s| Some(s.stats.recovery_micros),
    ),
    gauge(
        "cursorlog_recovery_lost_records",
        "Records the index had applied that the log no longer held when the data directory \
         was opened: under sync=always, acknowledged data the disk lost (an error is logged).",
        |s| Some(s.stats.recovery_lost_records),
    ),
    gauge(
        "cursorlog_recovery_streams_fenced",
        "Streams ended when the data directory was opened because acknowledged events of \
         theirs may be lost.",
        |s| Some(s.stats.recovery_streams_fenced),
    ),
    gauge(
        "cursorlog_recovery_sessions_fenced",
        "Sessions moved to a new epoch when the data directory was opened because a stream \
         or epoch of theirs was lost.",
        |s| Some(s.stats.recovery_sessions_fenced),
    ),
    counter(
        "cursorlog_index_flush_failures_total",
        "Index flushes that failed (nothing lost: the log holds everything; writes are \
         refused as on a full disk until a flush succeeds).",
        |s| Some(s.stats.index_flush_failures),
    ),
    gauge(
        "cursorlog_active_reads",
        "Read calls running now (replaying or following), of cursorlog_read_calls_max.",
        |s| Some(s.active_reads),
    ),
    gauge(
        "cursorlog_read_calls_max",
        "Most Read calls admitted at once (--read-calls-max).",
        |s| Some(s.read_calls_max),
    ),
    counter(
        "cursorlog_read_calls_refused_total",
        "Read calls refused with RESOURCE_EXHAUSTED because --read-calls-max were running.",
        |s| Some(s.read_calls_refused),
    ),
    gauge(
        "cursorlog_poisoned",
        "1 once a failed write or fsync made the engine refuse every write: restart cursorlog.",
        |s| Some(u64::from(s.stats.poisoned)),
    ),
    gauge(
        "cursorlog_live_sessions",
        "Sessions not expired, of cursorlog_sessions.",
        |s| Some(s.stats.live_sessions),
    ),
    gauge(
        "cursorlog_open_streams",
        "Streams in state OPEN, of cursorlog_streams.",
        |s| Some(s.stats.open_streams),
    ),
    counter(
        "cursorlog_sessions_expired_idle_total",
        "Sessions expired after their idle TTL since start.",
        |s| Some(s.stats.sessions_expired_idle),
    ),
    counter(
        "cursorlog_appends_refused_low_disk_total",
        "Appends refused because free disk space was below the reserve, since start.",
        |s| Some(s.stats.appends_refused_low_disk),
    ),
    gauge(
        "cursorlog_segment_descriptors",
        "Segment files holding an open file descriptor.",
        |s| Some(s.stats.segment_descriptors),
    ),
    gauge(
        "cursorlog_followed_streams",
        "Streams with at least one live follower.",
        |s| Some(s.stats.followed_streams),
    ),
    gauge(
        "cursorlog_writer_queue_bytes",
        "Bytes of requests queued for the writer (and in its current group).",
        |s| Some(s.stats.writer_queue_bytes),
    ),
    gauge(
        "cursorlog_live_sessions_max",
        "The cap on live sessions (--max-live-sessions); at it OpenSession is RESOURCE_EXHAUSTED.",
        |s| Some(s.stats.live_sessions_max),
    ),
    counter(
        "cursorlog_sessions_refused_at_capacity_total",
        "New sessions refused with RESOURCE_EXHAUSTED because --max-live-sessions were live.",
        |s| Some(s.stats.sessions_refused_at_capacity),
    ),
    gauge(
        "cursorlog_leased_streams",
        "Open streams holding a producer lease.",
        |s| Some(s.stats.leased_streams),
    ),
    gauge(
        "cursorlog_leased_streams_max",
        "The cap on leased streams (--max-leased-streams).",
        |s| Some(s.stats.leased_streams_max),
    ),
    counter(
        "cursorlog_leases_refused_at_capacity_total",
        "Leased streams refused with RESOURCE_EXHAUSTED because --max-leased-streams were open.",
        |s| Some(s.stats.leases_refused_at_capacity),
    ),
    gauge(
        "cursorlog_disk_free_bytes",
        "Free bytes on the data directory's file system at the last check.",
        |s| s.stats.disk_free_bytes,
    ),
    gauge(
        "cursorlog_reads_paused",
        "Read calls paused because their client is not reading (or --read-buffer-bytes-total \
         is spent); they read nothing from the log until it reads again.",
        |s| Some(s.reads_paused),
    ),
    gauge(
        "cursorlog_read_buffer_bytes",
        "Bytes of Read responses buffered for clients, of --read-buffer-bytes-total.",
        |s| Some(s.read_buffer_bytes),
    ),
    gauge(
        "cursorlog_read_buffer_bytes_max",
        "The Read buffer budget (--read-buffer-bytes-total).",
        |s| Some(s.read_buffer_bytes_max),
    ),
];

/// The connection bounds' counters, read at each scrape.
#[derive(Debug)]
struct ConnectionValues(Arc<Connections>);

/// The collector of `connections`' metrics, for [`super::Metrics::register_collector`].
pub fn connections(connections: Arc<Connections>) -> impl Collector {
    ConnectionValues(connections)
}

impl Collector for ConnectionValues {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        encode_rows(&mut encoder, CONNECTIONS, &self.0)
    }
}

const CONNECTIONS: &[Row<Arc<Connections>>] = &[
    gauge(
        "cursorlog_connections",
        "Client connections open now (reserved ones included).",
        |c| Some(c.open()),
    ),
    gauge(
        "cursorlog_connections_max",
        "Most client connections served at once (--connections-max).",
        |c| Some(u64::from(c.max())),
    ),
    counter(
        "cursorlog_connections_refused_total",
        "Connections closed at once because every slot, reserved ones too, was taken.",
        |c| Some(c.refused()),
    ),
    counter(
        "cursorlog_connections_handshake_timeouts_total",
        "Connections closed because their HTTP/2 preface did not arrive in time.",
        |c| Some(c.handshake_timeouts()),
    ),
    counter(
        "cursorlog_accept_failures_total",
        "Failed accepts (out of descriptors, ...), each followed by a pause.",
        |c| Some(c.accept_failures()),
    ),
];

/// A replicated member's view of the cluster, taken at each scrape (issue 19 item 5).
struct RaftValues(ReplicatedNode);

/// The collector of a cluster member's `cursorlog_raft_*` metrics.
pub fn raft(node: ReplicatedNode) -> impl Collector {
    RaftValues(node)
}

impl fmt::Debug for RaftValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RaftValues")
    }
}

impl Collector for RaftValues {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let status = self.0.status();
        encode_rows(&mut encoder, RAFT, &status)?;
        let mut family = encoder.encode_descriptor(
            RAFT_LAG,
            "On the leader: entries each other member is behind the leader's last entry.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (node, lag) in &status.lag {
            let labels = [("node", node.to_string())];
            ConstGauge::new(*lag).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The per-member lag family (labelled by `node`).
const RAFT_LAG: &str = "cursorlog_raft_follower_lag_entries";

const RAFT: &[Row<NodeStatus>] = &[
    gauge(
        "cursorlog_raft_node_id",
        "This member's id (--node-id).",
        |s| Some(s.id),
    ),
    gauge(
        "cursorlog_raft_is_leader",
        "1 while this member is the leader, else 0.",
        |s| Some(u64::from(s.role == "leader")),
    ),
    gauge(
        "cursorlog_raft_term",
        "The current Raft term (it grows by one or more with each election).",
        |s| Some(s.term),
    ),
    gauge(
        "cursorlog_raft_leader_id",
        "The leader this member knows of (0: none, an election is under way).",
        |s| Some(s.leader.as_ref().map_or(0, |(id, _)| *id)),
    ),
    gauge(
        "cursorlog_raft_last_log_index",
        "The index of this member's last log entry (Raft's, from 0).",
        |s| s.last_log_index,
    ),
    gauge(
        "cursorlog_raft_committed_index",
        "The last entry this member knows is committed.",
        |s| s.committed,
    ),
    gauge(
        "cursorlog_raft_applied_index",
        "The last entry this member applied to its index (what its reads serve).",
        |s| s.last_applied,
    ),
    gauge(
        "cursorlog_raft_voters",
        "Voters in the membership this member holds.",
        |s| Some(s.voters.len() as u64),
    ),
    counter(
        "cursorlog_raft_snapshot_sent_bytes_total",
        "Snapshot (segment file) bytes this member sent to members catching up.",
        |_| Some(cursorlog_replication::snapshot::bytes_sent()),
    ),
    counter(
        "cursorlog_raft_snapshot_received_bytes_total",
        "Snapshot (segment file) bytes this member received and installed.",
        |_| Some(cursorlog_replication::snapshot::bytes_received()),
    ),
];
