/**
 * Answers to a task's requests from whichever replica the client posts them to
 * (docs/TASKS-DESIGN.md §1.6 "Inbound (channel 1)", issue 20 item 2).
 *
 * A tool running as a task on replica A asks the client something (`elicitInput`,
 * `createMessage` with `relatedTask`): the SDK queues the request for the task, the client
 * fetches it through `tasks/result` on any replica B and POSTs its answer to any replica C.
 * The SDK keeps the resolver of that request in A's memory only, so:
 *
 * - **On A** ({@link TaskAnswers.open}): the queued request gets an id of its own,
 *   `cursorlog-task-<uuid>`, which is also the `correlation` of its `EnqueueTaskMessage` (the
 *   SDK numbers its requests from 0 in every server instance, so its ids collide across
 *   replicas and stateless servers; this one cannot). While such a request waits, A watches
 *   the task (`WatchTask`); when the task's inbound queue (channel 1) holds messages, A takes
 *   them (`DequeueTaskMessages`, a fresh token per dequeue, resent with the same token until
 *   answered, also by the next watch call after a failover) and
 *   hands each to the server that asked, under the SDK's own id, through its transport's
 *   `onmessage`: the SDK's resolver fires and `elicitInput` resolves. The watch ends when no
 *   request of the task waits any more (answered, timed out, server closed) or the task ends
 *   (its waiting requests then fail as the SDK fails them: InternalError "Task cancelled or
 *   completed"). A watch call that fails (a cursorlog failover, or every read slot taken) or ends early is opened again
 *   on the leader after a backoff for as long as a request waits; the requests' own timeouts
 *   bound the wait (a timed-out request is noticed within `recheckMs`).
 * - **On C** ({@link TaskAnswers.route}): a POSTed JSON-RPC response (or error response) for
 *   which the local SDK has no pending request is given to `RouteTaskMessage(owner,
 *   correlation = its id)`. cursorlog appends it to the task's inbound queue and closes the
 *   route in one entry, so an answer (and a resent POST of it) reaches the task exactly once.
 *   What was routed is taken out of the body; the SDK answers the rest (an empty batch: 202,
 *   as for any accepted response). What was not routed stays, and the SDK treats it as before.
 */
import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import * as grpc from '@grpc/grpc-js';
import { CursorlogError, type CursorlogClient } from './client.js';
import type { Logger } from './core.js';
import type { PbGetTaskResponse } from './proto.js';
import { awaitsResponse, type ProtocolInternals, waitsForResponse } from './sdk-internals.js';

/** The inbound queue: the client's answers, for the replica running the task. */
const INBOUND = 1;
/** The prefix of the ids this adapter gives the requests queued for a task. */
export const TASK_REQUEST_ID_PREFIX = 'cursorlog-task-';
/** JSON-RPC InternalError: how the SDK fails a request of a task that ended (`_clearTaskQueue`). */
const INTERNAL_ERROR = -32603;
const TERMINAL: ReadonlySet<string> = new Set(['COMPLETED', 'FAILED', 'CANCELLED']);
/** First wait before a watch is opened again after its call failed or ended, ms; doubled each time in a row. */
const REWATCH_MIN_MS = 50;
/** Longest wait before a watch is opened again, ms. */
const REWATCH_MAX_MS = 2_000;
/** How often a watch checks that its requests still wait (the SDK says nothing when one times out), ms. */
export const DEFAULT_RECHECK_MS = 1_000;

/** Counters of a {@link TaskAnswers} (tests, diagnostics). */
export interface TaskAnswersStats {
  /** Answers this replica routed to a task (resent ones included). */
  routed: number;
  /** Of {@link routed}: resends cursorlog had routed before (nothing new was queued). */
  duplicates: number;
  /** Answers without a route: left to the SDK. */
  notRouted: number;
  /** Answers handed to the server that asked. */
  delivered: number;
  /** Messages taken from an inbound queue that no request of this replica waits for (dropped). */
  unmatched: number;
  /** Watches started. */
  watches: number;
  /** Watches opened again after their call failed or ended (a cursorlog failover). */
  reopened: number;
  /**
   * Watch calls cursorlog refused with RESOURCE_EXHAUSTED: its `--read-calls-max` slots
   * (shared with following reads) were all taken. Each is opened again after a backoff.
   */
  refused: number;
}

/** A request of this replica waiting for its answer through cursorlog. */
interface Pending {
  protocol: ProtocolInternals;
  /** The SDK's own id of the request. */
  id: string | number;
  watch: TaskWatch;
}

