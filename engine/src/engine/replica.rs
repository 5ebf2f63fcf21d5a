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
//! The index is rebuilt from the log at open and after a snapshot install, up to the
//! committed entry. Once retention dropped the oldest segments (`member.rs`), the entries
//! up to the point `BASE` accounts for are replayed without the rules, skipping the
//! entries apply refused the first time (`entry_log/retire.rs` says why), and the rest are
//! checked as they were the first time. An engine opened without a proposer takes no
//! writes (every write call answers [`Error::NotLeader`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{Engine, Inner};
use crate::background::{spawn_index_flusher, spawn_maintenance};
use crate::config::Config;
use crate::entry_log::read::PlacedFrame;
use crate::entry_log::{EntryId, EntryLog, LogBase};
use crate::error::{Error, Result};
use crate::index::{Index, Txn};
use crate::mailbox::{Inbox, Request};
use crate::member::{ApplyState, Progress, Replica};
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
        let replica = Arc::new(Replica {
            log: log.clone(),
            proposer: proposer.clone(),
            applied: Mutex::new(ApplyState::default()),
        });
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
                proposer.map(|p| (p, Arc::clone(&replica))),
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
                Some(replica),
            )),
        };
        if let Some(committed) = log.committed() {
            engine.rebuild(committed.index)?;
        }
        Ok(engine)
    }

    /// Rebuilds the (empty) index from the log through entry `through`: without the apply
    /// rules up to the entry `BASE` accounts for, skipping the entries it lists as refused,
    /// then with them; the membership starts as `BASE` records it (see the module's doc).
    ///
    /// # Errors
    /// The log no longer starts at entry 1 and `BASE` does not account for the entries
    /// before it ([`CorruptionKind::LogBaseUnknown`]); as [`Engine::apply_committed`].
    ///
    /// [`CorruptionKind::LogBaseUnknown`]: crate::CorruptionKind::LogBaseUnknown
    fn rebuild(&self, through: u64) -> Result<Applied> {
        let replica = self.replica()?;
        let base = replica.log.base()?;
        if let Some(first) = replica.log.first_entry() {
            if first > 1 && base.through + 1 < first {
                return Err(Error::Corruption {
                    segment: replica.log.dir(),
                    offset: 0,
                    kind: crate::error::CorruptionKind::LogBaseUnknown {
                        first,
                        through: base.through,
                    },
                });
            }
        }
        replica.lock().progress.membership = base.membership.clone();
        let mut out = self.apply_through(base.through.min(through), Some(&base))?;
        let checked = self.apply_through(through, None)?;
        out.entries += checked.entries;
        out.refused.extend(checked.refused);
        out.through = checked.through.or(out.through);
        Ok(out)
    }

    fn replica(&self) -> Result<&Arc<Replica>> {
        self.inner.replica.as_ref().ok_or_else(|| {
            Error::Internal("a replica's call on an engine that is not a replica's".into())
        })
    }

    /// Applies the committed entries after the last one applied, up to entry `through`
    /// (the caller — openraft's state machine — says what is committed), in order.
    ///
    /// # Errors
    /// [`Error::NotLeader`]'s counterpart: this engine is not a replica's
    /// ([`Error::Internal`]); corruption of a stored entry; index failures (the engine is
    /// then poisoned: the index may hold part of an entry).
    pub fn apply_committed(&self, through: u64) -> Result<Applied> {
        self.apply_through(through, None)
    }

    /// Applies the entries after the last one applied through entry `through`: checked
    /// with the apply rules, or (`replay` given) replayed as they were applied before,
    /// skipping the entries it lists as refused.
    fn apply_through(&self, through: u64, replay: Option<&LogBase>) -> Result<Applied> {
        let shared = &self.inner.shared;
        let replica = self.replica()?;
        let mut state = replica.lock();
        let mut out = Applied::default();
        let done = state.progress.last.map_or(0, |id| id.index);
        if through <= done {
            return Ok(out);
        }
        // A log whose oldest segments retired starts later: a rebuild starts there.
        let from = replica
            .log
            .first_entry()
            .map_or(done + 1, |first| first.max(done + 1));
        // Only durable entries are applied: the index must never hold state a power loss
        // could take from the log (a member may learn an entry is committed before its
        // own copy is synced; a leader's committed entries are synced already).
        replica.log.sync_through(through)?;
        let entries = replica.log.read_placed(from, through + 1)?;
        for (id, frames) in entries {
            if let [only] = frames.as_slice() {
                if only.tag == crate::record::tag::MEMBERSHIP {
                    state.progress.membership = Some((id, only.body.to_vec()));
                }
            }
            let outcome = match replay {
                Some(r) if r.refused(id.index) => Ok(Err("refused when first applied".into())),
                Some(_) => apply_entry(shared, &frames, false),
                None => apply_entry(shared, &frames, true),
            };
            match outcome {
                Ok(Ok(touched)) => {
                    out.entries += 1;
                    shared.followers.ring(&touched);
                }
                Ok(Err(why)) => {
                    if replay.is_none() {
                        tracing::warn!(entry = id.index, term = id.term, %why, "a committed entry was refused by the apply rules");
                    }
                    state.refused.push(id);
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
            state.progress.last = Some(id);
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

    /// A snapshot of the log through the last entry applied (issue 19 item 4), with the
    /// refusals among its entries and the progress it stands for, taken at one point (no
    /// entry applies and no segment retires meanwhile). `None` before anything applied.
    ///
    /// # Errors
    /// Not a replica's engine ([`Error::Internal`]); I/O failures opening the files.
    pub fn snapshot(&self) -> Result<Option<(crate::entry_log::LogSnapshot, Progress)>> {
        let replica = self.replica()?;
        let state = replica.lock();
        let Some(last) = state.progress.last else {
            return Ok(None);
        };
        let mut taken = replica.log.snapshot(last)?;
        taken.manifest.refused = Some(
            state
                .refused
                .iter()
                .filter(|id| id.index <= last.index)
                .copied()
                .collect(),
        );
        taken.manifest.membership = state.progress.membership.clone();
        Ok(Some((taken, state.progress.clone())))
    }

    /// Installs a received snapshot (issue 19 item 4): the staged segment files become the
    /// log ([`EntryLog::install_snapshot`]), then the index is rebuilt from them, exactly
    /// as an open rebuilds it, through the snapshot's last entry.
    ///
    /// # Errors
    /// Not a replica's engine ([`Error::Internal`]); the install's errors; corruption of a
    /// received entry (the engine is then poisoned).
    pub fn install_snapshot(&self, staging: crate::entry_log::SnapshotStaging) -> Result<Applied> {
        let replica = self.replica()?;
        let last = staging.manifest().last;
        {
            let mut state = replica.lock();
            replica.log.install_snapshot(staging)?;
            self.inner.shared.index.clear()?;
            *state = ApplyState::default();
        }
        self.rebuild(last.index)
    }

    /// How far this replica applied (`None` for a single node's engine).
    pub fn applied(&self) -> Option<Progress> {
        let replica = self.inner.replica.as_ref()?;
        Some(replica.lock().progress.clone())
    }
}

/// Checks (`check`) and applies one entry's records to the index: all of them, or (a rule
/// refused one) none. Returns the streams it touched, or why it was refused.
fn apply_entry(
    shared: &Shared,
    frames: &[PlacedFrame],
    check: bool,
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
        if check {
            if let Err(why) = crate::validate::validate(&txn, f.lsn, record)? {
                // The overlay holds this entry's earlier records: dropping it drops them.
                return Ok(Err(why.to_string()));
            }
        }
        let prev = i.checked_sub(1).and_then(|p| records.get(p));
        crate::apply::apply(
            &mut txn,
            f.lsn,
            f.position,
            record,
            record.continues_run(prev),
        )?;
        touched.extend(record.bell_id());
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
