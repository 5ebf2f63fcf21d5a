/**
 * Unary gRPC calls straight on `node:http2`, for plain-text connections (issue 31 item 3).
 *
 * grpc-js runs every unary call through a resolving call, a load-balancing call, a retrying
 * call, a subchannel call and a filter stack, each with its own objects, listeners and timers:
 * profiled under the tasks benchmark that was about 0.36 ms of Node CPU per call, most of the
 * TypeScript task store's cost. A unary call needs far less: one HTTP/2 stream with the gRPC
 * headers, the length-prefixed message, and the status from the trailers. This module does
 * exactly that on one HTTP/2 session per member, with the same message encoding (proto-loader's
 * serializers), the same deadline (`grpc-timeout` plus a local timer), and failures shaped as
 * grpc-js shapes them (`code`, `details`, `metadata`), so {@link CursorlogClient} routes and
 * retries them unchanged. The task calls' `TaskStream` (`task-stream.ts`) shares this session
 * ({@link H2UnaryChannel.openStream}); the other streaming calls (`Read`, `WatchTask`,
 * `AppendStream`) and TLS stay on grpc-js.
 */
import * as http2 from 'node:http2';
import * as grpc from '@grpc/grpc-js';

/** What a unary method needs: its path and proto-loader's (de)serializers. */
export interface UnaryMethod {
  path: string;
  requestSerialize: (value: unknown) => Buffer;
  responseDeserialize: (bytes: Buffer) => unknown;
}

/** A failed call, shaped as grpc-js's `ServiceError` (what {@link CursorlogClient} reads). */
export class H2CallError extends Error {
  constructor(
    readonly code: grpc.status,
    readonly details: string,
    readonly metadata: grpc.Metadata,
    /** True when the request never reached the server (no connection, or the stream was refused): resending is safe. */
    readonly unsent: boolean,
  ) {
    super(`${code} ${grpc.status[code] ?? ''}: ${details}`);
  }
}

const {
  HTTP2_HEADER_METHOD,
  HTTP2_HEADER_PATH,
  HTTP2_HEADER_SCHEME,
  HTTP2_HEADER_AUTHORITY,
  HTTP2_HEADER_CONTENT_TYPE,
  HTTP2_HEADER_TE,
  HTTP2_HEADER_STATUS,
  NGHTTP2_CANCEL,
  NGHTTP2_REFUSED_STREAM,
} = http2.constants;

/** Idle keepalive: a ping every this many ms while calls are in flight (grpc-js's `keepalive_time_ms` as this client sets it). */
const KEEPALIVE_MS = 30_000;
/** A ping unanswered this long closes the session (grpc-js's default `keepalive_timeout_ms`). */
const KEEPALIVE_TIMEOUT_MS = 20_000;

