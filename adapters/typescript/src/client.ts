/**
 * A small typed gRPC client for cursorlog: promise-returning unary calls with deadlines and
 * typed errors, and `Read` as an async iterator that can be cancelled.
 */
import * as grpc from '@grpc/grpc-js';
import { loadClientConstructor, type AppendResponse, type ReadRequest, type ReadResponse, type Rpcs } from './proto.js';

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
export interface ClientOptions {
  /** `host:port` of the cursorlog server, e.g. `127.0.0.1:50051`. */
  address: string;
  /** Bearer token, when the server runs with `--auth-token`. */
  token?: string;
  /** Channel credentials (TLS); plain text when absent. */
  credentials?: grpc.ChannelCredentials;
  /** Deadline of every unary call, ms (default 10 000). */
  deadlineMs?: number;
}

type UnaryFn = (
  request: unknown,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (error: grpc.ServiceError | null, response: unknown) => void,
) => grpc.ClientUnaryCall;

/** The typed cursorlog client. One per process is enough: grpc-js multiplexes calls on one channel. */
export class CursorlogClient {
  private readonly client: grpc.Client;
  private readonly metadata: grpc.Metadata;
  private readonly deadlineMs: number;

  constructor(options: ClientOptions) {
    const Ctor = loadClientConstructor();
    this.client = new Ctor(options.address, options.credentials ?? grpc.credentials.createInsecure(), {
      'grpc.max_receive_message_length': 64 * 1024 * 1024,
      'grpc.keepalive_time_ms': 30_000,
      // The producer retries AppendBatch itself (idempotently, with expected_next_seq); grpc-js's
      // own retry layer and channelz bookkeeping only add CPU to every call.
      'grpc.enable_retries': 0,
      'grpc.enable_channelz': 0,
    });
    this.metadata = new grpc.Metadata();
    if (options.token !== undefined) this.metadata.set('authorization', `Bearer ${options.token}`);
    this.deadlineMs = options.deadlineMs ?? 10_000;
  }

  /** Calls a unary RPC; rejects with {@link CursorlogError}. */
  call<K extends keyof Rpcs>(rpc: K, request: Rpcs[K][0]): Promise<Rpcs[K][1]> {
    const method = (this.client as unknown as Record<string, UnaryFn>)[rpc];
    if (method === undefined) return Promise.reject(new CursorlogMcpError(`cursorlog has no RPC ${rpc}`));
    return new Promise((resolve, reject) => {
      method.call(
        this.client,
        request,
        this.metadata,
        { deadline: Date.now() + this.deadlineMs },
        (error, response) => {
          if (error) reject(new CursorlogError(rpc, error.code, error.details));
          else resolve(response as Rpcs[K][1]);
        },
      );
    });
  }

  /** Opens a `Read` call. Iterate it; `cancel()` ends it (the iterator then finishes quietly). */
  read(request: ReadRequest): ReadCall {
    const method = (this.client as unknown as Record<string, (r: unknown, m: grpc.Metadata) => grpc.ClientReadableStream<ReadResponse>>)['Read'];
    if (method === undefined) throw new CursorlogMcpError('cursorlog has no RPC Read');
    return new ReadCall(method.call(this.client, request, this.metadata));
  }

  /** Opens an `AppendStream` call (bidirectional: `AppendRequest`s in, `AppendResult`s out, in order). */
  appendStream(): grpc.ClientDuplexStream<unknown, AppendResultMessage> {
    const method = (this.client as unknown as Record<string, (m: grpc.Metadata) => grpc.ClientDuplexStream<unknown, AppendResultMessage>>)['AppendStream'];
    if (method === undefined) throw new CursorlogMcpError('cursorlog has no RPC AppendStream');
    return method.call(this.client, this.metadata);
  }

  /** Closes the channel; calls in flight fail. */
  close(): void {
    this.client.close();
  }
}

/** A running `Read` call. */
export class ReadCall implements AsyncIterable<ReadResponse> {
  private cancelled = false;
  constructor(private readonly stream: grpc.ClientReadableStream<ReadResponse>) {
    // An error after cancel() is expected; without a listener it would be thrown.
    stream.on('error', () => {});
  }

  /** Ends the call; a pending iteration finishes without error. */
  cancel(): void {
    this.cancelled = true;
    this.stream.cancel();
  }

  get isCancelled(): boolean {
    return this.cancelled;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<ReadResponse> {
    try {
      for await (const message of this.stream as AsyncIterable<ReadResponse>) {
        yield message;
      }
    } catch (error) {
      if (this.cancelled) return;
      const e = error as Partial<grpc.ServiceError>;
      throw new CursorlogError('Read', e.code ?? grpc.status.UNKNOWN, e.details ?? String(error));
    }
  }
}
