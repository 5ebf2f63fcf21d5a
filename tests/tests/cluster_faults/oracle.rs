//! The workload (concurrent clients appending through whichever member leads) and the oracle
//! of every acknowledgement they received.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cursorlog_tests::cluster::{CallError, Cluster, WAIT};
use cursorlog_tests::{absorb, event, pb, ReadAll};
use tonic::{Code, Response};

/// splitmix64: a seeded generator, so a failing seed replays the same choices.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// What was acknowledged of one stream.
#[derive(Debug, Default)]
struct StreamRec {
    session: String,
    epoch: u64,
    /// seq → payload of every acknowledged event.
    acked: BTreeMap<u64, Vec<u8>>,
    /// seq → (member, UTC time of day) of each acknowledgement, to find it in the logs.
    by: BTreeMap<u64, (usize, String)>,
    /// The acknowledged Complete: terminal seq and frame.
    completed: Option<(u64, Vec<u8>)>,
}

#[derive(Debug, Default)]
struct State {
    /// Event id → payload of every acknowledgement.
    events: HashMap<String, Vec<u8>>,
    streams: BTreeMap<u64, StreamRec>,
    violations: Vec<String>,
    acks: u64,
    retries_confirmed_by_read: u64,
    last_ack: Option<Instant>,
    max_gap: Duration,
    clock_stopped: bool,
}

/// Every acknowledgement of the run, and what broke the contract.
#[derive(Debug)]
pub struct Oracle {
    state: Mutex<State>,
    acks: tokio::sync::watch::Sender<u64>,
}

impl Default for Oracle {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            acks: tokio::sync::watch::channel(0).0,
        }
    }
}

/// One stream as a member serves it: (seq, payload) of every event and the terminal seq.
pub type Served = BTreeMap<u64, (Vec<(u64, Vec<u8>)>, Option<u64>)>;

/// Reads a whole stream (from `{epoch}-{stream}-0`, resuming its own stream) on the leader.
pub async fn read_stream(cluster: &Cluster, session: &str, epoch: u64, stream: u64) -> ReadAll {
    read_stream_by(cluster, session, epoch, stream).await.0
}

