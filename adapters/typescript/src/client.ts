/**
 * A small typed gRPC client for cursorlog: promise-returning unary calls with deadlines and
 * typed errors, and `Read` as an async iterator that can be cancelled.
 */
import * as grpc from '@grpc/grpc-js';
import { loadClientConstructor, loadTasksConstructor, TASK_RPCS, type AppendResponse, type PbGetTaskResponse, type ReadRequest, type ReadResponse, type Rpcs, type TaskRpcs } from './proto.js';

/** Every unary RPC this client calls: the event log's and the tasks service's. */
export type AllRpcs = Rpcs & TaskRpcs;
import { mayRetry, Router, type BackoffOptions, type RetryHint } from './router.js';
import { H2UnaryChannel, type UnaryMethod } from './h2-unary.js';
import { STREAM_CALLS, TaskStreamChannel, TaskStreamUnsupported, type StreamMethod } from './task-stream.js';

/** One answer of `AppendStream`. */
export interface AppendResultMessage {
  result: 'appended' | 'failure';
  appended?: AppendResponse;
  failure?: { code?: number; message?: string };
}

/** Base class of every error this package throws. */
export class CursorlogMcpError extends Error {
  override name = 'CursorlogMcpError';
}

/** A cursorlog RPC failed. `code` is the gRPC status code, `rpc` the method. */
export class CursorlogError extends CursorlogMcpError {
  override name = 'CursorlogError';
  constructor(
    readonly rpc: string,
    readonly code: grpc.status,
    readonly details: string,
  ) {
    super(`cursorlog ${rpc} failed: ${grpc.status[code] ?? code}: ${details}`);
  }

  /** UNAVAILABLE or DEADLINE_EXCEEDED: the server is unreachable or shutting down; a retry may succeed. */
  get retryable(): boolean {
    return this.code === grpc.status.UNAVAILABLE || this.code === grpc.status.DEADLINE_EXCEEDED;
  }
}

/** How to reach cursorlog. */
export interface ClientOptions extends BackoffOptions {
  /**
   * `host:port` of the cursorlog server, e.g. `127.0.0.1:50051`; for a replicated cursorlog the
   * members, comma-separated (`h1:7001,h2:7002,h3:7003`) or as an array. Calls go to the
   * leader: an `UNAVAILABLE` answer is followed to the member its `cursorlog-leader` header
   * names, or (no header) retried on the next address after a backoff, within `deadlineMs`.
   */
  address: string | readonly string[];
  /** Bearer token, when the server runs with `--auth-token`. */
  token?: string;
  /** Channel credentials (TLS); plain text when absent. */
  credentials?: grpc.ChannelCredentials;
  /** Deadline of every unary call, ms (default 10 000), retries on other members included. */
  deadlineMs?: number;
  /**
   * How unary calls travel: `'http2'` (the default without {@link credentials}) sends them
   * straight on `node:http2` (see `h2-unary.ts`: a fraction of grpc-js's CPU per call);
   * `'grpc-js'` (the default, and the only choice, with credentials) through grpc-js.
   * Streaming calls always use grpc-js.
   */
  unaryTransport?: 'http2' | 'grpc-js';
  /**
   * How task calls (`CreateTask`, `GetTask`, … every `Tasks` RPC but `WatchTask`) travel with
   * the `'http2'` unary transport: `'stream'` (the default) as messages of one long-lived
   * `TaskStream` call per member (see `task-stream.ts`: a fraction of a unary call's CPU on
   * both sides), falling back to unary calls on a server without it; `'unary'` one unary call
   * each. With the `'grpc-js'` transport they are always unary.
   */
  taskTransport?: 'stream' | 'unary';
}

