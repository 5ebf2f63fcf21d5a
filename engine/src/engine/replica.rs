//! A replica's engine: the state-machine half of a replicated log (issue 19 item 2, "apply
//! after commit"; design in `docs/REPLICATION.md`).
//!
//! [`Engine::open_replica`] opens an engine over an [`EntryLog`]: it shares the log's
//! segments (so its reads see what openraft writes), keeps its own index (`index/` in the
//! same directory), and changes that index only by [`Engine::apply_committed`]: each
//! committed entry's records are checked with the apply rules (`validate.rs`) against the
//! state the entries before it left, then applied, all or nothing per entry, exactly as a
//! single node's writer applies the group it wrote. An entry a rule refuses changes nothing
//! and is reported (its proposer is told; every replica refuses it alike, since the rules
//! read nothing but the index). Followers (`Read` with follow) wake on apply.
//!
//! What a replica does not do yet: take writes (every write call answers
//! [`Error::NotLeader`]: the leader's planner proposing entries is the next step), run
//! retention, leases or idle expiry (they become the leader's proposals), or remember how
//! far it applied across a restart (its index is rebuilt from the log at open, up to the
//! committed entry: correct, not fast).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Engine, Inner};
use crate::background::{spawn_index_flusher, spawn_maintenance};
use crate::config::Config;
use crate::entry_log::read::PlacedFrame;
use crate::entry_log::{EntryId, EntryLog};
use crate::error::{Error, Result};
use crate::index::{Index, Txn};
use crate::mailbox::{Inbox, Request};
use crate::propose::Proposer;
use crate::record::Record;
use crate::recovery::RecoveryReport;
use crate::shared::Shared;
use crate::writer::{Proposals, Sink, Writer};

/// What [`Engine::apply_committed`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// The last entry applied (or refused), if any entry was.
    pub through: Option<EntryId>,
    /// Entries applied.
    pub entries: u64,
    /// Entries the apply rules refused, with why: they changed nothing.
    pub refused: Vec<(EntryId, String)>,
}

/// The replica side of an engine: the log it applies from and how far it got.
#[derive(Debug)]
pub(crate) struct Replica {
    log: EntryLog,
    /// How far apply got.
    applied: Mutex<Progress>,
}

/// How far a replica's apply got: what openraft's state machine reports as its applied
/// state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The last entry applied or refused.
    pub last: Option<EntryId>,
    /// The last membership entry applied, with its configuration (opaque to the engine).
    pub membership: Option<(EntryId, Vec<u8>)>,
}

impl Engine {
    /// Opens the engine of a replicated node over `log`: rebuilds the index from the log up
    /// to the committed entry, then serves reads; writes answer [`Error::NotLeader`].
    ///
    /// # Errors
    /// Corruption of a stored entry; index and I/O failures; an invalid `config`.
    pub fn open_replica(config: Config, log: &EntryLog) -> Result<Self> {
        Self::open_over(config, log, None)
    }

    /// Opens the engine of a replicated node over `log` whose writes go to `proposer`: the
    /// writer plans each batch as a single node does (same checks, same errors), proposes
    /// one entry per planned group, and answers once the entries applied here (see
    /// [`Proposer`]). Reads and [`Engine::apply_committed`] are as [`Engine::open_replica`]'s.
    ///
    /// # Errors
    /// As [`Engine::open_replica`].
    pub fn open_replicated(
        config: Config,
        log: &EntryLog,
        proposer: Arc<dyn Proposer>,
    ) -> Result<Self> {
        Self::open_over(config, log, Some(proposer))
    }

    fn open_over(
        config: Config,
        log: &EntryLog,
        proposer: Option<Arc<dyn Proposer>>,
    ) -> Result<Self> {
        crate::engine::validate_config(&config)?;
        let dir = log.dir();
        let index = Index::open(
            &dir.join(crate::format::INDEX_DIR),
            config.index_cache_bytes,
        )?;
        // Rebuilt from the log: how far an earlier run applied is not remembered yet.
        index.clear()?;
        let shared = Arc::new(Shared::new(config, index, log.segments()));
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = {
            let shared = Arc::clone(&shared);
            let thread = std::thread::Builder::new().name("cursorlog-writer".into());
            match proposer.clone() {
                Some(proposer) => {
                    let sink = Sink::Proposals(Proposals::new(proposer, log.clone()));
                    let writer = Writer::new(shared, sink);
                    thread.spawn(move || writer.run(&rx))
                }
                None => thread.spawn(move || refuse_writes(&shared, &rx)),
            }
            .map_err(Error::io("starting the writer thread"))?
        };
        let shutdown = Arc::new(AtomicBool::new(false));
        let mut background = vec![spawn_index_flusher(
            Arc::clone(&shared),
            Arc::clone(&shutdown),
        )?];
        if proposer.is_some() {
            background.push(spawn_maintenance(
                Arc::clone(&shared),
                tx.clone(),
                Arc::clone(&shutdown),
                proposer,
            )?);
        }
        // The directory lock is the entry log's; the engine holds the lock file open only
        // to keep `Inner`'s shape (unlocking a file that is not locked is harmless).
        let lock_file = std::fs::OpenOptions::new()
            .read(true)
            .open(dir.join(crate::format::LOCK_FILE))
            .map_err(Error::io("opening the lock file"))?;
        let engine = Self {
            inner: Arc::new(Inner::assemble(
                shared,
                tx,
                writer,
                background,
                shutdown,
                RecoveryReport::default(),
                lock_file,
                Some(Replica {
                    log: log.clone(),
                    applied: Mutex::new(Progress::default()),
                }),
            )),
        };
        if let Some(committed) = log.committed() {
            engine.apply_committed(committed.index)?;
        }
        Ok(engine)
    }