/** `grpc-message` is percent-encoded (gRPC over HTTP/2). */
export function decodeMessage(raw: unknown): string {
  if (typeof raw !== 'string') return '';
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

/** The response headers and trailers as grpc-js `Metadata` (pseudo-headers and transport headers left out). */
export function metadataOf(...sets: (http2.IncomingHttpHeaders | undefined)[]): grpc.Metadata {
  const md = new grpc.Metadata();
  for (const headers of sets) {
    if (headers === undefined) continue;
    for (const [key, value] of Object.entries(headers)) {
      if (key.startsWith(':') || key === 'content-type' || key === 'grpc-status' || key === 'grpc-message' || value === undefined) continue;
      const values = Array.isArray(value) ? value : [value];
      for (const v of values) {
        if (key.endsWith('-bin')) md.add(key, Buffer.from(String(v), 'base64'));
        else md.add(key, String(v));
      }
    }
  }
  return md;
}

/** One member's HTTP/2 session for unary calls, opened on first use and again after it closes. */
export class H2UnaryChannel {
  private session: http2.ClientHttp2Session | undefined;
  /** Whether {@link session} completed its connection (a failure before that means nothing was sent). */
  private connected = false;
  private active = 0;
  private keepalive: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly base: http2.OutgoingHttpHeaders;

  /**
   * @param address `host:port`
   * @param headers sent with every call (e.g. `authorization`)
   * @param maxReceiveBytes the largest response message accepted
   */
  constructor(
    private readonly address: string,
    headers: Record<string, string>,
    private readonly maxReceiveBytes: number,
  ) {
    this.base = {
      [HTTP2_HEADER_METHOD]: 'POST',
      [HTTP2_HEADER_SCHEME]: 'http',
      [HTTP2_HEADER_AUTHORITY]: address,
      [HTTP2_HEADER_CONTENT_TYPE]: 'application/grpc',
      [HTTP2_HEADER_TE]: 'trailers',
      ...headers,
    };
  }

  private open(): http2.ClientHttp2Session {
    const current = this.session;
    if (current !== undefined && !current.closed && !current.destroyed) return current;
    this.connected = false;
    const session = http2.connect(`http://${this.address}`, { settings: { enablePush: false } });
    session.on('connect', () => {
      if (this.session === session) this.connected = true;
    });
    // Failures reach the calls through their streams; without a listener they would be thrown.
    session.on('error', () => {});
    // A server going away accepts no new streams on this session: the next call opens another.
    session.on('goaway', () => {
      if (this.session === session) this.session = undefined;
    });
    session.on('close', () => {
      if (this.session === session) this.session = undefined;
    });
    // Like grpc-js: an idle channel does not keep the process alive.
    if (this.active === 0) session.unref();
    this.session = session;
    return session;
  }

  /** Keeps `session` (and the process) alive, with keepalive pings, until the matching {@link end}: one per call in flight. */
  begin(session: http2.ClientHttp2Session): void {
    if (this.active++ === 0) {
      session.ref();
      if (this.keepalive === undefined) {
        this.keepalive = setInterval(() => this.ping(), KEEPALIVE_MS);
        this.keepalive.unref();
      }
    }
  }

  /** A call on `session` ended (see {@link begin}). */
  end(session: http2.ClientHttp2Session): void {
    if (--this.active === 0) {
      if (!session.destroyed) session.unref();
      if (this.keepalive !== undefined) clearInterval(this.keepalive);
      this.keepalive = undefined;
    }
  }

  /** A keepalive ping; unanswered within {@link KEEPALIVE_TIMEOUT_MS}, the session is closed (its calls fail UNAVAILABLE). */
  private ping(): void {
    const session = this.session;
    if (session === undefined || !this.connected || this.active === 0) return;
    const timer = setTimeout(() => session.destroy(), KEEPALIVE_TIMEOUT_MS);
    timer.unref();
    try {
      session.ping((error) => {
        clearTimeout(timer);
        if (error) session.destroy();
      });
    } catch {
      clearTimeout(timer);
    }
  }

  /**
   * One unary call: resolves with the decoded response, or rejects with {@link H2CallError}
   * (the status the server sent, DEADLINE_EXCEEDED at `deadline` (epoch ms), CANCELLED when
   * the channel is closed, UNAVAILABLE when the connection fails).
   */
  call(method: UnaryMethod, request: unknown, deadline: number): Promise<unknown> {
    if (this.closed) return Promise.reject(new H2CallError(grpc.status.UNAVAILABLE, 'No connection established: the client is closed', new grpc.Metadata(), true));
    let body: Buffer;
    try {
      const message = method.requestSerialize(request);
      body = Buffer.allocUnsafe(5 + message.length);
      body[0] = 0;
      body.writeUInt32BE(message.length, 1);
      message.copy(body, 5);
    } catch (error) {
      return Promise.reject(new H2CallError(grpc.status.INTERNAL, `request serialization failed: ${String(error)}`, new grpc.Metadata(), true));
    }
    const timeout = Math.max(1, Math.ceil(deadline - Date.now()));
    const session = this.open();
    const sentBeforeConnect = !this.connected;
    return new Promise((resolve, reject) => {
      let stream: http2.ClientHttp2Stream;
      try {
        stream = session.request({ ...this.base, [HTTP2_HEADER_PATH]: method.path, 'grpc-timeout': `${timeout}m` }, { endStream: false });
      } catch (error) {
        if (this.session === session) this.session = undefined;
        reject(new H2CallError(grpc.status.UNAVAILABLE, `No connection established: ${String(error)}`, new grpc.Metadata(), true));
        return;
      }
      this.begin(session);
      let headers: http2.IncomingHttpHeaders | undefined;
      let chunks: Buffer[] = [];
      let received = 0;
      let done = false;
      const finish = (error: H2CallError | undefined, value?: unknown): void => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        this.end(session);
        if (error !== undefined) reject(error);
        else resolve(value);
      };
      const timer = setTimeout(() => {
        finish(new H2CallError(grpc.status.DEADLINE_EXCEEDED, 'Deadline exceeded', new grpc.Metadata(), false));
        stream.close(NGHTTP2_CANCEL);
      }, timeout);
      stream.on('response', (h) => {
        headers = h;
      });
      stream.on('data', (chunk: Buffer) => {
        received += chunk.length;
        if (received > this.maxReceiveBytes + 5) {
          finish(new H2CallError(grpc.status.RESOURCE_EXHAUSTED, `Received message larger than max (${received} vs ${this.maxReceiveBytes})`, new grpc.Metadata(), false));
          stream.close(NGHTTP2_CANCEL);
          return;
        }
        chunks.push(chunk);
      });
      const settle = (trailers: http2.IncomingHttpHeaders | undefined): void => {
        if (done) return;
        const httpStatus = headers?.[HTTP2_HEADER_STATUS];
        const statusHeader = trailers?.['grpc-status'] ?? headers?.['grpc-status'];
        if (statusHeader === undefined) {
          if (this.closed) {
            finish(new H2CallError(grpc.status.CANCELLED, 'Channel closed', new grpc.Metadata(), false));
          } else if (headers === undefined) {
            // The stream ended before any response: the connection went away mid-call (outcome unknown).
            finish(new H2CallError(grpc.status.UNAVAILABLE, 'Connection dropped before a response', new grpc.Metadata(), false));
          } else {
            // As grpc-js: an HTTP error without a gRPC status is UNAVAILABLE, a 200 without one UNKNOWN.
            const code = Number(httpStatus) !== 200 ? grpc.status.UNAVAILABLE : grpc.status.UNKNOWN;
            finish(new H2CallError(code, `Received HTTP status ${String(httpStatus)} without a grpc-status`, metadataOf(headers, trailers), false));
          }
          return;
        }
        const code = Number(statusHeader) as grpc.status;
        if (code !== grpc.status.OK) {
          finish(new H2CallError(code, decodeMessage(trailers?.['grpc-message'] ?? headers?.['grpc-message']), metadataOf(headers, trailers), false));
          return;
        }
        const all = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
        chunks = [];
        if (all.length < 5 || all[0] !== 0 || all.readUInt32BE(1) !== all.length - 5) {
          finish(new H2CallError(grpc.status.INTERNAL, `malformed or compressed response message (${all.length} bytes)`, metadataOf(headers, trailers), false));
          return;
        }
        let value: unknown;
        try {
          value = method.responseDeserialize(all.subarray(5));
        } catch (error) {
          finish(new H2CallError(grpc.status.INTERNAL, `response deserialization failed: ${String(error)}`, metadataOf(headers, trailers), false));
          return;
        }
        finish(undefined, value);
      };
      // Trailers arrive with the end of the stream; 'end' follows once every data chunk was read.
      let trailers: http2.IncomingHttpHeaders | undefined;
      stream.on('trailers', (t) => {
        trailers = t;
      });
      stream.on('end', () => settle(trailers));
      stream.on('error', (error: Error & { code?: string }) => {
        const unsent = (sentBeforeConnect && !this.connected) || stream.rstCode === NGHTTP2_REFUSED_STREAM;
        finish(new H2CallError(grpc.status.UNAVAILABLE, unsent ? `No connection established: ${error.message}` : `Connection dropped: ${error.message}`, new grpc.Metadata(), unsent));
      });
      stream.on('close', () => {
        if (done) return;
        const unsent = stream.rstCode === NGHTTP2_REFUSED_STREAM || (sentBeforeConnect && !this.connected);
        if (this.closed) finish(new H2CallError(grpc.status.CANCELLED, 'Channel closed', new grpc.Metadata(), false));
        else finish(new H2CallError(grpc.status.UNAVAILABLE, unsent ? 'No connection established: stream closed before it was sent' : `Stream closed (code ${stream.rstCode}) without a status`, new grpc.Metadata(), unsent));
      });
      stream.end(body);
    });
  }

  /** Whether this channel was closed. */
  get isClosed(): boolean {
    return this.closed;
  }

  /** Whether the session in use completed its connection (a stream failing before that sent nothing). */
  get isConnected(): boolean {
    return this.connected;
  }

  /**
   * Opens a long-lived gRPC call (`TaskStream`, see `task-stream.ts`) on this member's session:
   * the stream and its session, or throws when no stream can be opened (nothing was sent).
   */
  openStream(path: string): { session: http2.ClientHttp2Session; stream: http2.ClientHttp2Stream } {
    const session = this.open();
    try {
      const stream = session.request({ ...this.base, [HTTP2_HEADER_PATH]: path }, { endStream: false });
      return { session, stream };
    } catch (error) {
      if (this.session === session) this.session = undefined;
      throw error;
    }
  }

  /** Takes no new calls; calls in flight finish (as grpc-js's `close`), then the session closes. */
  close(): void {
    this.closed = true;
    if (this.keepalive !== undefined) clearInterval(this.keepalive);
    this.keepalive = undefined;
    this.session?.close();
    this.session = undefined;
  }
}