/** The `cursorlog-leader` and `cursorlog-retry` headers of a failed call. */
function hints(error: Partial<grpc.ServiceError>): { leader: string | undefined; retry: RetryHint } {
  const md = error.metadata;
  const first = (key: string): string | undefined => {
    const v = md?.get(key)[0];
    return v === undefined ? undefined : String(v);
  };
  const retry = first('cursorlog-retry');
  if (retry === 'safe' || retry === 'outcome-unknown') return { leader: first('cursorlog-leader'), retry };
  // grpc-js fails a call this way when no connection is up: nothing was sent, resending is safe.
  const unsent = (error as { unsent?: boolean }).unsent === true || /^No connection established/.test(error.details ?? '');
  return { leader: first('cursorlog-leader'), retry: unsent ? 'safe' : undefined };
}

/** The leader named in a not-leader message ("… (the leader is at HOST:PORT) …"), as inside `AppendBatch` item failures. */
export function leaderInMessage(message: string | undefined): string | undefined {
  return /the leader is at ([^\s)]+)/.exec(message ?? '')?.[1];
}

type UnaryFn = (
  request: unknown,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (error: grpc.ServiceError | null, response: unknown) => void,
) => grpc.ClientUnaryCall;

/** The typed cursorlog client. One per process is enough: grpc-js multiplexes calls on one channel per member. */
export class CursorlogClient {
  /** Which member leads, as far as this client knows (see {@link Router}). */
  readonly router: Router;
  private readonly channels = new Map<string, grpc.Client>();
  /** Clients of the `Tasks` service, one per member (grpc-js shares the connection with {@link channels}). */
  private readonly taskChannels = new Map<string, grpc.Client>();
  /** Unary calls on `node:http2`, one session per member (`undefined`: unary calls use grpc-js). */
  private readonly h2: Map<string, H2UnaryChannel> | undefined;
  /** `TaskStream` calls, one channel per member (`undefined`: task calls are unary). */
  private readonly taskStreams: Map<string, TaskStreamChannel> | undefined;
  /** Headers of every `node:http2` call (the token's). */
  private readonly h2Headers: Record<string, string> = {};
  private readonly credentials: grpc.ChannelCredentials;
  private readonly metadata: grpc.Metadata;
  private readonly deadlineMs: number;
  private closed = false;
  /** One address configured: a plain UNAVAILABLE (no cursorlog headers) fails at once, as before clusters. */
  private readonly single: boolean;

  constructor(options: ClientOptions) {
    this.router = new Router(options.address, options);
    this.single = this.router.addresses.length === 1;
    this.credentials = options.credentials ?? grpc.credentials.createInsecure();
    this.metadata = new grpc.Metadata();
    if (options.token !== undefined) this.metadata.set('authorization', `Bearer ${options.token}`);
    this.deadlineMs = options.deadlineMs ?? 10_000;
    if (options.unaryTransport === 'http2' && options.credentials !== undefined) throw new RangeError("unaryTransport 'http2' is plain text only: leave it unset with credentials");
    this.h2 = (options.unaryTransport ?? (options.credentials === undefined ? 'http2' : 'grpc-js')) === 'http2' ? new Map() : undefined;
    this.taskStreams = this.h2 !== undefined && (options.taskTransport ?? 'stream') === 'stream' ? new Map() : undefined;
    if (options.token !== undefined) this.h2Headers['authorization'] = `Bearer ${options.token}`;
    this.channel(this.router.current);
  }

  /** The `node:http2` unary channel to one member. */
  private h2Channel(h2: Map<string, H2UnaryChannel>, address: string): H2UnaryChannel {
    let channel = h2.get(address);
    if (channel === undefined) {
      channel = new H2UnaryChannel(address, this.h2Headers, 64 * 1024 * 1024);
      h2.set(address, channel);
    }
    return channel;
  }

  /** The cached channel to one member. */
  private channel(address: string): grpc.Client {
    let client = this.channels.get(address);
    if (client === undefined) {
      const Ctor = loadClientConstructor();
      client = new Ctor(address, this.credentials, {
        'grpc.max_receive_message_length': 64 * 1024 * 1024,
        'grpc.keepalive_time_ms': 30_000,
        // Retries are this client's (leader-aware, idempotent only); grpc-js's own retry layer
        // and channelz bookkeeping only add CPU to every call.
        'grpc.enable_retries': 0,
        'grpc.enable_channelz': 0,
      });
      this.channels.set(address, client);
    }
    return client;
  }

