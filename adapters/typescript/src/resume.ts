/**
 * Verdict → what the MCP client sees: the pure part of a resume. The same JSON-RPC error
 * codes and `data` shape as the Python and rmcp adapters.
 */
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import type { Resolution, StreamStateName } from './proto.js';

/** JSON-RPC code of the error that ends a resumed call whose cursor cannot be continued: re-issue the request. */
export const RESUME_DISCONTINUITY = -32011;
/** JSON-RPC code of the error that ends a resumed call whose producer stopped before answering. */
export const PRODUCER_ABORTED = -32012;

/** Why a resumed call cannot continue (`error.data.reason`). */
export type Reason =
  | 'cursor_evicted'
  | 'cursor_ahead'
  | 'unknown_cursor'
  | 'malformed_cursor'
  | 'unknown_session'
  | 'stream_mismatch'
  | 'producer_aborted'
  | 'stream_superseded';

/** The verdict's facts, as put into the error's `data`, the gap marker and the log line. */
export type Facts = Record<string, string | number | boolean>;

const num = (v: string | undefined): number | undefined => (v === undefined ? undefined : Number(v));

/** `ABORTED` for `STREAM_STATE_ABORTED`. */
export function stateName(state: StreamStateName | undefined): string | undefined {
  return state?.replace(/^STREAM_STATE_/, '');
}

/** The verdict and every fact cursorlog revealed, keyed as the other adapters key them. */
export function resolutionFacts(resolution: Resolution, lastEventId: string): Facts {
  const facts: Facts = { verdict: resolution.verdict, cursor: lastEventId };
  const set = (key: string, value: string | number | boolean | undefined): void => {
    if (value !== undefined) facts[key] = value;
  };
  set('current_epoch', num(resolution.currentEpoch));
  set('state', stateName(resolution.streamState));
  set('head', num(resolution.head));
  set('watermark', num(resolution.watermark));
  set('terminal_seq', num(resolution.terminalSeq));
  set('detail', resolution.detail);
  if (resolution.sessionExpired) facts['session_expired'] = true;
  if (resolution.missedTerminalFrame) facts['missed_terminal_frame'] = true;
  return facts;
}

const MESSAGES: Record<Reason, string> = {
  cursor_evicted:
    'Cannot resume {what}: the events after Last-Event-ID {cursor} were evicted from the event log by retention, so messages of this response were lost. The request may have finished; reconcile its outcome, or re-issue it as a new request.',
  cursor_ahead:
    'Cannot resume {what}: Last-Event-ID {cursor} is beyond anything the server recorded for its stream (never issued, or lost). Re-issue the request as a new request.',
  unknown_cursor:
    'Cannot resume {what}: Last-Event-ID {cursor} does not name a stream of this session. Re-issue the request as a new request.',
  malformed_cursor:
    'Cannot resume {what}: Last-Event-ID {cursor} is not an event id issued by this server. Re-issue the request as a new request.',
  unknown_session:
    'Cannot resume {what}: the session has ended or expired. Initialize a new session and re-issue the request.',
  stream_mismatch:
    'Cannot resume {what}: Last-Event-ID {cursor} belongs to another stream. Re-issue the request as a new request.',
  producer_aborted:
    'Cannot resume {what}: the server stopped producing its response ({detail}); no result will arrive. Re-issue the request as a new request.',
  stream_superseded:
    'Cannot resume {what}: its stream was superseded by a newer session epoch ({detail}); no result will arrive. Re-issue the request as a new request.',
};

/** The JSON-RPC id a stream's correlation stands for: integer-looking ids as numbers (what clients send). */
export function requestIdOf(correlation: string | undefined): string | number | null {
  if (correlation === undefined) return null;
  if (/^-?(0|[1-9][0-9]{0,14})$/.test(correlation)) return Number(correlation);
  return correlation;
}

