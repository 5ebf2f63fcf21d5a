//! The index's task keys and their typed reads (schema in FORMAT.md, "Index key schema").
//! Owner-scoped keys put the owner's length first, so no owner's keys are a prefix of
//! another's: a lookup by (owner, task id) can only find that owner's task.

use super::keys::{prefix, session_scoped, ORIGIN_TASK};
use super::stored::{decode_value, encode_value};
use super::{KvRead, Txn};
use crate::error::Result;
use crate::record::{
    decode_message, decode_queue_state, decode_slot, decode_task, encode_message,
    encode_queue_state, encode_slot, encode_task, wire_codec, QueueSnapshot, RouteEntry,
};
use crate::task::{InputSlot, QueueState, QueuedMessage, TaskMeta, INBOUND, OUTBOUND};

/// A task with the LSN of the record its state was last carried from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredTask {
    pub meta: TaskMeta,
    pub origin_lsn: u64,
}

impl StoredTask {
    /// Neither ended nor deleted: the clocks and the fencing may still end it.
    pub(crate) fn is_running(&self) -> bool {
        !self.meta.is_deleted() && !self.meta.status.is_terminal()
    }
}

impl super::Index {
    /// Calls `f` with the id and state of every task the index holds (tombstones included),
    /// in id order: one scan of the task keys, for the passes that look at every task.
    ///
    /// # Errors
    /// Index read or decode failures, or `f`'s.
    pub(crate) fn for_each_task(
        &self,
        mut f: impl FnMut(u64, StoredTask) -> Result<()>,
    ) -> Result<()> {
        self.for_each_with_prefix(&[prefix::TASK], |k, v| {
            let Some(id) = <[u8; 8]>::try_from(k.get(1..).unwrap_or_default())
                .ok()
                .map(u64::from_be_bytes)
            else {
                return Ok(());
            };
            f(id, decode_value(k, v)?)
        })
    }
}

wire_codec!(
    StoredTask,
    |s, e| {
        encode_task(&s.meta, e)?;
        bincode::Encode::encode(&s.origin_lsn, e)
    },
    |d| Ok(StoredTask {
        meta: decode_task(d)?,
        origin_lsn: bincode::Decode::decode(d)?,
    })
);

/// An input slot as an index value.
struct StoredSlot(InputSlot);

/// An input slot's index value, borrowed (what [`Txn::put_task_slot`] writes).
pub(crate) struct TaskSlotValue<'a>(pub &'a InputSlot);

impl bincode::Encode for TaskSlotValue<'_> {
    fn encode<E: bincode::enc::Encoder>(
        &self,
        e: &mut E,
    ) -> Result<(), bincode::error::EncodeError> {
        encode_slot(self.0, e)
    }
}

wire_codec!(StoredSlot, |s, e| encode_slot(&s.0, e), |d| Ok(StoredSlot(
    decode_slot(d)?
)));