  /** The cached `cursorlog.v1.Tasks` client of one member. */
  private taskChannel(address: string): grpc.Client {
    let client = this.taskChannels.get(address);
    if (client === undefined) {
      const Ctor = loadTasksConstructor();
      client = new Ctor(address, this.credentials, {
        'grpc.max_receive_message_length': 64 * 1024 * 1024,
        'grpc.keepalive_time_ms': 30_000,
        'grpc.enable_retries': 0,
        'grpc.enable_channelz': 0,
      });
      this.taskChannels.set(address, client);
    }
    return client;
  }

  /**
   * Calls a unary RPC on the leader; rejects with {@link CursorlogError}. An `UNAVAILABLE`
   * answer is retried on the member it names (or the next one, after a backoff) while the
   * deadline lasts, when resending is safe: `cursorlog-retry: safe`, or an idempotent call
   * ({@link isIdempotent}: reads, `OpenSession`, `KeepAlive`, appends and completions with
   * `expected_next_seq`).
   */
  async call<K extends keyof AllRpcs>(rpc: K, request: AllRpcs[K][0]): Promise<AllRpcs[K][1]> {
    const deadline = Date.now() + this.deadlineMs;
    for (;;) {
      const address = this.router.current;
      try {
        const response = await this.once(address, rpc, request, deadline);
        this.router.succeeded(address);
        return response;
      } catch (error) {
        const e = error as Partial<grpc.ServiceError>;
        const code = e.code ?? grpc.status.UNKNOWN;
        const failure = new CursorlogError(rpc, code, e.details ?? String(error));
        if (code !== grpc.status.UNAVAILABLE) throw failure;
        const { leader, retry } = hints(e);
        if (!this.reroutes(leader, retry) || !mayRetry(rpc, request, retry)) throw failure;
        const wait = this.router.failed(address, leader);
        if (Date.now() + wait >= deadline) throw failure;
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      }
    }
  }

  private once<K extends keyof AllRpcs>(address: string, rpc: K, request: AllRpcs[K][0], deadline: number): Promise<AllRpcs[K][1]> {
    if (this.h2 !== undefined && this.taskStreams !== undefined && STREAM_CALLS.has(rpc)) {
      const stream = this.taskStream(this.h2, this.taskStreams, address);
      if (stream !== undefined && !stream.unsupported) {
        return stream.call(rpc, request, deadline).catch((error: unknown) => {
          // The member has no TaskStream: nothing was handled; this call (and every later one) goes unary.
          if (error instanceof TaskStreamUnsupported) return this.unary(address, rpc, request, deadline);
          throw error;
        }) as Promise<AllRpcs[K][1]>;
      }
    }
    return this.unary(address, rpc, request, deadline);
  }

  /** The `TaskStream` channel to one member, or `undefined` when the proto has no `TaskStream`. */
  private taskStream(h2: Map<string, H2UnaryChannel>, streams: Map<string, TaskStreamChannel>, address: string): TaskStreamChannel | undefined {
    let channel = streams.get(address);
    if (channel === undefined) {
      const definition = (this.taskChannel(address).constructor as unknown as { service?: Record<string, StreamMethod> }).service?.['TaskStream'];
      if (definition === undefined) return undefined;
      channel = new TaskStreamChannel(this.h2Channel(h2, address), definition, 64 * 1024 * 1024);
      streams.set(address, channel);
    }
    return channel;
  }