    /// Applies the committed entries after the last one applied, up to entry `through`
    /// (the caller — openraft's state machine — says what is committed), in order.
    ///
    /// # Errors
    /// [`Error::NotLeader`]'s counterpart: this engine is not a replica's
    /// ([`Error::Internal`]); corruption of a stored entry; index failures (the engine is
    /// then poisoned: the index may hold part of an entry).
    pub fn apply_committed(&self, through: u64) -> Result<Applied> {
        let shared = &self.inner.shared;
        let replica = self.inner.replica.as_ref().ok_or_else(|| {
            Error::Internal("apply_committed on an engine that is not a replica's".into())
        })?;
        let mut applied = replica
            .applied
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out = Applied::default();
        let done = applied.last.map_or(0, |id| id.index);
        if through <= done {
            return Ok(out);
        }
        let entries = replica.log.read_placed(done + 1, through + 1)?;
        for (id, frames) in entries {
            if let [only] = frames.as_slice() {
                if only.tag == crate::record::tag::MEMBERSHIP {
                    applied.membership = Some((id, only.body.to_vec()));
                }
            }
            match apply_entry(shared, &frames) {
                Ok(Ok(touched)) => {
                    out.entries += 1;
                    shared.followers.ring(&touched);
                }
                Ok(Err(why)) => {
                    tracing::warn!(entry = id.index, term = id.term, %why, "a committed entry was refused by the apply rules");
                    out.refused.push((id, why));
                }
                Err(e) => {
                    shared.poison(&e);
                    return Err(e);
                }
            }
            if let Some(last) = frames.last() {
                shared.counters.last_lsn.store(last.lsn, Ordering::Release);
            }
            applied.last = Some(id);
            out.through = Some(id);
        }
        Ok(out)
    }
}

impl Engine {
    /// The replicated log this replica applies from (`None` for a single node's engine).
    pub fn entry_log(&self) -> Option<&EntryLog> {
        self.inner.replica.as_ref().map(|r| &r.log)
    }

    /// Installs a received snapshot (issue 19 item 4): the staged segment files become the
    /// log ([`EntryLog::install_snapshot`]), then the index is rebuilt from them, exactly
    /// as an open rebuilds it, through the snapshot's last entry.
    ///
    /// # Errors
    /// Not a replica's engine ([`Error::Internal`]); the install's errors; corruption of a
    /// received entry (the engine is then poisoned).
    pub fn install_snapshot(&self, staging: crate::entry_log::SnapshotStaging) -> Result<Applied> {
        let replica = self.inner.replica.as_ref().ok_or_else(|| {
            Error::Internal("install_snapshot on an engine that is not a replica's".into())
        })?;
        let last = staging.manifest().last;
        {
            let mut applied = replica
                .applied
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            replica.log.install_snapshot(staging)?;
            self.inner.shared.index.clear()?;
            *applied = Progress::default();
        }
        self.apply_committed(last.index)
    }

    /// How far this replica applied (`None` for a single node's engine).
    pub fn applied(&self) -> Option<Progress> {
        let replica = self.inner.replica.as_ref()?;
        Some(
            replica
                .applied
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// Checks and applies one entry's records to the index: all of them, or (a rule refused
/// one) none. Returns the streams it touched, or why it was refused.
fn apply_entry(
    shared: &Shared,
    frames: &[PlacedFrame],
) -> Result<std::result::Result<Vec<u64>, String>> {
    let mut records = Vec::with_capacity(frames.len());
    for f in frames {
        records.push(
            Record::decode(f.tag, &f.body).map_err(|why| {
                Error::Internal(format!("a stored record does not decode: {why}"))
            })?,
        );
    }
    let mut txn = Txn::new(&shared.index);
    let mut touched = Vec::new();
    for (i, (f, record)) in frames.iter().zip(&records).enumerate() {
        if let Err(why) = crate::validate::validate(&txn, f.lsn, record)? {
            // The overlay holds this entry's earlier records: dropping it drops them.
            return Ok(Err(why.to_string()));
        }
        let prev = i.checked_sub(1).and_then(|p| records.get(p));
        crate::apply::apply(
            &mut txn,
            f.lsn,
            f.position,
            record,
            record.continues_run(prev),
        )?;
        touched.extend(record.stream_id());
    }
    let last_lsn = frames.last().map_or(0, |f| f.lsn);
    drop(shared.index.commit(txn, last_lsn));
    touched.sort_unstable();
    touched.dedup();
    Ok(Ok(touched))
}

/// The replica's mailbox: every write is refused (the leader takes writes).
fn refuse_writes(shared: &Shared, rx: &Inbox) {
    while let Ok(Request {
        cmd, reply, bytes, ..
    }) = rx.recv()
    {
        // A sync (a close) has nothing to wait for: the log is written by the entry log.
        reply.send(match cmd {
            crate::mailbox::Command::Sync => Ok(crate::mailbox::Reply::Done),
            _ => Err(Error::NotLeader { leader: None }),
        });
        shared.admission.give_back(bytes);
    }
}
