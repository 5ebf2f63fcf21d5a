/**
 * `replayEventsAfter`: delivers what a resuming client missed, under the original event ids,
 * exactly once, following cursorlog's verdict.
 *
 * Two paths, because the SDK delivers a stream's live events itself when this process
 * produces the stream, and cannot when another replica does:
 *
 * - **Local** (this process produces the stream): replay from cursorlog (`Read` without
 *   follow), plus the events stored while the replay ran (`LocalStream.pending`), then return
 *   the SDK's own stream id: the SDK registers the connection under it and writes the rest
 *   in-process (and `closeSSEStream` works on it). An event is delivered by exactly one side:
 *   `storeEvent` records it in `pending` in the same synchronous step that resolves the SDK's
 *   await while a replay runs; the replay sends every pending event in the synchronous step
 *   that resolves its own promise. Whichever promise resolves first has its continuation
 *   queued first, so the SDK's write either finds no connection yet (the replay sent the
 *   event) or finds the event in the connection's `replayedEventIds` (skipped).
 * - **Remote** (another replica, or a process that is gone): `Read` with `follow`. The call
 *   returns once the backlog (up to the head at resolve time) is delivered, and a *detached
 *   tail* keeps forwarding what the producer appends through the same `send`. The SDK never
 *   tells a store that the client left, so the tail ends itself: after the stream's end
 *   (then it ends the response too), when the SDK no longer maps the connection (the client
 *   left, or a newer resume replaced it), or after `followIdleMs` without an event.
 */
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { CursorlogMcpError, type ReadCall } from './client.js';
import type { Resolution, StreamStateName } from './proto.js';
import {
  abortedReason,
  ANSWERED_SUFFIX,
  discontinuityError,
  gapMarker,
  plan,
  requestIdOf,
  resolutionFacts,
  type Facts,
  type Reason,
} from './resume.js';
import { kindOf, parseCursor, type LocalStream, type SessionEventStore } from './store.js';
import type { StreamEntry } from './sdk-internals.js';

type Send = (eventId: string, message: JSONRPCMessage) => Promise<void>;

const RESPONSE_KINDS = new Set(['result', 'error']);

/** How a Read ended, for the caller. */
type Finish =
  /** The backlog is delivered and the stream goes on. */
  | 'live'
  /** The client has everything, or got the adapter's error: end the response. */
  | 'close';

/** One resume's delivery state. */
class Delivery {
  delivered: number;
  lastKind = '';
  sawTerminal = false;
  facts: Facts = {};
  correlation: string | undefined;
  resolution: Resolution | undefined;
  constructor(
    readonly lastEventId: string,
    readonly send: Send,
    readonly isGone: () => boolean,
  ) {
    this.delivered = parseCursor(lastEventId)?.seq ?? 0;
  }

  /** Sends an event once, in order; false when the client is gone. */
  event(seq: number, id: string, kind: string, message: JSONRPCMessage): boolean {
    if (seq <= this.delivered) return true;
    if (this.isGone()) return false;
    void this.send(id, message);
    this.delivered = seq;
    this.lastKind = kind;
    if (RESPONSE_KINDS.has(kind)) this.sawTerminal = true;
    return true;
  }

  /** Sends the adapter's own final frame (error or warning) under an id that answers 400 on reconnect. */
  final(reason: Reason, extra: Facts = {}): void {
    const facts = { ...this.facts, ...extra };
    const frame: JSONRPCMessage =
      this.correlation !== undefined
        ? discontinuityError(requestIdOf(this.correlation), reason, facts)
        : {
            jsonrpc: '2.0',
            method: 'notifications/message',
            params: { level: 'warning', logger: 'cursorlog', data: { reason, ...facts } },
          };
    if (!this.isGone()) void this.send(`${this.lastEventId}${ANSWERED_SUFFIX}`, frame);
    this.sawTerminal = true;
  }
}

/** Runs the resumes of one session store. */
export class Resumer {
  private closedIds = 0;
  private readonly tails = new Set<Tail>();

  constructor(private readonly store: SessionEventStore) {}

  async resume(lastEventId: string, send: Send): Promise<string> {
    const cursor = parseCursor(lastEventId);
    const local = cursor === undefined ? undefined : this.store.localByStream(cursor.stream);
    if (local !== undefined) return this.replayLocal(local, lastEventId, send);
    return this.replayRemote(lastEventId, send);
  }

  /** Ends every detached tail of the session (it ended here). */
  stopAll(): void {
    for (const tail of this.tails) tail.stop('session ended');
  }

  /** Number of detached tails running (tests). */
  get tailCount(): number {
    return this.tails.size;
  }