  private unary<K extends keyof AllRpcs>(address: string, rpc: K, request: AllRpcs[K][0], deadline: number): Promise<AllRpcs[K][1]> {
    const client = TASK_RPCS.has(rpc) ? this.taskChannel(address) : this.channel(address);
    if (this.h2 !== undefined) {
      const definition = (client.constructor as unknown as { service?: Record<string, UnaryMethod> }).service?.[rpc];
      if (definition === undefined) return Promise.reject(new CursorlogMcpError(`cursorlog has no RPC ${rpc}`));
      return this.h2Channel(this.h2, address).call(definition, request, deadline) as Promise<AllRpcs[K][1]>;
    }
    const method = (client as unknown as Record<string, UnaryFn>)[rpc];
    if (method === undefined) return Promise.reject(new CursorlogMcpError(`cursorlog has no RPC ${rpc}`));
    return new Promise((resolve, reject) => {
      method.call(client, request, this.metadata, { deadline }, (error, response) => {
        if (error) reject(error);
        else resolve(response as AllRpcs[K][1]);
      });
    });
  }

  /**
   * Opens a `Read` call on the leader. Iterate it; `cancel()` ends it (the iterator then
   * finishes quietly). When the call fails with `UNAVAILABLE` (a follower, or the leader
   * died mid-stream) it is re-opened on the leader from the last event it delivered
   * (`last_event_id` = that event's id), and the new resolution is not delivered again, so
   * the iterator yields every event exactly once across leader changes, within the deadline
   * of a unary call per outage.
   */
  read(request: ReadRequest): ReadCall {
    return new ReadCall(this, request);
  }

  /** Starts one `Read` call on the member believed to lead (used by {@link ReadCall}). */
  openRead(request: ReadRequest): { address: string; stream: grpc.ClientReadableStream<ReadResponse> } {
    const address = this.router.current;
    const client = this.channel(address);
    const method = (client as unknown as Record<string, (r: unknown, m: grpc.Metadata) => grpc.ClientReadableStream<ReadResponse>>)['Read'];
    if (method === undefined) throw new CursorlogMcpError('cursorlog has no RPC Read');
    return { address, stream: method.call(client, request, this.metadata) };
  }

  /**
   * Starts one `WatchTask` call (server streaming: the task now, then after each change) on
   * the member believed to lead. Not re-routed: a caller that sees it fail with `UNAVAILABLE`
   * reports it with {@link failedOn} and watches again from the last version it received (a
   * state watch loses nothing).
   */
  openWatchTask(request: { owner: string; taskId: string; afterVersion?: string }): { address: string; stream: grpc.ClientReadableStream<PbGetTaskResponse> } {
    const address = this.router.current;
    const client = this.taskChannel(address);
    const method = (client as unknown as Record<string, (r: unknown, m: grpc.Metadata) => grpc.ClientReadableStream<PbGetTaskResponse>>)['WatchTask'];
    if (method === undefined) throw new CursorlogMcpError('cursorlog has no RPC WatchTask');
    return { address, stream: method.call(client, request, this.metadata) };
  }

  /**
   * A streaming call to `address` failed: how long to wait (ms) before opening it again, or
   * `undefined` when it is not worth another attempt (not `UNAVAILABLE`, one member and no
   * leader hint, or this client is closed). Moves {@link router} as a unary call would.
   */
  failedOn(address: string, error: unknown): number | undefined {
    const e = error as Partial<grpc.ServiceError>;
    if (e.code !== grpc.status.UNAVAILABLE) return undefined;
    const { leader, retry } = hints(e);
    if (!this.reroutes(leader, retry)) return undefined;
    return this.router.failed(address, leader);
  }

  /** Whether an UNAVAILABLE with these headers is worth another attempt (see {@link single}). */
  reroutes(leader: string | undefined, retry: RetryHint): boolean {
    return !this.closed && (!this.single || leader !== undefined || retry !== undefined);
  }

  /** Deadline of a unary call (and of one outage a `Read` rides out), ms. */
  get callDeadlineMs(): number {
    return this.deadlineMs;
  }