/** A JSON-RPC response or error response (what a client POSTs as an answer). */
type Answer = { jsonrpc?: string; id: string | number; result?: unknown; error?: { code: number; message: string; data?: unknown } };

function isAnswer(m: unknown): m is Answer {
  if (typeof m !== 'object' || m === null || Array.isArray(m) || 'method' in m) return false;
  const id = (m as { id?: unknown }).id;
  return (typeof id === 'string' || typeof id === 'number') && ('result' in m || 'error' in m);
}

/** The request registered by {@link TaskAnswers.open}: enqueue it with `routeId`, then `watch()`, or `cancel()` on failure. */
export interface OpenedRequest {
  routeId: string;
  watch(): void;
  cancel(): void;
}

/** The cross-replica answer routing of one process (both sides). Owned by a `CursorlogTaskMessageQueue`. */
export class TaskAnswers {
  private readonly pending = new Map<string, Pending>();
  private readonly watches = new Map<string, TaskWatch>();
  private idleWaiters: (() => void)[] = [];
  private warnedUnimplemented = false;
  /** Counters (tests, diagnostics). */
  readonly stats: TaskAnswersStats = { routed: 0, duplicates: 0, notRouted: 0, delivered: 0, unmatched: 0, watches: 0, reopened: 0, refused: 0 };
  /**
   * What the watches do, for tests and diagnostics: `view` (task id) when a watch received the
   * task's state, `reopen` (task id) when it watches again after its call failed or ended.
   */
  readonly events = new EventEmitter();

  /**
   * @param recheckMs how often a watch checks that its requests still wait: one that timed
   *   out, or whose server closed, releases the watch within this time even when the task
   *   does not change.
   */
  constructor(
    readonly client: CursorlogClient,
    readonly log: Logger,
    readonly recheckMs: number = DEFAULT_RECHECK_MS,
  ) {}

  /** Watches running now. */
  get watching(): number {
    return this.watches.size;
  }

