/**
 * Coalesces the stream opens, appends and completions of every session of a process into
 * shared `AppendBatch` calls, Kafka-producer style: when no batch is in flight a request is
 * sent at once (no added latency when idle); while one is in flight, new requests queue and
 * leave together as the next batch. Each caller awaits its own answer (an event id, or the
 * opened stream).
 *
 * One batch is in flight at a time, so the items of a stream reach cursorlog in the order
 * they were handed in. Every append and completion carries `expected_next_seq`, so a batch
 * retried after a transport failure is recognised by cursorlog (`duplicate`) instead of
 * written twice. An open is not idempotent (a retry would open a second stream), so a batch
 * that is retried first fails its opens with the transport error, as a failed unary
 * `OpenStream` call would, and retries the rest.
 */
import type * as grpc from '@grpc/grpc-js';
import { CursorlogError, CursorlogMcpError, leaderInMessage, type AppendResultMessage, type CursorlogClient } from './client.js';
import type { BatchItem, BatchResult, NewEvent, OpenStreamRequest, OpenStreamResponse } from './proto.js';

/** Limits of one `AppendBatch` call. */
export interface ProducerOptions {
  /** Most items per call (cursorlog's `batch_items_max` is 4096). */
  maxItems?: number;
  /** Most payload bytes per call, kept under the gRPC message limit (default 8 MiB). */
  maxBytes?: number;
  /** Attempts of a call that failed with UNAVAILABLE/DEADLINE_EXCEEDED (default 4). */
  attempts?: number;
  /** `AppendBatch` calls in flight at once (default 1: everything that arrives meanwhile waits and leaves as one batch). */
  maxInFlight?: number;
  /**
   * How appends travel: `batch` (default) coalesces them with completions into `AppendBatch`
   * calls; `stream` sends each at once on one long-lived pipelined `AppendStream` call (no
   * waiting for a batch in flight; completions still go through `AppendBatch`, each after
   * its stream's earlier appends were acknowledged).
   */
  appendVia?: 'batch' | 'stream';
}

/** An append or a completion handed in, awaiting its event id. */
interface PendingEvent {
  type: 'append' | 'complete';
  session: string;
  stream: string;
  seq: number;
  event: NewEvent;
  resolve: (id: string) => void;
  reject: (error: Error) => void;
}

/** A stream open handed in, awaiting the new stream. It belongs to no stream yet, so nothing waits for it. */
interface PendingOpen {
  type: 'open';
  request: OpenStreamRequest;
  resolve: (opened: OpenStreamResponse) => void;
  reject: (error: Error) => void;
}

type Pending = PendingEvent | PendingOpen;

/** Per cursorlog stream: the seq the next item will get, or the error that broke it. */
interface StreamCursor {
  nextSeq: number;
  broken?: Error;
}

/** Counters, for tests and the benchmark. */
export interface ProducerStats {
  /** `AppendBatch` calls (and `AppendStream` calls opened). */
  batches: number;
  /** Items sent (appends, completions and opens). */
  items: number;
  /** Events sent (appended events and terminal frames). */
  events: number;
  /** `open` items sent (streams opened through `AppendBatch`). */
  opens: number;
  /** `AppendBatch` calls retried after a transport failure. */
  retries: number;
}

export class Producer {
  private queue: Pending[] = [];
  private inFlight = 0;
  /** Streams with items in a batch in flight, and how many. */
  private readonly busy = new Map<string, number>();
  private readonly maxInFlight: number;
  private readonly streams = new Map<string, StreamCursor>();
  private readonly maxItems: number;
  private readonly maxBytes: number;
  private readonly attempts: number;
  private idleWaiters: (() => void)[] = [];
  private readonly appendVia: 'batch' | 'stream';
  private channel: grpc.ClientDuplexStream<unknown, AppendResultMessage> | undefined;
  /** Appends written to the `AppendStream` call, awaiting their answers (in order). */
  private streamed: PendingEvent[] = [];
  readonly stats: ProducerStats = { batches: 0, items: 0, events: 0, opens: 0, retries: 0 };

  constructor(
    private readonly client: CursorlogClient,
    options: ProducerOptions = {},
  ) {
    this.maxItems = Math.min(options.maxItems ?? 4096, 4096);
    this.maxBytes = options.maxBytes ?? 8 * 1024 * 1024;
    this.attempts = options.attempts ?? 4;
    this.maxInFlight = options.maxInFlight ?? 1;
    this.appendVia = options.appendVia ?? 'batch';
    if (!Number.isInteger(this.maxInFlight) || this.maxInFlight < 1) throw new RangeError(`maxInFlight must be a positive integer, got ${options.maxInFlight}`);
  }

