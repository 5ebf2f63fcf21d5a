//! One fuzzed request: decode it as the server's codec does, call the handler, judge the
//! answer (see the parent module for the properties).

use std::collections::BTreeMap;
use std::fmt;

use cursorlog_proto::v1 as pb;
use cursorlog_proto::v1::cursor_log_server::CursorLog;
use prost::Message;
use tokio_stream::StreamExt;
use tonic::{Code, Request, Status};

use super::{acceptable, decode_refusal, KINDS};
use crate::service::CursorLogService;

/// What the calls were answered with, counted.
#[derive(Debug, Default)]
pub struct Tally {
    /// Bytes that did not decode (INVALID_ARGUMENT from the codec).
    pub decode_refused: u64,
    /// Per request kind: answers by code (`Ok` for a response).
    pub answers: BTreeMap<(&'static str, String), u64>,
}

impl Tally {
    fn count(&mut self, kind: usize, answer: &Result<(), Status>) {
        let code = match answer {
            Ok(()) => "Ok".to_owned(),
            Err(s) => format!("{:?}", s.code()),
        };
        *self.answers.entry((KINDS[kind], code)).or_default() += 1;
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut by_code: BTreeMap<&str, u64> = BTreeMap::new();
        for ((_, code), n) in &self.answers {
            *by_code.entry(code).or_default() += n;
        }
        let kinds: std::collections::BTreeSet<&str> =
            self.answers.keys().map(|(k, _)| *k).collect();
        write!(
            f,
            "{} did not decode (INVALID_ARGUMENT); decoded and answered: {by_code:?}; \
             request kinds reached: {}",
            self.decode_refused,
            kinds.len()
        )
    }
}

/// Judges a handler's answer. `missing` names a required field the request lacks: then
/// only INVALID_ARGUMENT is right.
fn judge(answer: &Result<(), Status>, missing: Option<&str>) -> Result<(), String> {
    match (answer, missing) {
        (Ok(()), Some(why)) => Err(format!("accepted although {why}")),
        (Ok(()), None) => Ok(()),
        (Err(s), _) if !acceptable(s.code()) => {
            Err(format!("answered {:?}: {}", s.code(), s.message()))
        }
        (Err(s), Some(why)) if s.code() != Code::InvalidArgument => Err(format!(
            "{why}, but answered {:?}: {}",
            s.code(),
            s.message()
        )),
        (Err(_), _) => Ok(()),
    }
}

fn missing_session(session: &str) -> Option<&'static str> {
    session.is_empty().then_some("session is empty")
}

/// The first required field an append lacks.
fn append_missing(r: &pb::AppendRequest) -> Option<&'static str> {
    missing_session(&r.session)
        .or_else(|| (r.stream == 0).then_some("stream is 0"))
        .or_else(|| r.events.is_empty().then_some("events is empty"))
}

fn complete_missing(r: &pb::CompleteRequest) -> Option<&'static str> {
    missing_session(&r.session)
        .or_else(|| (r.stream == 0).then_some("stream is 0"))
        .or_else(|| r.terminal.is_none().then_some("terminal is absent"))
}

fn open_missing(r: &pb::OpenStreamRequest) -> Option<&'static str> {
    missing_session(&r.session)
        .or_else(|| (r.epoch == 0).then_some("epoch is 0"))
        .or_else(|| (r.lease_ms == Some(0)).then_some("lease_ms is 0"))
}

fn item_missing(item: &pb::BatchItem) -> Option<&'static str> {
    match &item.item {
        None => Some("the item is empty"),
        Some(pb::batch_item::Item::Append(r)) => append_missing(r),
        Some(pb::batch_item::Item::Complete(r)) => complete_missing(r),
        Some(pb::batch_item::Item::Open(r)) => open_missing(r),
    }
}

macro_rules! decode {
    ($ty:ty, $bytes:expr, $tally:expr) => {
        match <$ty>::decode($bytes) {
            Ok(m) => m,
            Err(err) => {
                $tally.decode_refused += 1;
                let status = decode_refusal(&err);
                return if status.code() == Code::InvalidArgument {
                    Ok(())
                } else {
                    Err(format!("undecodable bytes answered {:?}", status.code()))
                };
            }
        }
    };
}