  /** Resolves once no watch runs (at once when none does). */
  whenIdle(): Promise<void> {
    if (this.watches.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** A side: registers a request of `protocol` (SDK id `id`) queued for task `taskId` of `owner`. */
  open(protocol: ProtocolInternals, owner: string, taskId: string, id: string | number): OpenedRequest {
    const routeId = `${TASK_REQUEST_ID_PREFIX}${randomUUID()}`;
    const key = `${owner}\u0000${taskId}`;
    let watch = this.watches.get(key);
    if (watch === undefined || watch.done) {
      watch = new TaskWatch(this, owner, taskId);
      this.watches.set(key, watch);
    }
    const w = watch;
    this.pending.set(routeId, { protocol, id, watch: w });
    w.requests.add(routeId);
    return {
      routeId,
      watch: () => w.start(),
      cancel: () => this.release(routeId),
    };
  }

  /**
   * C side: routes every answer in `body` (one JSON-RPC message or a batch) that `protocol`
   * (the local server of the session, if any) does not wait for, and returns what the SDK
   * should still see: `body` itself when nothing was routed, else the rest (an empty batch
   * when everything was). Throws {@link CursorlogError} when cursorlog cannot be asked (the
   * answer is then neither routed nor swallowed: the caller answers an error).
   */
  async route(owner: string, body: unknown, protocol: ProtocolInternals | undefined): Promise<unknown> {
    const messages: unknown[] = Array.isArray(body) ? body : [body];
    const candidates = messages.filter((m): m is Answer => isAnswer(m) && !(protocol !== undefined && awaitsResponse(protocol, m.id)));
    if (candidates.length === 0) return body;
    const routed = new Set<unknown>();
    await Promise.all(candidates.map(async (m) => {
      if (await this.routeOne(owner, m)) routed.add(m);
    }));
    if (routed.size === 0) return body;
    const rest = messages.filter((m) => !routed.has(m));
    return Array.isArray(body) || rest.length === 0 ? rest : rest[0];
  }

  private async routeOne(owner: string, answer: Answer): Promise<boolean> {
    try {
      const response = await this.client.call('RouteTaskMessage', {
        owner,
        correlation: String(answer.id),
        message: Buffer.from(JSON.stringify(answer)),
      });
      if (response.routed === true) {
        this.stats.routed += 1;
        if (response.duplicate === true) this.stats.duplicates += 1;
        return true;
      }
      this.stats.notRouted += 1;
      return false;
    } catch (error) {
      if (error instanceof CursorlogError && error.code === grpc.status.UNIMPLEMENTED) {
        // A cursorlog without RouteTaskMessage: the SDK handles the answer as it always did.
        if (!this.warnedUnimplemented) this.log('warn', 'cursorlog does not route task answers (RouteTaskMessage unimplemented): an answer posted to another replica is lost', {});
        this.warnedUnimplemented = true;
        this.stats.notRouted += 1;
        return false;
      }
      throw error;
    }
  }

  /** A watch saw the task: takes its answers when some wait; true when the watch is over. */
  async onView(w: TaskWatch, r: PbGetTaskResponse): Promise<boolean> {
    this.events.emit('view', w.taskId);
    const task = r.view?.task;
    const ended = r.verdict !== 'TASK_FOUND' || task === undefined || TERMINAL.has(task.status);
    // A dequeue whose outcome is unknown may hold answers the view no longer counts: resend it.
    if (ended || Number(r.view?.inboundQueued ?? 0) > 0 || w.dequeueToken !== undefined) await this.drain(w);
    if (ended) {
      this.failAll(w, 'Task cancelled or completed');
      return true;
    }
    this.sweep(w);
    return w.requests.size === 0;
  }

  /** Releases the requests of `w` the SDK stopped waiting for (timed out, aborted, server closed): they need no answer. */
  sweep(w: TaskWatch): void {
    for (const routeId of [...w.requests]) {
      const p = this.pending.get(routeId);
      if (p === undefined || !waitsForResponse(p.protocol, p.id)) this.release(routeId);
    }
  }

  /** Takes every message of the task's inbound queue and hands each to the request it answers. */
  private async drain(w: TaskWatch): Promise<void> {
    let response;
    // A fresh token per dequeue, kept until the dequeue is answered: the client resends it
    // unchanged within its deadline, and the watch resends it after that (cursorlog keeps the
    // last batch under its token), so answers a dequeue took before its response was lost
    // are not lost with it.
    w.dequeueToken ??= randomUUID();
    try {
      response = await this.client.call('DequeueTaskMessages', { owner: w.owner, taskId: w.taskId, channel: INBOUND, maxMessages: 0, token: w.dequeueToken });
    } catch (error) {
      if (error instanceof CursorlogError && error.code === grpc.status.NOT_FOUND) {
        w.dequeueToken = undefined;
        return;
      }
      throw error;
    }
    w.dequeueToken = undefined;
    for (const m of response.messages ?? []) this.deliver(w, (m.message ?? Buffer.alloc(0)).toString('utf8'));
  }

  private deliver(w: TaskWatch, text: string): void {
    let answer: unknown;
    try {
      answer = JSON.parse(text);
    } catch {
      answer = undefined;
    }
    const routeId = isAnswer(answer) ? String(answer.id) : undefined;
    const p = routeId === undefined ? undefined : this.pending.get(routeId);
    if (routeId === undefined || p === undefined || p.watch !== w || !isAnswer(answer)) {
      this.stats.unmatched += 1;
      this.log('warn', 'a task answer that no request of this replica waits for was dropped', { task: w.taskId, id: routeId ?? null });
      return;
    }
    this.release(routeId);
    const onmessage = p.protocol.transport?.onmessage;
    if (onmessage === undefined) {
      // The server was closed: the SDK already failed the request (ConnectionClosed).
      this.log('warn', 'the server that asked is closed; its task answer is dropped', { task: w.taskId, id: routeId });
      return;
    }
    this.stats.delivered += 1;
    onmessage.call(p.protocol.transport, { ...answer, jsonrpc: '2.0', id: p.id });
  }

  /** Fails every request still waiting on `w` with InternalError `message` (as the SDK does when a task ends). */
  failAll(w: TaskWatch, message: string): void {
    for (const routeId of [...w.requests]) {
      const p = this.pending.get(routeId);
      this.release(routeId);
      if (p === undefined || !waitsForResponse(p.protocol, p.id)) continue;
      p.protocol.transport?.onmessage?.call(p.protocol.transport, { jsonrpc: '2.0', id: p.id, error: { code: INTERNAL_ERROR, message } });
    }
  }

  private release(routeId: string): void {
    const p = this.pending.get(routeId);
    if (p === undefined) return;
    this.pending.delete(routeId);
    p.watch.requests.delete(routeId);
    if (p.watch.requests.size === 0) p.watch.stop();
  }

  /** A watch is over: forget it. */
  ended(w: TaskWatch): void {
    const key = `${w.owner}\u0000${w.taskId}`;
    if (this.watches.get(key) === w) this.watches.delete(key);
    if (this.watches.size === 0) {
      const waiters = this.idleWaiters;
      this.idleWaiters = [];
      for (const resolve of waiters) resolve();
    }
  }
}

/** One task watched for answers to its requests (see {@link TaskAnswers}). */
class TaskWatch {
  /** Route ids of the requests waiting on this task. */
  readonly requests = new Set<string>();
  /** The token of a dequeue not answered yet (outcome unknown): the next dequeue resends it. */
  dequeueToken: string | undefined;
  done = false;
  private running = false;
  private stream: grpc.ClientReadableStream<PbGetTaskResponse> | undefined;
  private recheck: NodeJS.Timeout | undefined;
  private pause: { timer: NodeJS.Timeout; wake: () => void } | undefined;

  constructor(
    private readonly answers: TaskAnswers,
    readonly owner: string,
    readonly taskId: string,
  ) {}

  start(): void {
    if (this.running || this.done) return;
    this.running = true;
    this.answers.stats.watches += 1;
    // The SDK says nothing when a request times out: look, so the watch ends with its last request.
    this.recheck = setInterval(() => this.answers.sweep(this), this.answers.recheckMs);
    this.recheck.unref();
    void this.run()
      .catch((error: unknown) => {
        this.answers.log('warn', 'watching a task for answers failed; its waiting requests fail', { task: this.taskId, error: String(error) });
        this.answers.failAll(this, `cursorlog: watching task ${this.taskId} for answers failed: ${String(error)}`);
      })
      .finally(() => {
        this.done = true;
        this.clearTimers();
        this.answers.ended(this);
      });
  }

  stop(): void {
    this.done = true;
    this.clearTimers();
    this.stream?.cancel();
    if (!this.running) this.answers.ended(this);
  }

  private clearTimers(): void {
    if (this.recheck !== undefined) clearInterval(this.recheck);
    this.recheck = undefined;
    if (this.pause !== undefined) {
      clearTimeout(this.pause.timer);
      this.pause.wake();
      this.pause = undefined;
    }
  }

  /** Waits `ms` (or until {@link stop}). */
  private wait(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.pause = undefined;
        resolve();
      }, ms);
      this.pause = { timer, wake: resolve };
    });
  }

  /**
   * Watches until the task ends or no request waits. A watch call that fails with UNAVAILABLE
   * (a failover: the member stopped leading or died) or RESOURCE_EXHAUSTED (cursorlog's read
   * slots are all taken), ends without the task's end, or whose
   * dequeue failed retryably is opened again after a backoff (growing while calls in a row see
   * no change of the task), for as long as a request waits: the requests' own timeouts bound
   * it, not a call deadline. Other failures fail the waiting requests.
   */
  private async run(): Promise<void> {
    const client = this.answers.client;
    /** Watch calls in a row that saw no change of the task. */
    let streak = 0;
    while (!this.done) {
      // Always from version 0: the first message is the task as it is now, so a watch opened
      // again after a failure also sees answers queued meanwhile.
      const { address, stream } = client.openWatchTask({ owner: this.owner, taskId: this.taskId });
      this.stream = stream;
      // An error after cancel() is expected; without a listener it would be thrown.
      stream.on('error', () => {});
      let hinted = 0;
      try {
        let views = 0;
        for await (const r of stream as AsyncIterable<PbGetTaskResponse>) {
          views += 1;
          // A second view is a change seen live: this watch works.
          if (views > 1) streak = 0;
          client.router.succeeded(address);
          if (await this.answers.onView(this, r)) return;
          if (this.done) return;
        }
        if (this.done) return;
      } catch (error) {
        if (this.done) return;
        if (error instanceof CursorlogError) {
          // The dequeue (its client already retried within its deadline): resent on the next view.
          if (!error.retryable) throw error;
        } else if ((error as Partial<grpc.ServiceError>).code === grpc.status.RESOURCE_EXHAUSTED) {
          // Every read slot is taken (following reads, other watches): they free as those end.
          if (this.answers.stats.refused === 0) {
            this.answers.log('warn', "cursorlog refused a task watch: its read slots (--read-calls-max) are all taken; retrying while the task's requests wait", { task: this.taskId, error: String(error) });
          }
          this.answers.stats.refused += 1;
          this.answers.events.emit('refused', this.taskId);
        } else {
          const wait = client.failedOn(address, error);
          if (wait === undefined) throw error;
          hinted = wait;
        }
      } finally {
        // Left early (task ended, a dequeue failed): end the call, and its slot in cursorlog.
        stream.cancel();
      }
      await this.wait(Math.max(hinted, Math.min(REWATCH_MAX_MS, REWATCH_MIN_MS * 2 ** Math.min(streak, 16))));
      streak += 1;
      if (this.done) return;
      this.answers.stats.reopened += 1;
      this.answers.events.emit('reopen', this.taskId);
    }
  }
}