  /** Registers a stream this process produces, whose next event gets `nextSeq` (1 for a new stream). */
  track(stream: string, nextSeq = 1): void {
    if (!this.streams.has(stream)) this.streams.set(stream, { nextSeq });
  }

  /** Forgets a stream (it is terminal, or its session ended here). */
  untrack(stream: string): void {
    this.streams.delete(stream);
  }

  /** Appends one event; resolves with its event id once durable. */
  append(session: string, stream: string, event: NewEvent): Promise<string> {
    return this.enqueue(session, stream, event, 'append');
  }

  /** Writes the stream's terminal frame; resolves with its event id once durable. */
  complete(session: string, stream: string, event: NewEvent): Promise<string> {
    return this.enqueue(session, stream, event, 'complete');
  }

  /**
   * Opens a stream as an `open` item of the next `AppendBatch` (handled by cursorlog exactly
   * like `OpenStream`); resolves with the new stream once durable, rejects with a
   * {@link CursorlogError} naming `OpenStream` when cursorlog refused it. The caller
   * `track`s the stream before appending to it: an append cannot name a stream before it
   * exists, so a stream's first append always leaves in a later batch than its open.
   */
  open(request: OpenStreamRequest): Promise<OpenStreamResponse> {
    return new Promise((resolve, reject) => {
      this.queue.push({ type: 'open', request, resolve, reject });
      this.pump();
    });
  }

