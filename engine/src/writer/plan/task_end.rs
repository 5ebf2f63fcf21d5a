//! The ends of a task that no client asked for (docs/TASKS-DESIGN.md §1.7): the TTL pass
//! fails a task past its deadline and deletes an ended task's content a TTL after its end,
//! the lease pass fails a task whose worker stopped renewing, and recovery's fencing fails a
//! task that lost acknowledged changes and pads the log past lost task ids.

use crate::error::Result;
use crate::index::{StoredTask, TaskRead, Txn};
use crate::record::{Record, TaskDeleted, TaskEnded, TaskUpdated};
use crate::task::{EndCause, TaskRemoval, TaskStatus};
use crate::writer::Writer;

impl Writer {
    /// The TTL pass's decision for task `id` at `now`: a task still running past its
    /// deadline fails ("ttl expired"); one that ended a TTL ago loses its content (its
    /// tombstone answers `Expired`). Anything else (renewed, deleted, not due) is left.
    pub(super) fn expire_task(
        &mut self,
        id: u64,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<bool> {
        let Some(t) = txn.stored_task(id)?.filter(|t| !t.meta.is_deleted()) else {
            return Ok(false);
        };
        if t.meta.deadline_ms().is_none_or(|d| d > now) {
            return Ok(false);
        }
        let record = if t.meta.status.is_terminal() {
            Record::TaskDeleted(TaskDeleted {
                id,
                removal: TaskRemoval::Expired,
                at_ms: now,
            })
        } else {
            self.shared.task_leases.remove(id);
            Record::TaskEnded(TaskEnded {
                id,
                version: t.meta.version + 1,
                status: TaskStatus::Failed,
                cause: EndCause::TtlExpired,
                status_message: Some("task expired: its TTL elapsed before it ended".into()),
                outcome: error_outcome("task expired: its TTL elapsed before it ended"),
                at_ms: now,
            })
        };
        self.emit(vec![record], txn, buf)?;
        Ok(true)
    }

    /// The lease pass's decision for task `id`: still running, its worker stopped renewing
    /// its lease (the replica running it died), so it fails rather than stay `working`.
    pub(super) fn fail_leaseless_task(
        &mut self,
        id: u64,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<bool> {
        let Some(t) = txn.stored_task(id)?.filter(StoredTask::is_running) else {
            return Ok(false);
        };
        let Some(ms) = t.meta.worker_lease_ms else {
            return Ok(false);
        };
        let why = format!("task failed: its worker's lease of {ms} ms expired (the worker stopped or lost its connection)");
        self.emit(
            vec![Record::TaskEnded(TaskEnded {
                id,
                version: t.meta.version + 1,
                status: TaskStatus::Failed,
                cause: EndCause::LeaseExpired,
                status_message: Some(why.clone()),
                outcome: error_outcome(&why),
                at_ms: now,
            })],
            txn,
            buf,
        )?;
        Ok(true)
    }
}

impl Writer {
    /// Recovery's decision for task `id`, which lost acknowledged changes (`lost.rs`): still
    /// running, it fails (`Fenced`) at a version past `past_version`, the last one a client
    /// may have seen; blank changes (its own status again) carry the version there first, so
    /// a watcher of a lost version hears the end. False if it is no longer running.
    pub(super) fn fence_task(
        &mut self,
        id: u64,
        past_version: u64,
        why: &str,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<bool> {
        let Some(t) = txn.stored_task(id)?.filter(StoredTask::is_running) else {
            return Ok(false);
        };
        self.shared.task_leases.remove(id);
        let mut records: Vec<Record> = (t.meta.version + 1..=past_version)
            .map(|version| {
                Record::TaskUpdated(TaskUpdated {
                    id,
                    version,
                    status: t.meta.status,
                    status_message: None,
                    ttl_ms: None,
                    poll_interval_ms: None,
                    at_ms: now,
                })
            })
            .collect();
        records.push(Record::TaskEnded(TaskEnded {
            id,
            version: t.meta.version.max(past_version) + 1,
            status: TaskStatus::Failed,
            cause: EndCause::Fenced,
            status_message: Some(why.into()),
            outcome: error_outcome(why),
            at_ms: now,
        }));
        self.emit(records, txn, buf)?;
        Ok(true)
    }

    /// Recovery's padding (`lost.rs`): blank records, at most `max`, towards `through_lsn`.
    /// True once the log's last LSN is at or past it.
    pub(super) fn pad_lsns(
        &mut self,
        through_lsn: u64,
        max: usize,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<bool> {
        let next = self.log.next_lsn();
        let missing = (through_lsn + 1).saturating_sub(next);
        let n = usize::try_from(missing).unwrap_or(usize::MAX).min(max);
        if n > 0 {
            self.emit(vec![Record::Blank; n], txn, buf)?;
        }
        Ok(next + n as u64 > through_lsn)
    }
}

/// A JSON-RPC internal error (-32603) with `message`, as a task's outcome.
fn error_outcome(message: &str) -> crate::task::TaskOutcome {
    let escaped: String = message
        .chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c => vec![c],
        })
        .collect();
    crate::task::TaskOutcome {
        kind: crate::task::OutcomeKind::Error,
        json: format!("{{\"code\":-32603,\"message\":\"{escaped}\"}}").into_bytes(),
    }
}
