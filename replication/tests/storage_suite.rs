//! openraft's storage conformance suite (`openraft::testing::log::Suite`) on the segment log
//! store: every case of it runs against a fresh data directory.
//!
//! The suite also exercises a state machine; until the engine's state machine (apply after
//! commit) exists, it is paired with the in-memory fixture state machine of
//! `tests/support/`, so the cases that test the state machine test the fixture, and the
//! cases that test the log (append, read, truncate, purge, vote, committed, log state)
//! test [`SegmentLogStore`] on real files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// Only the fixture's state machine is used here.
#[allow(dead_code)]
mod support;

use cursorlog_engine::{EntryLog, EntryLogConfig};
use cursorlog_replication::{SegmentLogStore, TypeConfig};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::StorageError;
use support::MemStateMachine;

struct Builder;

impl StoreBuilder<TypeConfig, SegmentLogStore, MemStateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, SegmentLogStore, MemStateMachine), StorageError<TypeConfig>>
    {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = EntryLogConfig::new(dir.path());
        // Small segments, so the suite's logs span several of them.
        config.segment_bytes_max = 4096;
        let log = EntryLog::open(config).expect("open the entry log");
        Ok((dir, SegmentLogStore::new(log), MemStateMachine::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes_on_the_segment_log() {
    Suite::test_all(Builder)
        .await
        .expect("openraft's storage suite");
}
