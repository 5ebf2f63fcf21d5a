//! The clients: each writes its proposals one at a time to whichever node it believes is the
//! leader, following `ForwardToLeader` hints and retrying on any error or timeout with the
//! *same* bytes. A retry may therefore commit a proposal twice (a duplicate, allowed and
//! counted); what matters is that a proposal whose `client_write` returned `Ok` is never lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use cursorlog_engine::{Proposal as EngineProposal, ProposedRecord};
use cursorlog_replication::{LogId, NodeId, Proposal};
use openraft::error::{ClientWriteError, RaftError};
use tokio::sync::watch;

use super::net::Net;

/// How long one write may take before the client tries again (elsewhere if it can): a write
/// to a leader cut off from its followers never completes.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a client waits before retrying when it knows no leader.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// The record tag of a session-state record (FORMAT.md): an engine record whose state bytes
/// are opaque, so they carry the proposal's identity.
const TAG_SESSION_STATE: u8 = 12;

/// The bytes of proposal `seq` of client `client`: one SessionState record of session "sim"
/// (FORMAT.md: session `String`, state `Vec<u8>`, `at_ms` u64; u64 little-endian lengths)
/// whose state names the client and the sequence number.
pub fn proposal_bytes(client: u32, seq: u64) -> Vec<u8> {
    let session = b"sim";
    let state = format!("client {client} seq {seq}").into_bytes();
    let mut body = (session.len() as u64).to_le_bytes().to_vec();
    body.extend_from_slice(session);
    body.extend_from_slice(&(state.len() as u64).to_le_bytes());
    body.extend_from_slice(&state);
    body.extend_from_slice(&seq.to_le_bytes());
    EngineProposal::from_records(&[ProposedRecord {
        tag: TAG_SESSION_STATE,
        body,
    }])
    .as_bytes()
    .to_vec()
}

/// One acknowledged write.
#[derive(Debug, Clone)]
pub struct Ack {
    /// Which client wrote it.
    pub client: u32,
    /// Its sequence number.
    pub seq: u64,
    /// Where openraft said it committed.
    pub log_id: LogId,
    /// When the client got the answer.
    pub at: Instant,
}

/// The acknowledged writes of all clients, and their count as a watch (to wait for progress).
#[derive(Clone)]
pub struct Acks {
    list: Arc<Mutex<Vec<Ack>>>,
    count: watch::Sender<usize>,
}

impl Default for Acks {
    fn default() -> Self {
        Self {
            list: Arc::default(),
            count: watch::Sender::new(0),
        }
    }
}

impl Acks {
    fn push(&self, ack: Ack) {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        list.push(ack);
        self.count.send_replace(list.len());
    }

    /// Every ack so far, in the order they arrived.
    pub fn all(&self) -> Vec<Ack> {
        self.list
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many acks arrived so far.
    pub fn count(&self) -> usize {
        *self.count.borrow()
    }

    /// Waits until `n` more acks arrive than `from`; false after `limit` without them.
    pub async fn wait_more(&self, from: usize, n: usize, limit: Duration) -> bool {
        let mut rx = self.count.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|c| *c >= from + n))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Writes one proposal until it is acknowledged (or `stop` is set); returns its log id.
pub async fn write_until_acked(
    net: &Net,
    hint: &mut Option<NodeId>,
    bytes: &[u8],
    stop: &AtomicBool,
) -> Option<LogId> {
    let mut next = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let up = net.up();
        let target = match hint.filter(|h| up.contains(h)) {
            Some(h) => h,
            None => {
                if hint.take().is_some() || up.is_empty() {
                    // The leader named is down (its followers do not know yet), or every
                    // node is: nobody can take the write for a while.
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                if up.is_empty() {
                    continue;
                }
                next = next.wrapping_add(1);
                up[next % up.len()]
            }
        };
        let Some(raft) = net.raft(target) else {
            continue;
        };
        let proposal = Proposal {
            records: bytes.to_vec().into(),
        };
        match tokio::time::timeout(WRITE_TIMEOUT, raft.client_write(proposal)).await {
            Ok(Ok(resp)) => {
                *hint = Some(target);
                return Some(resp.log_id);
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                *hint = f.leader_id.filter(|l| *l != target);
                if hint.is_none() {
                    // An election is on.
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
            // Stopped, fatal (its disk died) or too slow: ask another node.
            Ok(Err(_)) | Err(_) => {
                *hint = None;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
    None
}

/// Runs client `client` until `stop`: proposals 0, 1, 2, … each written until acknowledged.
pub async fn run(client: u32, net: Net, acks: Acks, stop: Arc<AtomicBool>) {
    let mut hint = None;
    let mut seq = 0u64;
    loop {
        let bytes = proposal_bytes(client, seq);
        let Some(log_id) = write_until_acked(&net, &mut hint, &bytes, &stop).await else {
            return;
        };
        acks.push(Ack {
            client,
            seq,
            log_id,
            at: Instant::now(),
        });
        seq += 1;
    }
}