/** The error response that ends a resumed call which cannot continue; `data` = reason + facts. */
export function discontinuityError(requestId: string | number | null, reason: Reason, facts: Facts): JSONRPCMessage {
  const what = requestId === null ? 'the request' : `request ${JSON.stringify(requestId)}`;
  const message = MESSAGES[reason]
    .replace('{what}', what)
    .replace('{cursor}', String(facts['cursor'] ?? '?'))
    .replace('{detail}', String(facts['detail'] ?? facts['state'] ?? 'no detail'));
  const code = reason === 'producer_aborted' || reason === 'stream_superseded' ? PRODUCER_ABORTED : RESUME_DISCONTINUITY;
  return {
    jsonrpc: '2.0',
    id: requestId as string | number,
    error: { code, message, data: { reason, ...facts } },
  } as JSONRPCMessage;
}

/** The visible gap marker: a `notifications/message` warning (logger `cursorlog`) with the facts. */
export function gapMarker(facts: Facts, firstSeq: number, lastSeq: number): JSONRPCMessage {
  return {
    jsonrpc: '2.0',
    method: 'notifications/message',
    params: {
      level: 'warning',
      logger: 'cursorlog',
      data: {
        reason: 'cursor_evicted',
        message: `events ${firstSeq}..${lastSeq} of this response were evicted by retention and will not be delivered; what follows is the retained rest`,
        evicted_first_seq: firstSeq,
        evicted_last_seq: lastSeq,
        ...facts,
      },
    },
  };
}

/** What a replica does with a Last-Event-ID, decided from the Resolution alone. */
export type Plan =
  | { action: 'replay' }
  | { action: 'end' }
  | { action: 'check_outcome' }
  | { action: 'fail'; reason: Reason };

const FAIL: Partial<Record<Resolution['verdict'], Reason>> = {
  CURSOR_AHEAD: 'cursor_ahead',
  UNKNOWN_CURSOR: 'unknown_cursor',
  MALFORMED_CURSOR: 'malformed_cursor',
  UNKNOWN_SESSION: 'unknown_session',
  STREAM_MISMATCH: 'stream_mismatch',
  EPOCH_MISMATCH: 'stream_superseded',
};

/**
 * The plan for a resume of the cursor's own stream (`Read` with `resume_own_stream`):
 * RESUMABLE, CURSOR_EVICTED (gap, then the retained rest) and STREAM_TERMINATED before the
 * terminal seq (the missed tail) replay; a COMPLETED stream at its terminal seq ends cleanly
 * (the client has the answer); an ABORTED/SUPERSEDED stream at its terminal seq needs the
 * outcome (no frame → producer aborted); anything else fails with its reason.
 */
export function plan(resolution: Resolution): Plan {
  switch (resolution.verdict) {
    case 'RESUMABLE':
    case 'CURSOR_EVICTED':
      return { action: 'replay' };
    case 'STREAM_TERMINATED':
      if (resolution.missedTerminalFrame) return { action: 'replay' };
      if (resolution.streamState === 'STREAM_STATE_COMPLETED') return { action: 'end' };
      return { action: 'check_outcome' };
    default: {
      const reason = FAIL[resolution.verdict];
      if (reason === undefined) throw new Error(`cursorlog sent an unknown verdict ${resolution.verdict}`);
      return { action: 'fail', reason };
    }
  }
}

/** The reason for a stream that ended without a terminal frame. */
export function abortedReason(state: StreamStateName | undefined): Reason {
  return state === 'STREAM_STATE_SUPERSEDED' ? 'stream_superseded' : 'producer_aborted';
}

/**
 * Suffix of the event id under which an adapter's own error frame is sent. A client that got
 * that frame and reconnects with it is answered 400 (the SDK's answer when
 * `getStreamIdForEventId` knows no stream): the TS client counts that as a failed reconnect
 * and stops after its retries, instead of polling a stream that has nothing more to say.
 */
export const ANSWERED_SUFFIX = '.answered';