/// Decodes `bytes` as request `kind` and, if it decodes, calls the handler and judges it.
pub async fn call(
    svc: &CursorLogService,
    kind: usize,
    bytes: &[u8],
    tally: &mut Tally,
) -> Result<(), String> {
    let (answer, missing): (Result<(), Status>, Option<&str>) = match kind {
        0 => {
            let r = decode!(pb::OpenSessionRequest, bytes, tally);
            let m = missing_session(&r.session);
            (svc.open_session(Request::new(r)).await.map(drop), m)
        }
        1 => {
            let r = decode!(pb::GetSessionRequest, bytes, tally);
            let m = missing_session(&r.session);
            (svc.get_session(Request::new(r)).await.map(drop), m)
        }
        2 => {
            let r = decode!(pb::SetSessionStateRequest, bytes, tally);
            let m = missing_session(&r.session);
            (svc.set_session_state(Request::new(r)).await.map(drop), m)
        }
        3 => {
            let r = decode!(pb::AdvanceEpochRequest, bytes, tally);
            let m = missing_session(&r.session);
            (svc.advance_epoch(Request::new(r)).await.map(drop), m)
        }
        4 => {
            let r = decode!(pb::ExpireSessionRequest, bytes, tally);
            let m = missing_session(&r.session);
            (svc.expire_session(Request::new(r)).await.map(drop), m)
        }
        5 => {
            let r = decode!(pb::OpenStreamRequest, bytes, tally);
            let m = open_missing(&r);
            (svc.open_stream(Request::new(r)).await.map(drop), m)
        }
        6 => {
            let r = decode!(pb::AppendRequest, bytes, tally);
            let m = append_missing(&r);
            let answer = svc.append(Request::new(r)).await;
            if let Ok(a) = &answer {
                let a = a.get_ref();
                let n = a.last_seq.checked_sub(a.first_seq).map(|d| d + 1);
                if n != Some(a.event_ids.len() as u64) {
                    return Err(format!("append answered inconsistent seqs: {a:?}"));
                }
            }
            (answer.map(drop), m)
        }
        7 => {
            let r = decode!(pb::AppendBatchRequest, bytes, tally);
            let m = r.items.is_empty().then_some("items is empty");
            let per_item: Vec<Option<&str>> = r.items.iter().map(item_missing).collect();
            let answer = svc.append_batch(Request::new(r)).await;
            if let Ok(resp) = &answer {
                let results = &resp.get_ref().results;
                if results.len() != per_item.len() {
                    return Err(format!(
                        "{} items answered with {} results",
                        per_item.len(),
                        results.len()
                    ));
                }
                for (i, (result, missing)) in results.iter().zip(&per_item).enumerate() {
                    let failure = match &result.result {
                        Some(pb::batch_result::Result::Failure(f)) => Some(f),
                        Some(_) => None,
                        None => return Err(format!("batch item {i} has an empty result")),
                    };
                    let item_answer = match failure {
                        None => Ok(()),
                        Some(f) => Err(Status::new(Code::from(f.code), f.message.clone())),
                    };
                    judge(&item_answer, *missing).map_err(|e| format!("batch item {i}: {e}"))?;
                }
            }
            (answer.map(drop), m)
        }
        8 => {
            let r = decode!(pb::CompleteRequest, bytes, tally);
            let m = complete_missing(&r);
            (svc.complete(Request::new(r)).await.map(drop), m)
        }
        9 => {
            let r = decode!(pb::AbortRequest, bytes, tally);
            let m = missing_session(&r.session)
                .or_else(|| (r.stream == 0).then_some("stream is 0"))
                .or_else(|| r.reason.is_empty().then_some("reason is empty"));
            (svc.abort(Request::new(r)).await.map(drop), m)
        }
        10 => {
            let r = decode!(pb::KeepAliveRequest, bytes, tally);
            let m = missing_session(&r.session);
            (svc.keep_alive(Request::new(r)).await.map(drop), m)
        }
        11 => {
            let r = decode!(pb::ResolveRequest, bytes, tally);
            let m = missing_session(&r.session);
            (svc.resolve(Request::new(r)).await.map(drop), m)
        }
        12 => {
            let r = decode!(pb::ReadRequest, bytes, tally);
            let m = missing_session(&r.session);
            let follow = r.follow;
            let answer = match svc.read(Request::new(r)).await {
                Ok(stream) => drain(stream.into_inner(), follow).await,
                Err(s) => Err(s),
            };
            (answer, m)
        }
        13 => {
            let r = decode!(pb::GetOutcomeRequest, bytes, tally);
            let m = missing_session(&r.session)
                .or_else(|| (r.stream == Some(0)).then_some("stream is 0"))
                .or_else(|| {
                    (r.stream.is_none() && r.correlation.is_empty())
                        .then_some("neither stream nor correlation")
                });
            (svc.get_outcome(Request::new(r)).await.map(drop), m)
        }
        14 => {
            let r = decode!(pb::TrimRequest, bytes, tally);
            let m = missing_session(&r.session)
                .or_else(|| (r.stream == 0).then_some("stream is 0"))
                .or_else(|| (r.up_to_seq == 0).then_some("up_to_seq is 0"));
            (svc.trim(Request::new(r)).await.map(drop), m)
        }
        _ => {
            let r = decode!(pb::StatsRequest, bytes, tally);
            (svc.stats(Request::new(r)).await.map(drop), None)
        }
    };
    tally.count(kind, &answer);
    judge(&answer, missing)
}

/// Reads a Read call's messages to the end; a status in the stream is its answer. The
/// service is shut down from the start, so a `follow` call ends with UNAVAILABLE "server is
/// shutting down" after its replay: that one is expected.
async fn drain(
    mut stream: <CursorLogService as CursorLog>::ReadStream,
    follow: bool,
) -> Result<(), Status> {
    while let Some(item) = stream.next().await {
        match item {
            Ok(_) => {}
            Err(s)
                if follow
                    && s.code() == Code::Unavailable
                    && s.message() == "server is shutting down" => {}
            Err(s) => return Err(s),
        }
    }
    Ok(())
}