  private async replayLocal(local: LocalStream, lastEventId: string, send: Send): Promise<string> {
    const delivery = new Delivery(lastEventId, send, () => false);
    local.resumesInProgress += 1;
    let finish: Finish;
    try {
      const read = this.store.core.client.read({
        session: this.store.session,
        lastEventId,
        follow: false,
        resumeOwnStream: true,
      });
      finish = await this.pump(read, delivery, undefined);
    } catch (error) {
      local.resumesInProgress -= 1;
      if (local.resumesInProgress === 0) local.pending = [];
      throw error;
    }
    // From here to the return: no await (see the module comment).
    if (finish === 'live') {
      for (const p of [...local.pending].sort((a, b) => a.seq - b.seq)) {
        delivery.event(p.seq, p.id, kindOf(p.message), p.message);
      }
    }
    local.resumesInProgress -= 1;
    if (local.resumesInProgress === 0) local.pending = [];
    if (finish === 'close' || delivery.sawTerminal) return this.closeAfterRegistration(finish === 'close' ? undefined : local.sdkId);
    return local.sdkId;
  }

  private async replayRemote(lastEventId: string, send: Send): Promise<string> {
    const tail = new Tail(this, this.store, lastEventId, send);
    const backlog = await tail.start();
    if (backlog === 'close') return this.closeAfterRegistration(undefined);
    const id = this.store.sdkIdFor(parseCursor(lastEventId)?.stream ?? '');
    tail.attach(id);
    return id;
  }

  /** Track a running tail. */
  addTail(tail: Tail): void {
    this.tails.add(tail);
  }

  /** Forget a finished tail. */
  removeTail(tail: Tail): void {
    this.tails.delete(tail);
  }

  /**
   * The id to return for a response that must end as soon as the SDK registered it: a fresh
   * id nothing else writes to (or the given one), closed on the next turn of the event loop.
   */
  private closeAfterRegistration(id: string | undefined): string {
    this.closedIds += 1;
    const streamId = id ?? `cursorlog:closed:${this.closedIds}`;
    setImmediate(() => this.store.internals()._streamMapping.get(streamId)?.cleanup());
    return streamId;
  }

  /**
   * Reads until the backlog is delivered (`until` = the head at resolve time; undefined: to
   * the end of a non-following Read). Handles the first message (the verdict) and `gap`/`end`.
   */
  async pump(read: ReadCall, d: Delivery, onBacklog: (() => void) | undefined, tail?: Tail): Promise<Finish> {
    let target: number | undefined;
    let first = true;
    for await (const message of read) {
      tail?.touch();
      if (first) {
        first = false;
        if (message.item !== 'resolution' || message.resolution === undefined) {
          throw new CursorlogMcpError(`cursorlog Read started with ${message.item}, not a resolution`);
        }
        const resolution = message.resolution;
        d.resolution = resolution;
        d.correlation = resolution.correlation;
        d.facts = resolutionFacts(resolution, d.lastEventId);
        const p = plan(resolution);
        this.store.core.log('info', 'resume', { session: this.store.session, ...d.facts, action: p.action });
        if (p.action === 'fail') {
          d.final(p.reason);
          read.cancel();
          return 'close';
        }
        if (p.action === 'end') {
          read.cancel();
          return 'close';
        }
        if (p.action === 'check_outcome') {
          read.cancel();
          await this.finishWithoutFrame(d, resolution.streamState, resolution.cursor?.stream);
          return 'close';
        }
        target = resolution.head === undefined ? 0 : Number(resolution.head);
        if (d.delivered >= target && onBacklog !== undefined) onBacklog();
        continue;
      }
      if (message.item === 'gap' && message.gap !== undefined) {
        const firstSeq = Number(message.gap.firstSeq ?? 0);
        const lastSeq = Number(message.gap.lastSeq ?? 0);
        this.store.core.log('warn', 'evicted gap', { session: this.store.session, cursor: d.lastEventId, first_seq: firstSeq, last_seq: lastSeq });
        if (!d.isGone()) void d.send('', gapMarker(d.facts, firstSeq, lastSeq));
        d.delivered = Math.max(d.delivered, lastSeq);
      } else if (message.item === 'events') {
        for (const e of message.events?.events ?? []) {
          const payload = JSON.parse((e.payload ?? Buffer.alloc(0)).toString('utf8')) as JSONRPCMessage;
          if (!d.event(Number(e.seq), e.id, e.kind ?? '', payload)) {
            read.cancel();
            return 'close';
          }
        }
        if (target !== undefined && d.delivered >= target && onBacklog !== undefined) onBacklog();
      } else if (message.item === 'end' && message.end !== undefined) {
        if (message.end.state !== 'STREAM_STATE_COMPLETED' && !d.sawTerminal) {
          d.final(abortedReason(message.end.state), message.end.reason !== undefined ? { detail: message.end.reason } : {});
        }
        read.cancel();
        return 'close';
      }
    }
    if (first) throw new CursorlogMcpError('cursorlog Read ended without a resolution');
    return d.sawTerminal ? 'close' : 'live';
  }