/// [`read_stream`], and the member that served it.
async fn read_stream_by(
    cluster: &Cluster,
    session: &str,
    epoch: u64,
    stream: u64,
) -> (ReadAll, usize) {
    let request = pb::ReadRequest {
        session: session.into(),
        last_event_id: format!("{epoch}-{stream}-0"),
        declared_stream: None,
        follow: false,
        batch_events_max: 0,
        resume_own_stream: true,
    };
    let (all, by) = cluster
        .call("read", |mut c| {
            let request = request.clone();
            async move {
                let mut s = c.read(request).await?.into_inner();
                let mut all = ReadAll::default();
                while let Some(msg) = s.message().await? {
                    absorb(&mut all, msg);
                }
                Ok(Response::new(all))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("read of stream {stream}: {e:?}"));
    (all, by.member)
}

impl Oracle {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("oracle lock")
    }

    /// Records a contract violation (checked at the end, so the run reports all of them).
    pub fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.lock().violations.push(what);
    }

    fn register(&self, session: &str, epoch: u64, stream: u64) {
        self.lock().streams.entry(stream).or_insert(StreamRec {
            session: session.into(),
            epoch,
            ..StreamRec::default()
        });
    }

    /// Records acknowledged events `first..` of `stream`, answered by `member`.
    fn ack(&self, stream: u64, first: u64, payloads: &[Vec<u8>], member: usize) {
        let at = time_of_day();
        let mut s = self.lock();
        let s = &mut *s;
        let rec = s.streams.get_mut(&stream).expect("registered stream");
        if let Some((t, _)) = rec.completed {
            s.violations.push(format!(
                "append at {first} acknowledged after the acknowledged Complete ({t}) of stream {stream}"
            ));
        }
        for (k, p) in payloads.iter().enumerate() {
            let seq = first + k as u64;
            let id = format!("{}-{stream}-{seq}", rec.epoch);
            if let Some(old) = s.events.insert(id.clone(), p.clone()) {
                if old != *p {
                    s.violations
                        .push(format!("event {id} acknowledged with two payloads"));
                }
            }
            rec.acked.insert(seq, p.clone());
            rec.by.insert(seq, (member + 1, at.clone()));
        }
        s.acks += payloads.len() as u64;
        let now = Instant::now();
        if let Some(last) = s.last_ack {
            if !s.clock_stopped {
                s.max_gap = s.max_gap.max(now - last);
            }
        }
        s.last_ack = Some(now);
        self.acks.send_replace(s.acks);
    }

    fn complete(&self, stream: u64, seq: u64, frame: Vec<u8>, member: usize) {
        self.ack(stream, seq, std::slice::from_ref(&frame), member);
        self.lock()
            .streams
            .get_mut(&stream)
            .expect("stream")
            .completed = Some((seq, frame));
    }

    /// Waits until `n` more events are acknowledged.
    ///
    /// # Panics
    /// When they are not within [`WAIT`].
    pub async fn wait_acks(&self, n: u64) {
        let mut rx = self.acks.subscribe();
        let target = *rx.borrow() + n;
        tokio::time::timeout(WAIT, rx.wait_for(|a| *a >= target))
            .await
            .expect("the workload made no progress")
            .expect("oracle alive");
    }

    /// Stops measuring the time between acknowledgements; returns the longest.
    pub fn stop_clock(&self) -> Duration {
        let mut s = self.lock();
        s.clock_stopped = true;
        s.max_gap
    }

    /// Opens `session` and a new stream in it for a fault's probe; registers it.
    pub async fn probe_stream(&self, cluster: &Cluster, session: &str) -> (u64, u64) {
        open(cluster, session, "probe").await.map_or_else(
            |e| panic!("probe stream: {e:?}"),
            |(epoch, stream)| {
                self.register(session, epoch, stream);
                (epoch, stream)
            },
        )
    }

    /// Appends one acknowledged probe event at `seq`.
    pub async fn probe_append(
        &self,
        cluster: &Cluster,
        session: &str,
        stream: u64,
        seq: u64,
        bytes: &[u8],
    ) {
        assert!(
            append(cluster, self, session, stream, seq, vec![bytes.to_vec()]).await,
            "probe append at {seq} of {stream}"
        );
    }

    /// Reads every stream on member `t` (the leader now) and checks it against the
    /// acknowledgements: gap-free from seq 1, acknowledged bytes identical, an acknowledged
    /// Complete at its seq. Returns what it served, to compare members; `None` when another
    /// member took the lead during the check (force `t` again and repeat).
    pub async fn check_served(&self, cluster: &Cluster, t: usize) -> Option<Served> {
        let mut served = Served::new();
        self.check_served_into(cluster, t, &mut served)
            .await
            .then_some(served)
    }

    /// [`Oracle::check_served`] on whichever member leads once it caught up, again from the
    /// start on the next leader when the lead moves during the check (a loaded machine can
    /// miss heartbeats; every leader must serve everything acknowledged).
    ///
    /// # Panics
    /// When the lead moved 20 times, or on a violation.
    pub async fn check_served_by_leader(&self, cluster: &Cluster) -> Served {
        for _ in 0..20 {
            let t = cluster.leader(None).await;
            cluster.wait_caught_up(t).await;
            if let Some(served) = self.check_served(cluster, t).await {
                return served;
            }
        }
        panic!("the lead moved 20 times during the check");
    }

    /// [`Oracle::check_served`], resumable: checks the streams not yet in `served` and adds
    /// them; `false` when another member took the lead part way (force `t` again and call
    /// again: a long history is then not read again from the start).
    pub async fn check_served_into(
        &self,
        cluster: &Cluster,
        t: usize,
        served: &mut Served,
    ) -> bool {
        let streams: Vec<(u64, String, u64)> = self
            .lock()
            .streams
            .iter()
            .filter(|(id, _)| !served.contains_key(id))
            .map(|(id, r)| (*id, r.session.clone(), r.epoch))
            .collect();
        for (stream, session, epoch) in streams {
            let (all, by) = read_stream_by(cluster, &session, epoch, stream).await;
            if by != t {
                return false;
            }
            let s = self.lock();
            let rec = &s.streams[&stream];
            let seqs: Vec<u64> = all.events.iter().map(|e| e.seq).collect();
            let mut problems = Vec::new();
            if seqs != (1..=seqs.len() as u64).collect::<Vec<_>>() {
                problems.push(format!("not gap-free from 1: {seqs:?}"));
            }
            for (seq, bytes) in &rec.acked {
                match all.events.iter().find(|e| e.seq == *seq) {
                    Some(e) if e.payload == *bytes => {}
                    Some(e) => problems.push(format!("seq {seq} payload {:?}", e.payload)),
                    None => problems.push(format!(
                        "acknowledged seq {seq} missing (acknowledged by member, at: {:?})",
                        rec.by.get(seq)
                    )),
                }
            }
            if let Some((t_seq, _)) = rec.completed {
                match &all.end {
                    Some(end) if end.terminal_seq == t_seq => {}
                    other => problems.push(format!("acknowledged Complete {t_seq}, end {other:?}")),
                }
            }
            drop(s);
            for p in problems {
                self.violation(format!("member {} stream {stream}: {p}", t + 1));
            }
            let events = all.events.into_iter().map(|e| (e.seq, e.payload.to_vec()));
            served.insert(stream, (events.collect(), all.end.map(|e| e.terminal_seq)));
        }
        true
    }

    /// Resolves acknowledged cursors on the leader: each must be RESUMABLE or
    /// STREAM_TERMINATED. All of them up to 5000; beyond, each stream's first and last and
    /// an even sample of the rest. Returns how many were resolved.
    pub async fn check_cursors(&self, cluster: &Cluster) -> u64 {
        let cursors: Vec<(String, String)> = {
            let s = self.lock();
            let total: usize = s.streams.values().map(|r| r.acked.len()).sum();
            let every = (total / 5000).max(1);
            let mut out = Vec::new();
            for (id, r) in &s.streams {
                let last = r.acked.keys().next_back().copied();
                for (k, seq) in r.acked.keys().enumerate() {
                    if k == 0 || Some(*seq) == last || out.len().is_multiple_of(every) {
                        out.push((r.session.clone(), format!("{}-{id}-{seq}", r.epoch)));
                    }
                }
            }
            out
        };
        for (session, cursor) in &cursors {
            let request = pb::ResolveRequest {
                session: session.clone(),
                last_event_id: cursor.clone(),
                declared_stream: None,
            };
            let answer = cluster
                .call("resolve", |mut c| {
                    let request = request.clone();
                    async move { c.resolve(request).await }
                })
                .await;
            match answer {
                Ok((r, _))
                    if matches!(
                        r.verdict(),
                        pb::Verdict::Resumable | pb::Verdict::StreamTerminated
                    ) => {}
                other => self.violation(format!("cursor {cursor} resolves {other:?}")),
            }
        }
        cursors.len() as u64
    }

    /// Totals for the closing line.
    pub fn report(&self) -> String {
        let s = self.lock();
        let completed = s.streams.values().filter(|r| r.completed.is_some()).count();
        format!(
            "acknowledged events {} in {} streams ({completed} completed), retries confirmed by \
             a read {}, violations so far {}, longest without an ack {:?}",
            s.acks,
            s.streams.len(),
            s.retries_confirmed_by_read,
            s.violations.len(),
            s.max_gap
        )
    }

    /// Panics listing every violation recorded.
    pub fn assert_no_violations(&self) {
        let s = self.lock();
        assert!(s.violations.is_empty(), "violations: {:#?}", s.violations);
    }
}

