//! The floor: an rmcp `EventStore` that keeps every event in this process's memory and
//! answers at once. It does what any store must do per event (serialise the message, keep it,
//! mint an id) and nothing a durable one adds (no network, no disk, no other process), so its
//! throughput is the most any event store can reach on this machine through rmcp's
//! event-store path, priming events included. Not durable, not shared between replicas.
//!
//! With a [`GroupSync`], each event also waits for a real group commit on a file on the same
//! disk: one thread writes a byte per waiting event and `fdatasync`s, over and over, and
//! answers everyone it synced. That is an ideal durable store: the disk's own latency and
//! nothing else (no server, no network, no encoding beyond the message's JSON), so its
//! throughput is the most any *durable* store can reach here, where every event waits for
//! its sync before rmcp sends it.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use tokio::sync::oneshot;

use rmcp::model::ServerJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};

/// Events per rmcp stream id, in order; an event id is `{stream_id}/{index}`.
#[derive(Default)]
pub struct MemoryEventStore {
    streams: Mutex<HashMap<String, Vec<String>>>,
    sync: Option<GroupSync>,
}

impl MemoryEventStore {
    /// The store with every event waiting for a group commit on `sync`.
    pub fn with_sync(sync: GroupSync) -> Self {
        Self {
            streams: Mutex::default(),
            sync: Some(sync),
        }
    }
}

/// Events waiting for the next sync.
/// Callers waiting for the next `fdatasync`, each told its outcome (an error as its text).
type Waiting = Arc<(Mutex<Vec<oneshot::Sender<Result<(), String>>>>, Condvar)>;

/// A group-commit thread over one file: the waiters queued while it syncs go in the next sync.
#[derive(Clone)]
pub struct GroupSync {
    waiting: Waiting,
}

impl GroupSync {
    /// Starts the thread, syncing `path` (created and filled first, so each sync overwrites
    /// allocated blocks and has no file size or extent to commit: the cheapest real sync).
    /// It runs until the process ends.
    pub fn start(path: &Path) -> std::io::Result<Self> {
        const FILE_BYTES: u64 = 16 << 20;
        let mut file = std::fs::File::create(path)?;
        file.write_all(&vec![0; FILE_BYTES as usize])?;
        file.sync_all()?;
        let waiting: Waiting = Arc::default();
        let queue = waiting.clone();
        std::thread::Builder::new()
            .name("group-sync".into())
            .spawn(move || {
                let mut offset = 0u64;
                loop {
                    let batch = {
                        let (lock, ready) = &*queue;
                        let mut list = lock
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        while list.is_empty() {
                            list = ready
                                .wait(list)
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                        }
                        std::mem::take(&mut *list)
                    };
                    let bytes = vec![b'.'; batch.len()];
                    if offset + bytes.len() as u64 > FILE_BYTES {
                        offset = 0;
                    }
                    // A failed write or sync fails its waiters (never acknowledged as synced)
                    // and the thread goes on, so later calls fail too rather than hang.
                    let outcome = file
                        .write_all_at(&bytes, offset)
                        .and_then(|()| file.sync_data())
                        .map_err(|e| format!("group-sync of the ideal store's file failed: {e}"));
                    offset += bytes.len() as u64;
                    for waiter in batch {
                        let _ = waiter.send(outcome.clone());
                    }
                }
            })?;
        Ok(Self { waiting })
    }

    /// Waits until an `fdatasync` that began after this call has finished; its error if it
    /// failed.
    async fn synced(&self) -> std::io::Result<()> {
        let (tx, rx) = oneshot::channel();
        {
            let (lock, ready) = &*self.waiting;
            lock.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(tx);
            ready.notify_one();
        }
        match rx.await {
            Ok(outcome) => outcome.map_err(std::io::Error::other),
            Err(_) => Err(std::io::Error::other("the group-sync thread is gone")),
        }
    }
}

#[async_trait::async_trait]
impl EventStore for MemoryEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let data = match &event.message {
            Some(m) => serde_json::to_string(m.as_ref())?,
            None => String::new(),
        };
        let id = {
            let mut streams = self
                .streams
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let events = streams.entry(stream_id.to_owned()).or_default();
            events.push(data);
            format!("{stream_id}/{}", events.len() - 1)
        };
        if let Some(sync) = &self.sync {
            sync.synced().await?;
        }
        Ok(id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let (stream_id, index) = last_event_id
            .split_once('/')
            .and_then(|(s, i)| Some((s, i.parse::<usize>().ok()?)))
            .ok_or_else(|| std::io::Error::other("not an event id of this store"))?;
        let streams = self
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut events = Vec::new();
        for (i, data) in streams
            .get(stream_id)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .skip(index.saturating_add(1))
        {
            if data.is_empty() {
                continue;
            }
            let message: ServerJsonRpcMessage = serde_json::from_str(data)?;
            events.push(ServerSseMessage::new(format!("{stream_id}/{i}"), message));
        }
        Ok(Box::pin(futures::stream::iter(events)))
    }
}