/// `K` id: the task.
pub(crate) fn task_key(id: u64) -> [u8; 9] {
    let mut k = [prefix::TASK; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `I` owner, task id: the lookup by the caller's id.
pub(crate) fn task_id_key(owner: &str, task_id: &str) -> Vec<u8> {
    let mut k = session_scoped(prefix::TASK_ID, owner);
    k.extend_from_slice(task_id.as_bytes());
    k
}

/// `Y` owner, request key: idempotent creation.
pub(crate) fn task_request_key(owner: &str, request_key: &str) -> Vec<u8> {
    let mut k = session_scoped(prefix::TASK_REQUEST, owner);
    k.extend_from_slice(request_key.as_bytes());
    k
}

/// `P` owner: the owner's tasks in creation order (listing).
pub(crate) fn owner_tasks_prefix(owner: &str) -> Vec<u8> {
    session_scoped(prefix::OWNER_TASK, owner)
}

/// The first key after every `P` key of `owner`.
pub(crate) fn owner_tasks_prefix_end(owner: &str) -> Vec<u8> {
    // The prefix byte is not 0xFF, so there is always a key past the owner's.
    super::prefix_end(&owner_tasks_prefix(owner)).unwrap_or_else(|| vec![prefix::OWNER_TASK + 1])
}

/// `P` owner, id.
pub(crate) fn owner_task_key(owner: &str, id: u64) -> Vec<u8> {
    let mut k = owner_tasks_prefix(owner);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// `C` owner: how many of the owner's tasks are not deleted (the per-owner cap).
pub(crate) fn owner_count_key(owner: &str) -> Vec<u8> {
    session_scoped(prefix::OWNER_COUNT, owner)
}

/// `D` deadline, id: a task's TTL deadline, for the leader's scan.
pub(crate) fn task_deadline_key(deadline_ms: u64, id: u64) -> [u8; 17] {
    let mut k = [prefix::TASK_DEADLINE; 17];
    k[1..9].copy_from_slice(&deadline_ms.to_be_bytes());
    k[9..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `Z` id: a terminal task's outcome bytes.
pub(crate) fn task_outcome_key(id: u64) -> [u8; 9] {
    let mut k = [prefix::TASK_OUTCOME; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `X` id: the task's input slots.
pub(crate) fn task_slots_prefix(id: u64) -> [u8; 9] {
    let mut k = [prefix::TASK_SLOT; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `X` id, key: one input slot.
pub(crate) fn task_slot_key(id: u64, key: &str) -> Vec<u8> {
    let mut k = task_slots_prefix(id).to_vec();
    k.extend_from_slice(key.as_bytes());
    k
}

/// `J` id, channel: a queue's messages.
pub(crate) fn queue_messages_prefix(id: u64, channel: u8) -> [u8; 10] {
    let mut k = [prefix::TASK_MESSAGE; 10];
    k[1..9].copy_from_slice(&id.to_be_bytes());
    k[9] = channel;
    k
}

/// `J` id, channel, qseq: one queued message.
pub(crate) fn queue_message_key(id: u64, channel: u8, qseq: u64) -> [u8; 18] {
    let mut k = [0; 18];
    k[..10].copy_from_slice(&queue_messages_prefix(id, channel));
    k[10..].copy_from_slice(&qseq.to_be_bytes());
    k
}

fn id_channel_key(prefix: u8, id: u64, channel: u8) -> [u8; 10] {
    let mut k = [prefix; 10];
    k[1..9].copy_from_slice(&id.to_be_bytes());
    k[9] = channel;
    k
}

/// `Q` id, channel: where a queue stands.
pub(crate) fn queue_state_key(id: u64, channel: u8) -> [u8; 10] {
    id_channel_key(prefix::TASK_QUEUE, id, channel)
}

/// `B` id, channel: the last dequeued batch (a retry of that dequeue gets it again).
pub(crate) fn queue_batch_key(id: u64, channel: u8) -> [u8; 10] {
    id_channel_key(prefix::TASK_BATCH, id, channel)
}

/// `U` id, channel, dedupe key: the qseq of the queued message enqueued with it.
pub(crate) fn queue_dedupe_key(id: u64, channel: u8, dedupe: &str) -> Vec<u8> {
    let mut k = id_channel_key(prefix::TASK_DEDUPE, id, channel).to_vec();
    k.extend_from_slice(dedupe.as_bytes());
    k
}

/// `W` owner, correlation: the inbound route of the answer to an outbound request
/// (docs/TASKS-DESIGN.md §1.6). Owner-scoped, so another owner's correlation never matches.
pub(crate) fn task_route_key(owner: &str, correlation: &str) -> Vec<u8> {
    let mut k = session_scoped(prefix::TASK_ROUTE, owner);
    k.extend_from_slice(correlation.as_bytes());
    k
}

/// `V` id: the correlations of a task's routes (to carry them forward and drop them); the
/// key itself holds how many there are (the planner's cap reads it, not a scan).
pub(crate) fn task_routes_prefix(id: u64) -> [u8; 9] {
    let mut k = [prefix::TASK_ROUTES; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// `V` id, correlation.
pub(crate) fn task_routes_key(id: u64, correlation: &str) -> Vec<u8> {
    let mut k = task_routes_prefix(id).to_vec();
    k.extend_from_slice(correlation.as_bytes());
    k
}

/// Where an inbound route leads: the task, and the qseq of the inbound message that answered
/// it (`None`: open, waiting for its answer). A closed route stays until the task is deleted,
/// so a retry of the routing call finds its answer (`duplicate`) instead of nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub(crate) struct TaskRoute {
    pub id: u64,
    pub inbound_qseq: Option<u64>,
}

/// A queued message as an index value.
struct StoredMessage(QueuedMessage);

wire_codec!(StoredMessage, |m, e| encode_message(&m.0, e), |d| Ok(
    StoredMessage(decode_message(d)?)
));

/// A queue's state as an index value.
struct StoredQueue(QueueState);

wire_codec!(StoredQueue, |q, e| encode_queue_state(&q.0, e), |d| Ok(
    StoredQueue(decode_queue_state(d)?)
));

/// A batch of messages as an index value: a count, then each.
struct StoredBatch(Vec<QueuedMessage>);

wire_codec!(
    StoredBatch,
    |b, e| {
        bincode::Encode::encode(&(b.0.len() as u64), e)?;
        b.0.iter().try_for_each(|m| encode_message(m, e))
    },
    |d| {
        let n: u64 = bincode::Decode::decode(d)?;
        let mut batch = Vec::new();
        for _ in 0..n {
            batch.push(decode_message(d)?);
        }
        Ok(StoredBatch(batch))
    }
);

/// The origin/ended marker id of a task.
pub(crate) fn task_marker(id: u64) -> (u8, [u8; 8]) {
    (ORIGIN_TASK, id.to_be_bytes())
}

fn id_value(v: Option<Vec<u8>>) -> Option<u64> {
    v.and_then(|v| v.try_into().ok().map(u64::from_le_bytes))
}

/// Typed reads of the task keys, for the index and the writer's overlay alike.
pub(crate) trait TaskRead: KvRead {
    fn stored_task(&self, id: u64) -> Result<Option<StoredTask>> {
        let k = task_key(id);
        self.raw_get(&k)?.map(|v| decode_value(&k, &v)).transpose()
    }

    /// The id of `owner`'s task `task_id` (kept while its tombstone is).
    fn task_by_task_id(&self, owner: &str, task_id: &str) -> Result<Option<u64>> {
        Ok(id_value(self.raw_get(&task_id_key(owner, task_id))?))
    }

    /// `owner`'s task `task_id`, unless it is unknown, another owner's or deleted: every such
    /// case is [`crate::Error::UnknownTask`], so nobody learns that another owner's exists.
    fn owned_task(&self, owner: &str, task_id: &str) -> Result<StoredTask> {
        let unknown = || crate::error::Error::UnknownTask {
            task_id: task_id.to_owned(),
        };
        let id = self.task_by_task_id(owner, task_id)?.ok_or_else(unknown)?;
        self.stored_task(id)?
            .filter(|t| !t.meta.is_deleted())
            .ok_or_else(unknown)
    }

    /// The id of the task `owner` created with `request_key` (until it is deleted).
    fn task_by_request_key(&self, owner: &str, request_key: &str) -> Result<Option<u64>> {
        Ok(id_value(
            self.raw_get(&task_request_key(owner, request_key))?,
        ))
    }

    /// How many of `owner`'s tasks are not deleted.
    fn owner_task_count(&self, owner: &str) -> Result<u64> {
        Ok(id_value(self.raw_get(&owner_count_key(owner))?).unwrap_or(0))
    }

    /// The outcome bytes of a terminal task (empty when it has none).
    fn task_outcome(&self, id: u64) -> Result<Vec<u8>> {
        Ok(self.raw_get(&task_outcome_key(id))?.unwrap_or_default())
    }

    /// One input slot of a task.
    fn task_slot(&self, id: u64, key: &str) -> Result<Option<InputSlot>> {
        let k = task_slot_key(id, key);
        Ok(self
            .raw_get(&k)?
            .map(|v| decode_value::<StoredSlot>(&k, &v))
            .transpose()?
            .map(|s| s.0))
    }

    /// Where one of the task's queues stands (all zero before its first message).
    fn queue_state(&self, id: u64, channel: u8) -> Result<QueueState> {
        let k = queue_state_key(id, channel);
        Ok(self
            .raw_get(&k)?
            .map(|v| decode_value::<StoredQueue>(&k, &v))
            .transpose()?
            .map(|q| q.0)
            .unwrap_or_default())
    }

    /// The messages queued, in FIFO order.
    fn queued_messages(&self, id: u64, channel: u8) -> Result<Vec<QueuedMessage>> {
        self.raw_scan(&queue_messages_prefix(id, channel))?
            .into_iter()
            .map(|(k, v)| decode_value::<StoredMessage>(&k, &v).map(|m| m.0))
            .collect()
    }

    /// One queued message.
    fn queued_message(&self, id: u64, channel: u8, qseq: u64) -> Result<Option<QueuedMessage>> {
        let k = queue_message_key(id, channel, qseq);
        Ok(self
            .raw_get(&k)?
            .map(|v| decode_value::<StoredMessage>(&k, &v))
            .transpose()?
            .map(|m| m.0))
    }

    /// The last dequeued batch.
    fn last_batch(&self, id: u64, channel: u8) -> Result<Vec<QueuedMessage>> {
        let k = queue_batch_key(id, channel);
        Ok(self
            .raw_get(&k)?
            .map(|v| decode_value::<StoredBatch>(&k, &v))
            .transpose()?
            .map(|b| b.0)
            .unwrap_or_default())
    }

    /// The qseq of the queued message enqueued with `dedupe`, if it is still queued.
    fn deduped(&self, id: u64, channel: u8, dedupe: &str) -> Result<Option<u64>> {
        Ok(id_value(
            self.raw_get(&queue_dedupe_key(id, channel, dedupe))?,
        ))
    }

    /// Both queues of a task as a snapshot restates them (a queue never used is left out).
    fn task_queues(&self, id: u64) -> Result<Vec<QueueSnapshot>> {
        let mut queues = Vec::new();
        for channel in [OUTBOUND, INBOUND] {
            let state = self.queue_state(id, channel)?;
            if state != QueueState::default() {
                queues.push(QueueSnapshot {
                    channel,
                    state,
                    messages: self.queued_messages(id, channel)?,
                    last_batch: self.last_batch(id, channel)?,
                });
            }
        }
        Ok(queues)
    }

    /// The route of `owner`'s `correlation`, open or closed.
    fn task_route(&self, owner: &str, correlation: &str) -> Result<Option<TaskRoute>> {
        let k = task_route_key(owner, correlation);
        self.raw_get(&k)?
            .map(|v| decode_value::<TaskRoute>(&k, &v))
            .transpose()
    }

    /// Every route of task `id` (of `owner`), by correlation, as a [`crate::record::TaskRoutes`]
    /// carries them.
    fn task_routes(&self, id: u64, owner: &str) -> Result<Vec<RouteEntry>> {
        let prefix = task_routes_prefix(id);
        let mut routes = Vec::new();
        for (k, _) in self.raw_scan(&prefix)? {
            if k.len() == prefix.len() {
                continue; // the count
            }
            let correlation = String::from_utf8_lossy(&k[prefix.len()..]).into_owned();
            if let Some(r) = self.task_route(owner, &correlation)? {
                routes.push(RouteEntry {
                    correlation,
                    inbound_qseq: r.inbound_qseq,
                });
            }
        }
        Ok(routes)
    }

    /// How many routes task `id` holds (open and closed).
    fn task_route_count(&self, id: u64) -> Result<u64> {
        Ok(id_value(self.raw_get(&task_routes_prefix(id))?).unwrap_or(0))
    }

    /// Every input slot of a task, by key.
    fn task_slots(&self, id: u64) -> Result<Vec<InputSlot>> {
        self.raw_scan(&task_slots_prefix(id))?
            .into_iter()
            .map(|(k, v)| decode_value::<StoredSlot>(&k, &v).map(|s| s.0))
            .collect()
    }
}

impl<T: KvRead + ?Sized> TaskRead for T {}

impl Txn<'_> {
    pub(crate) fn put_task(&mut self, t: &StoredTask) {
        self.put_raw(task_key(t.meta.id).to_vec(), encode_value(t));
    }

    pub(crate) fn put_task_slot(&mut self, id: u64, slot: &InputSlot) {
        self.put_raw(
            task_slot_key(id, &slot.key),
            encode_value(&TaskSlotValue(slot)),
        );
    }

    pub(crate) fn put_queue_state(&mut self, id: u64, channel: u8, q: &QueueState) {
        self.put_raw(
            queue_state_key(id, channel).to_vec(),
            encode_value(&StoredQueue(q.clone())),
        );
    }

    /// Queues `m` (and its dedupe key).
    pub(crate) fn put_queued_message(&mut self, id: u64, channel: u8, m: &QueuedMessage) {
        if let Some(d) = &m.dedupe_key {
            self.put_raw(
                queue_dedupe_key(id, channel, d),
                m.qseq.to_le_bytes().to_vec(),
            );
        }
        self.put_raw(
            queue_message_key(id, channel, m.qseq).to_vec(),
            encode_value(&StoredMessage(m.clone())),
        );
    }

    /// Removes a queued message (and its dedupe key).
    pub(crate) fn remove_queued_message(&mut self, id: u64, channel: u8, m: &QueuedMessage) {
        if let Some(d) = &m.dedupe_key {
            self.remove_raw(queue_dedupe_key(id, channel, d));
        }
        self.remove_raw(queue_message_key(id, channel, m.qseq).to_vec());
    }

    /// Keeps the last dequeued batch (none: no key, as before the first dequeue).
    pub(crate) fn put_last_batch(&mut self, id: u64, channel: u8, batch: Vec<QueuedMessage>) {
        let k = queue_batch_key(id, channel).to_vec();
        if batch.is_empty() {
            self.remove_raw(k);
        } else {
            self.put_raw(k, encode_value(&StoredBatch(batch)));
        }
    }

    /// Removes both queues of a task, whole.
    pub(crate) fn remove_queues(&mut self, id: u64) -> Result<()> {
        for channel in [OUTBOUND, INBOUND] {
            for m in self.queued_messages(id, channel)? {
                self.remove_queued_message(id, channel, &m);
            }
            self.remove_raw(queue_state_key(id, channel).to_vec());
            self.remove_raw(queue_batch_key(id, channel).to_vec());
        }
        Ok(())
    }

    /// Sets the route of `owner`'s `correlation` (counting it when it is new to its task).
    pub(crate) fn put_task_route(
        &mut self,
        owner: &str,
        correlation: &str,
        route: TaskRoute,
    ) -> Result<()> {
        self.put_raw(task_route_key(owner, correlation), encode_value(&route));
        let listed = task_routes_key(route.id, correlation);
        if self.raw_get(&listed)?.is_none() {
            self.put_raw(listed, Vec::new());
            let n = self.task_route_count(route.id)? + 1;
            self.put_raw(
                task_routes_prefix(route.id).to_vec(),
                n.to_le_bytes().to_vec(),
            );
        }
        Ok(())
    }

    /// Removes every route of task `id` (of `owner`).
    pub(crate) fn remove_task_routes(&mut self, id: u64, owner: &str) -> Result<()> {
        let prefix = task_routes_prefix(id);
        for (k, _) in self.raw_scan(&prefix)? {
            let correlation = String::from_utf8_lossy(&k[prefix.len()..]).into_owned();
            if k.len() > prefix.len()
                && self
                    .task_route(owner, &correlation)?
                    .is_some_and(|r| r.id == id)
            {
                self.remove_raw(task_route_key(owner, &correlation));
            }
            self.remove_raw(k);
        }
        Ok(())
    }

    /// Moves `owner`'s count of tasks that are not deleted by `delta`.
    pub(crate) fn count_owner_task(&mut self, owner: &str, delta: i64) -> Result<()> {
        let n = self.owner_task_count(owner)?.saturating_add_signed(delta);
        if n == 0 {
            self.remove_raw(owner_count_key(owner));
        } else {
            self.put_raw(owner_count_key(owner), n.to_le_bytes().to_vec());
        }
        Ok(())
    }
}