/// Opens `session` (idempotent) and a stream in it; `(epoch, stream)`.
async fn open(cluster: &Cluster, session: &str, corr: &str) -> Result<(u64, u64), CallError> {
    let request = pb::OpenSessionRequest {
        session: session.into(),
        state: None,
    };
    let (opened, _) = cluster
        .call("open session", |mut c| {
            let request = request.clone();
            async move { c.open_session(request).await }
        })
        .await?;
    let request = pb::OpenStreamRequest {
        session: session.into(),
        epoch: opened.epoch,
        correlation: Some(corr.into()),
        lease_ms: None,
    };
    // A retry may open a second stream; the one answered is the one used.
    let (stream, _) = cluster
        .call("open stream", |mut c| {
            let request = request.clone();
            async move { c.open_stream(request).await }
        })
        .await?;
    Ok((stream.epoch, stream.stream))
}

/// Appends `payloads` at `first` until acknowledged; records the acknowledgement.
async fn append(
    cluster: &Cluster,
    oracle: &Oracle,
    session: &str,
    stream: u64,
    first: u64,
    payloads: Vec<Vec<u8>>,
) -> bool {
    let request = pb::AppendRequest {
        session: session.into(),
        stream,
        expected_next_seq: Some(first),
        events: payloads.iter().map(|p| event("progress", p)).collect(),
    };
    let answer = cluster
        .call("append", |mut c| {
            let request = request.clone();
            async move { c.append(request).await }
        })
        .await;
    match answer {
        Ok((r, by)) => {
            let last = first + payloads.len() as u64 - 1;
            if r.first_seq != first || r.last_seq != last {
                oracle.violation(format!("append at {first} of {stream} answered {r:?}"));
            }
            // A duplicate answer is marked in the member number (+100) for the report.
            let member = if r.duplicate {
                by.member + 100
            } else {
                by.member
            };
            oracle.ack(stream, first, &payloads, member);
            true
        }
        Err(CallError {
            status,
            uncertain: true,
        }) if status.code() == Code::Aborted => {
            // The first attempt may have been applied: it counts only if the bytes are there.
            let (epoch, session) = {
                let s = oracle.lock();
                let r = &s.streams[&stream];
                (r.epoch, r.session.clone())
            };
            let all = read_stream(cluster, &session, epoch, stream).await;
            let there = payloads.iter().enumerate().all(|(k, p)| {
                all.events
                    .iter()
                    .any(|e| e.seq == first + k as u64 && e.payload == *p)
            });
            if there {
                oracle.lock().retries_confirmed_by_read += 1;
                oracle.ack(stream, first, &payloads, cluster.hint());
                true
            } else {
                oracle.violation(format!(
                    "retried append at {first} of {stream}: {status:?}, and the bytes are not there"
                ));
                false
            }
        }
        Err(e) => {
            oracle.violation(format!("append at {first} of {stream}: {e:?}"));
            false
        }
    }
}