  /**
   * Opens an `AppendStream` call (bidirectional: `AppendRequest`s in, `AppendResult`s out, in
   * order) on the member believed to lead. It is not re-routed: when it breaks, its
   * unanswered appends fail and the next call opens on the then-current leader.
   */
  appendStream(): grpc.ClientDuplexStream<unknown, AppendResultMessage> {
    const client = this.channel(this.router.current);
    const method = (client as unknown as Record<string, (m: grpc.Metadata) => grpc.ClientDuplexStream<unknown, AppendResultMessage>>)['AppendStream'];
    if (method === undefined) throw new CursorlogMcpError('cursorlog has no RPC AppendStream');
    return method.call(client, this.metadata);
  }

  /** Closes every channel: new calls fail; unary calls in flight finish, as grpc-js lets them. */
  close(): void {
    this.closed = true;
    for (const client of this.channels.values()) client.close();
    for (const client of this.taskChannels.values()) client.close();
    for (const stream of this.taskStreams?.values() ?? []) stream.close();
    this.taskStreams?.clear();
    for (const channel of this.h2?.values() ?? []) channel.close();
    this.h2?.clear();
    this.channels.clear();
    this.taskChannels.clear();
  }
}

/** A running `Read` call, re-opened on the new leader when the old one fails (see {@link CursorlogClient.read}). */
export class ReadCall implements AsyncIterable<ReadResponse> {
  private cancelled = false;
  private stream: grpc.ClientReadableStream<ReadResponse> | undefined;
  /** The id of the last event delivered, if any: where a re-opened call resumes. */
  private lastId: string | undefined;
  private resolved = false;
  /** Times the call was re-opened after a failure (tests). */
  reopened = 0;

  constructor(
    private readonly client: CursorlogClient,
    private readonly request: ReadRequest,
  ) {}

  /** Ends the call; a pending iteration finishes without error. */
  cancel(): void {
    this.cancelled = true;
    this.stream?.cancel();
  }

  get isCancelled(): boolean {
    return this.cancelled;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<ReadResponse> {
    let outage: number | undefined;
    for (;;) {
      if (this.cancelled) return;
      const request = this.lastId === undefined ? this.request : { ...this.request, lastEventId: this.lastId };
      const { address, stream } = this.client.openRead(request);
      this.stream = stream;
      // An error after cancel() is expected; without a listener it would be thrown.
      stream.on('error', () => {});
      let first = true;
      try {
        for await (const message of stream as AsyncIterable<ReadResponse>) {
          outage = undefined;
          this.client.router.succeeded(address);
          if (first) {
            first = false;
            if (this.resolved) {
              // A re-opened call: its resolution is of our own last event; the reader has the first.
              const verdict = message.resolution?.verdict;
              if (message.item === 'resolution' && (verdict === 'RESUMABLE' || verdict === 'STREAM_TERMINATED')) continue;
              throw new CursorlogError('Read', grpc.status.ABORTED, `re-opened Read after a leader change answered ${verdict ?? message.item}`);
            }
            this.resolved = true;
          }
          if (message.item === 'events') {
            const last = message.events?.events?.at(-1);
            if (last !== undefined) this.lastId = last.id;
          }
          yield message;
        }
        return;
      } catch (error) {
        if (this.cancelled) return;
        if (error instanceof CursorlogError) throw error;
        const e = error as Partial<grpc.ServiceError>;
        const code = e.code ?? grpc.status.UNKNOWN;
        const failure = new CursorlogError('Read', code, e.details ?? String(error));
        // Re-opened from the last delivered event (or the request's own cursor): a Read is a read.
        const { leader, retry } = hints(e);
        if (code !== grpc.status.UNAVAILABLE || !this.client.reroutes(leader, retry)) throw failure;
        const now = Date.now();
        outage ??= now + this.client.callDeadlineMs;
        const wait = this.client.router.failed(address, leader);
        if (now + wait >= outage) throw failure;
        this.reopened += 1;
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      }
    }
  }
}