  /** Resolves once nothing is queued or in flight. */
  idle(): Promise<void> {
    if (this.inFlight === 0 && this.queue.length === 0 && this.streamed.length === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private enqueue(session: string, stream: string, event: NewEvent, type: 'append' | 'complete'): Promise<string> {
    const cursor = this.streams.get(stream);
    if (cursor === undefined) {
      return Promise.reject(new CursorlogMcpError(`stream ${stream} of session ${session} is not open in this process`));
    }
    if (cursor.broken !== undefined) return Promise.reject(cursor.broken);
    const seq = cursor.nextSeq++;
    return new Promise((resolve, reject) => {
      this.queue.push({ type, session, stream, seq, event, resolve, reject });
      this.pump();
    });
  }

  /** Roughly the bytes an item adds to the request. */
  private static size(p: Pending): number {
    if (p.type === 'open') return p.request.session.length + (p.request.correlation?.length ?? 0) + 64;
    return p.event.payload.length + 64;
  }

  /**
   * The next batch: queued items in order, up to the limits, skipping every item of a stream
   * that has an item in a batch still in flight (so a stream's items never overtake each other).
   * Opens belong to no stream yet: only the limits hold them back.
   */
  private take(): Pending[] {
    let bytes = 0;
    const batch: Pending[] = [];
    const rest: Pending[] = [];
    const blocked = new Set<string>();
    for (const p of this.queue) {
      const size = Producer.size(p);
      const full = batch.length >= this.maxItems || (batch.length > 0 && bytes + size > this.maxBytes);
      if (p.type === 'open') {
        if (full) rest.push(p);
        else {
          bytes += size;
          batch.push(p);
        }
        continue;
      }
      if (full || blocked.has(p.stream) || this.busy.has(p.stream)) {
        blocked.add(p.stream);
        rest.push(p);
        continue;
      }
      bytes += size;
      batch.push(p);
    }
    this.queue = rest;
    return batch;
  }

  /** Starts batches while fewer than `maxInFlight` are in flight and something is sendable. */
  private pump(): void {
    if (this.appendVia === 'stream') this.streamAppends();
    while (this.inFlight < this.maxInFlight && this.queue.length > 0) {
      const batch = this.take();
      if (batch.length === 0) break;
      this.inFlight += 1;
      for (const p of batch) if (p.type !== 'open') this.markBusy(p.stream, 1);
      void this.send(batch).finally(() => {
        this.inFlight -= 1;
        for (const p of batch) if (p.type !== 'open') this.markBusy(p.stream, -1);
        this.pump();
        this.notifyIdle();
      });
    }
  }

  private notifyIdle(): void {
    if (this.inFlight === 0 && this.queue.length === 0 && this.streamed.length === 0) {
      const waiters = this.idleWaiters;
      this.idleWaiters = [];
      for (const w of waiters) w();
    }
  }

  private markBusy(stream: string, delta: number): void {
    const n = (this.busy.get(stream) ?? 0) + delta;
    if (n <= 0) this.busy.delete(stream);
    else this.busy.set(stream, n);
  }

  /** Writes every queued append that may go now to the `AppendStream` call; leaves completions and opens queued. */
  private streamAppends(): void {
    const rest: Pending[] = [];
    const blocked = new Set<string>();
    for (const p of this.queue) {
      if (p.type === 'open') {
        rest.push(p);
        continue;
      }
      if (p.type === 'complete' || blocked.has(p.stream)) {
        blocked.add(p.stream);
        rest.push(p);
        continue;
      }
      this.writeStreamed(p);
    }
    this.queue = rest;
  }

  private writeStreamed(p: PendingEvent): void {
    if (this.channel === undefined) this.channel = this.openChannel();
    this.markBusy(p.stream, 1);
    this.streamed.push(p);
    this.stats.events += 1;
    this.stats.items += 1;
    this.channel.write({ session: p.session, stream: p.stream, expectedNextSeq: String(p.seq), events: [p.event] });
  }

  private openChannel(): grpc.ClientDuplexStream<unknown, AppendResultMessage> {
    const call = this.client.appendStream();
    this.stats.batches += 1;
    call.on('data', (r: AppendResultMessage) => {
      const p = this.streamed.shift();
      if (p === undefined) return;
      this.markBusy(p.stream, -1);
      const id = r.appended?.eventIds?.[0];
      if (r.result === 'appended' && id !== undefined) p.resolve(id);
      else this.fail(p, new CursorlogError('AppendStream', r.failure?.code ?? 2, r.failure?.message ?? 'no result'));
      this.pump();
      this.notifyIdle();
    });
    const lost = (error: unknown): void => {
      if (this.channel !== call) return;
      this.channel = undefined;
      // Unanswered appends fail loudly (the SDK then does not send them).
      const pending = this.streamed;
      this.streamed = [];
      const e = error as Partial<grpc.ServiceError>;
      const failure = new CursorlogError('AppendStream', e.code ?? 14, e.details ?? String(error));
      for (const p of pending) {
        this.markBusy(p.stream, -1);
        this.fail(p, failure);
      }
      this.pump();
      this.notifyIdle();
    };
    call.on('error', lost);
    call.on('end', () => lost({ code: 14, details: 'AppendStream ended by the server' }));
    return call;
  }

  /** Ends the `AppendStream` call, if any (after the producer drained). */
  close(): void {
    const call = this.channel;
    this.channel = undefined;
    call?.end();
  }

  /**
   * Groups the batch into items: consecutive appends of one stream become one `Append`; each
   * open is an item of its own. `owners[i]` are the callers answered by item `i`.
   */
  private static items(batch: Pending[]): { items: BatchItem[]; owners: Pending[][] } {
    const items: BatchItem[] = [];
    const owners: Pending[][] = [];
    const openAppend = new Map<string, number>();
    for (const p of batch) {
      if (p.type === 'open') {
        items.push({ open: p.request });
        owners.push([p]);
        continue;
      }
      const at = openAppend.get(p.stream);
      if (p.type === 'append' && at !== undefined) {
        items[at]!.append!.events.push(p.event);
        owners[at]!.push(p);
        continue;
      }
      if (p.type === 'complete') {
        openAppend.delete(p.stream);
        items.push({ complete: { session: p.session, stream: p.stream, expectedNextSeq: String(p.seq), terminal: p.event } });
      } else {
        openAppend.set(p.stream, items.length);
        items.push({ append: { session: p.session, stream: p.stream, expectedNextSeq: String(p.seq), events: [p.event] } });
      }
      owners.push([p]);
    }
    return { items, owners };
  }

  private async send(batch: Pending[]): Promise<void> {
    let { items, owners } = Producer.items(batch);
    this.stats.batches += 1;
    this.stats.items += items.length;
    for (const p of batch) {
      if (p.type === 'open') this.stats.opens += 1;
      else this.stats.events += 1;
    }
    let results: BatchResult[] | undefined;
    let lastError: Error | undefined;
    const deadline = Date.now() + this.client.callDeadlineMs;
    for (let attempt = 1; attempt <= this.attempts; attempt += 1) {
      try {
        const response = await this.client.call('AppendBatch', { items });
        results = response.results ?? [];
      } catch (error) {
        lastError = error as Error;
        if (!(error instanceof CursorlogError) || !error.retryable || attempt === this.attempts) break;
        // The opens may have been applied before the transport failed; a retry would open
        // other streams. They fail now, as their unary call would have; the rest is retried.
        const keep = owners.map((group) => group[0]!.type !== 'open');
        owners.forEach((group, i) => {
          if (!keep[i]) this.fail(group[0]!, error);
        });
        items = items.filter((_, i) => keep[i]);
        owners = owners.filter((_, i) => keep[i]);
        if (items.length === 0) return;
        this.stats.retries += 1;
        await new Promise((r) => setTimeout(r, 50 * 2 ** attempt));
        continue;
      }
      if (results.length !== items.length) break;
      // A replicated cursorlog answers items it could not take on this member (not the
      // leader, or leadership lost before commit) with UNAVAILABLE failures inside the batch.
      const again = results.map((r, i) => Producer.resend(r, owners[i]![0]!));
      if (!again.some((x) => x) || Date.now() >= deadline) break;
      results.forEach((r, i) => {
        if (!again[i]) this.answer(owners[i]!, r);
      });
      const leader = leaderInMessage(results.find((r, i) => again[i] && r.failure?.message !== undefined)?.failure?.message);
      items = items.filter((_, i) => again[i]);
      owners = owners.filter((_, i) => again[i]);
      results = undefined;
      this.stats.retries += 1;
      attempt -= 1; // a leader change is not a transport failure; the deadline bounds it
      // The member that answered is the router's current one (a success makes it so).
      const wait = this.client.router.failed(this.client.router.current, leader);
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    }
    if (results === undefined || results.length !== items.length) {
      const error =
        lastError ??
        new CursorlogMcpError(`AppendBatch answered ${results?.length ?? 0} results for ${items.length} items`);
      for (const group of owners) for (const p of group) this.fail(p, error);
      return;
    }
    results.forEach((result, i) => this.answer(owners[i]!, result));
  }

  /**
   * Whether an item that failed inside a batch is sent again: an UNAVAILABLE failure of an
   * append or completion (they carry `expected_next_seq`: a resend of one that was applied is
   * a `duplicate`), or of an open that was refused because this member is not the leader
   * (nothing proposed). An open that may have been proposed fails (a resend could open a
   * second stream).
   */
  private static resend(result: BatchResult, first: Pending): boolean {
    if (result.result !== 'failure' || result.failure?.code !== 14 /* UNAVAILABLE */) return false;
    if (first.type !== 'open') return true;
    return /not the leader/.test(result.failure.message ?? '');
  }

  /** Hands one item's result to the callers it answers. */
  private answer(group: Pending[], result: BatchResult): void {
    const first = group[0]!;
    if (first.type === 'open') {
      if (result.result === 'opened' && result.opened?.stream !== undefined) first.resolve(result.opened);
      else this.fail(first, Producer.failure('OpenStream', 'opened', result));
    } else if (first.type === 'complete') {
      if (result.result === 'completed' && result.completed?.terminalEventId) {
        this.streams.delete(first.stream);
        first.resolve(result.completed.terminalEventId);
      } else this.fail(first, Producer.failure('Complete', 'completed', result));
    } else if (result.result === 'appended' && result.appended) {
      const ids = result.appended.eventIds ?? [];
      group.forEach((p, j) => {
        const id = ids[j];
        if (id === undefined) this.fail(p, new CursorlogMcpError(`AppendBatch returned ${ids.length} ids for ${group.length} events`));
        else (p as PendingEvent).resolve(id);
      });
    } else {
      const error = Producer.failure('Append', 'appended', result);
      for (const p of group) this.fail(p, error);
    }
  }

  /** The error of an item that did not get the result it expected: cursorlog's failure, as its unary RPC would have failed. */
  private static failure(rpc: string, expected: string, result: BatchResult): CursorlogError {
    const f = result.result === 'failure' ? result.failure : undefined;
    return new CursorlogError(rpc, f?.code ?? 2 /* UNKNOWN */, f?.message ?? `AppendBatch answered ${result.result ?? 'nothing'} where ${expected} was expected`);
  }

  private fail(p: Pending, error: Error): void {
    if (p.type === 'open') {
      p.reject(error);
      return;
    }
    const cursor = this.streams.get(p.stream);
    if (cursor !== undefined && cursor.broken === undefined) cursor.broken = error;
    p.reject(error);
  }
}