/// One client: its own session, streams one after another, batches of 1–4 events.
pub struct Workload {
    /// Client number.
    pub id: u64,
    /// The cluster.
    pub cluster: Arc<Cluster>,
    /// Where acknowledgements go.
    pub oracle: Arc<Oracle>,
    /// Set when the run is over.
    pub stop: Arc<AtomicBool>,
    /// Its choices.
    pub rng: Rng,
}

impl Workload {
    /// Runs until `stop`.
    pub async fn run(mut self) {
        let session = format!("client-{}", self.id);
        let mut n = 0;
        'streams: while !self.stop.load(Ordering::SeqCst) {
            n += 1;
            let (epoch, stream) = match open(&self.cluster, &session, &format!("call-{n}")).await {
                Ok(opened) => opened,
                Err(e) => {
                    self.oracle.violation(format!("open stream: {e:?}"));
                    return;
                }
            };
            self.oracle.register(&session, epoch, stream);
            let batches = 2 + self.rng.next() % 6;
            let mut next = 1;
            for _ in 0..batches {
                if self.stop.load(Ordering::SeqCst) {
                    return;
                }
                let count = 1 + self.rng.next() % 4;
                let payloads: Vec<Vec<u8>> = (next..next + count)
                    .map(|seq| {
                        format!("c{} s{stream} #{seq} {:x}", self.id, self.rng.next()).into_bytes()
                    })
                    .collect();
                if !append(
                    &self.cluster,
                    &self.oracle,
                    &session,
                    stream,
                    next,
                    payloads,
                )
                .await
                {
                    // Reported; the stream's later seqs would only repeat it.
                    continue 'streams;
                }
                next += count;
            }
            if !self.rng.next().is_multiple_of(5) {
                self.complete(&session, stream, next).await;
            }
        }
    }

    /// Completes `stream` at `seq`; then an append after it must be refused.
    async fn complete(&mut self, session: &str, stream: u64, seq: u64) {
        let frame = format!("done c{} s{stream}", self.id).into_bytes();
        let request = pb::CompleteRequest {
            session: session.into(),
            stream,
            expected_next_seq: Some(seq),
            terminal: Some(event("result", &frame)),
        };
        let answer = self
            .cluster
            .call("complete", |mut c| {
                let request = request.clone();
                async move { c.complete(request).await }
            })
            .await;
        let oracle = &self.oracle;
        match answer {
            Ok((r, by)) if r.terminal_seq == seq => oracle.complete(stream, seq, frame, by.member),
            Ok((r, _)) => oracle.violation(format!("complete of {stream} at {seq}: {r:?}")),
            Err(CallError {
                status,
                uncertain: true,
            }) if matches!(status.code(), Code::Aborted | Code::FailedPrecondition) => {
                let epoch = oracle.lock().streams[&stream].epoch;
                let all = read_stream(&self.cluster, session, epoch, stream).await;
                let done = all.end.as_ref().is_some_and(|e| e.terminal_seq == seq)
                    && all.events.last().is_some_and(|e| e.payload == frame);
                if done {
                    oracle.lock().retries_confirmed_by_read += 1;
                    oracle.complete(stream, seq, frame, self.cluster.hint());
                } else {
                    oracle.violation(format!("retried complete of {stream}: {status:?}, {all:?}"));
                }
                return;
            }
            Err(e) => {
                oracle.violation(format!("complete of {stream}: {e:?}"));
                return;
            }
        }
        // An append after the acknowledged Complete is refused.
        let after = pb::AppendRequest {
            session: session.into(),
            stream,
            expected_next_seq: Some(seq + 1),
            events: vec![event("progress", b"after complete")],
        };
        let answer = self
            .cluster
            .call("append after complete", |mut c| {
                let after = after.clone();
                async move { c.append(after).await }
            })
            .await;
        if let Ok((r, by)) = answer {
            oracle.ack(stream, seq + 1, &[b"after complete".to_vec()], by.member);
            oracle.violation(format!(
                "append after Complete of {stream} acknowledged: {r:?}"
            ));
        }
    }
}

/// The UTC time of day `hh:mm:ss.mmm`, as the members' log lines show it.
fn time_of_day() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let day = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3_600_000,
        day / 60_000 % 60,
        day / 1000 % 60,
        day % 1000
    )
}