  /** A terminal stream at its terminal seq: a clean end when it has a frame, else the aborted error. */
  private async finishWithoutFrame(d: Delivery, state: StreamStateName | undefined, stream: string | undefined): Promise<void> {
    if (stream === undefined) return;
    const outcome = await this.store.call('GetOutcome', { session: this.store.session, stream });
    if (outcome.outcome?.frame !== undefined && outcome.outcome.frame !== null) return;
    const reason = outcome.outcome?.reason;
    d.final(abortedReason(outcome.outcome?.state ?? state), reason !== undefined ? { detail: reason } : {});
  }
}

/** A remote resume: backlog, then the detached tail. */
class Tail {
  private read: ReadCall | undefined;
  private streamId: string | undefined;
  private entry: StreamEntry | undefined;
  private idleTimer: NodeJS.Timeout | undefined;
  private checkTimer: NodeJS.Timeout | undefined;
  private stopped = false;
  readonly delivery: Delivery;

  constructor(
    private readonly resumer: Resumer,
    private readonly store: SessionEventStore,
    lastEventId: string,
    send: Send,
  ) {
    this.delivery = new Delivery(lastEventId, send, () => this.gone());
  }

  /** Starts the Read; resolves once the backlog is delivered ('live') or the response must end ('close'). */
  start(): Promise<Finish> {
    this.read = this.store.core.client.read({
      session: this.store.session,
      lastEventId: this.delivery.lastEventId,
      follow: true,
      resumeOwnStream: true,
    });
    return new Promise<Finish>((resolve, reject) => {
      let settled = false;
      const settle = (f: Finish): void => {
        if (!settled) {
          settled = true;
          resolve(f);
        }
      };
      this.resumer
        .pump(this.read!, this.delivery, () => settle('live'), this)
        .then((finish) => {
          if (!settled) settle(finish);
          else this.stop(finish === 'close' ? 'stream ended' : 'read ended');
        })
        .catch((error: unknown) => {
          if (!settled) {
            settled = true;
            this.read?.cancel();
            reject(error);
          } else {
            this.store.core.log('warn', 'detached tail failed', { session: this.store.session, cursor: this.delivery.lastEventId, error: String(error) });
            this.stop('read failed');
          }
        });
    });
  }

  /** The SDK registered the connection under `streamId`: from now on the tail owns it. */
  attach(streamId: string): void {
    this.streamId = streamId;
    if (this.stopped) {
      // The stream ended while the backlog was still being handed over: end the response
      // as soon as the SDK has registered it.
      setImmediate(() => this.store.internals()._streamMapping.get(streamId)?.cleanup());
      return;
    }
    this.resumer.addTail(this);
    const idleMs = this.store.core.followIdleMs;
    this.touch();
    this.checkTimer = setInterval(() => {
      if (this.gone()) this.stop('client left');
    }, Math.min(this.store.core.tailCheckMs, idleMs));
    this.checkTimer.unref();
    setImmediate(() => {
      if (this.stopped) {
        this.store.internals()._streamMapping.get(streamId)?.cleanup();
        return;
      }
      this.entry = this.store.internals()._streamMapping.get(streamId);
      if (this.entry === undefined) this.stop('connection not registered');
    });
  }

  /** An event arrived: restart the idle clock. */
  touch(): void {
    if (this.streamId === undefined || this.stopped) return;
    if (this.idleTimer !== undefined) clearTimeout(this.idleTimer);
    this.idleTimer = setTimeout(() => this.stop('idle'), this.store.core.followIdleMs);
    this.idleTimer.unref();
  }

  /** True once the SDK no longer maps this tail's connection (client left, or replaced). */
  gone(): boolean {
    if (this.stopped) return true;
    if (this.store.released) return true;
    if (this.streamId === undefined || this.entry === undefined) return false;
    return this.store.internals()._streamMapping.get(this.streamId) !== this.entry;
  }

  /** Ends the tail: cancels the Read and ends the response if it is still this tail's. */
  stop(why: string): void {
    if (this.stopped) return;
    const stillOurs = !this.gone();
    this.stopped = true;
    if (this.idleTimer !== undefined) clearTimeout(this.idleTimer);
    if (this.checkTimer !== undefined) clearInterval(this.checkTimer);
    this.read?.cancel();
    this.resumer.removeTail(this);
    if (stillOurs && this.entry !== undefined) this.entry.cleanup();
    this.store.core.log('info', 'detached tail ended', { session: this.store.session, cursor: this.delivery.lastEventId, why, reopened: this.read?.reopened ?? 0 });
  }
}
