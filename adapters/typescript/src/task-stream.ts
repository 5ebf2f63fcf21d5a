/**
 * Task calls over one `TaskStream` call per member (issue 31 item 3; tasks.proto
 * `TaskStream`), on the member's `node:http2` session (plain text).
 *
 * A unary call opens an HTTP/2 stream, sends headers, reads headers and trailers: in Node about
 * 70 µs of CPU in `node:http2` alone, and on the server 50–60% of its instructions per task
 * call. On one long-lived `TaskStream` a call is one length-prefixed message each way: each
 * request carries an id, the server answers it with the same id once the call completes (writes
 * once durable), and many calls are in flight at once.
 *
 * Failures are shaped as the unary path's ({@link H2CallError}: `code`, `details`, `metadata`
 * with the `cursorlog-leader` / `cursorlog-retry` hints), so {@link CursorlogClient.call}
 * routes and retries them unchanged:
 * - a failed call's answer carries its unary status and hints;
 * - when the stream ends, its unanswered calls fail with the stream's status: on a member that
 *   does not lead, UNAVAILABLE with the leader and `cursorlog-retry: safe` (the server answered
 *   every call it read); on shutdown or a dropped connection UNAVAILABLE without hints (the
 *   outcome is unknown, as for a unary call cut off);
 * - a server without the RPC (UNIMPLEMENTED) fails them with {@link TaskStreamUnsupported}
 *   (nothing was handled), and the client sends them, and every later call to that member,
 *   unary.
 */
import type * as http2 from 'node:http2';
import { constants } from 'node:http2';
import * as grpc from '@grpc/grpc-js';
import { decodeMessage, H2CallError, metadataOf, type H2UnaryChannel } from './h2-unary.js';

/** The `Tasks` RPCs a `TaskStream` carries, each with its field of the request's `call` and the response's `result` oneof. */
export const STREAM_CALLS: ReadonlyMap<string, string> = new Map([
  ['CreateTask', 'createTask'],
  ['GetTask', 'getTask'],
  ['ListTasks', 'listTasks'],
  ['UpdateTask', 'updateTask'],
  ['RequestInput', 'requestInput'],
  ['AnswerInput', 'answerInput'],
  ['CancelTask', 'cancelTask'],
  ['FinishTask', 'finishTask'],
  ['DeleteTask', 'deleteTask'],
  ['KeepAliveTask', 'keepAliveTask'],
  ['EnqueueTaskMessage', 'enqueueTaskMessage'],
  ['DequeueTaskMessages', 'dequeueTaskMessages'],
  ['RouteTaskMessage', 'routeTaskMessage'],
]);

/** What the `TaskStream` method needs: its path and proto-loader's (de)serializers. */
export interface StreamMethod {
  path: string;
  requestSerialize: (value: unknown) => Buffer;
  responseDeserialize: (bytes: Buffer) => unknown;
}

/** The member does not implement `TaskStream` (UNIMPLEMENTED): the call was not handled; send it unary. */
export class TaskStreamUnsupported extends Error {
  override name = 'TaskStreamUnsupported';
}

/** A call waiting for its answer. */
interface Pending {
  field: string;
  resolve: (value: unknown) => void;
  reject: (error: Error) => void;
  timer: NodeJS.Timeout;
}

/** One open `TaskStream` call. */
interface Open {
  session: http2.ClientHttp2Session;
  stream: http2.ClientHttp2Stream;
  pending: Map<number, Pending>;
  /** Opened before the session connected: a failure before it connects sent nothing. */
  sentBeforeConnect: boolean;
  headers: http2.IncomingHttpHeaders | undefined;
  trailers: http2.IncomingHttpHeaders | undefined;
  /** Received bytes of an incomplete message. */
  buffer: Buffer | undefined;
  done: boolean;
}

/** The decoded `TaskStreamResponse` (proto-loader, `oneofs: true`: `result` names the field set). */
interface Answer {
  id?: string;
  result?: string;
  failure?: { code?: number; message?: string; leader?: string; retry?: string };
  [field: string]: unknown;
}

/** `TaskStream` calls to one member: one stream at a time, opened on first use and again after it ends. */
export class TaskStreamChannel {
  /** The member answered UNIMPLEMENTED: every call goes unary. */
  unsupported = false;
  private current: Open | undefined;
  private nextId = 1;

  constructor(
    private readonly h2: H2UnaryChannel,
    private readonly method: StreamMethod,
    private readonly maxReceiveBytes: number,
  ) {}

  /**
   * One call (`rpc`, a key of {@link STREAM_CALLS}): resolves with its unary response, or
   * rejects with {@link H2CallError} (as the unary path does) or {@link TaskStreamUnsupported}.
   */
  call(rpc: string, request: unknown, deadline: number): Promise<unknown> {
    if (this.unsupported) return Promise.reject(new TaskStreamUnsupported(rpc));
    const field = STREAM_CALLS.get(rpc);
    if (field === undefined) return Promise.reject(new H2CallError(grpc.status.INTERNAL, `${rpc} is not a TaskStream call`, new grpc.Metadata(), true));
    if (this.h2.isClosed) return Promise.reject(new H2CallError(grpc.status.UNAVAILABLE, 'No connection established: the client is closed', new grpc.Metadata(), true));
    const id = this.nextId++;
    let frame: Buffer;
    try {
      const message = this.method.requestSerialize({ id, [field]: request });
      frame = Buffer.allocUnsafe(5 + message.length);
      frame[0] = 0;
      frame.writeUInt32BE(message.length, 1);
      message.copy(frame, 5);
    } catch (error) {
      return Promise.reject(new H2CallError(grpc.status.INTERNAL, `request serialization failed: ${String(error)}`, new grpc.Metadata(), true));
    }
    let open: Open;
    try {
      open = this.current ?? this.open();
    } catch (error) {
      return Promise.reject(new H2CallError(grpc.status.UNAVAILABLE, `No connection established: ${String(error)}`, new grpc.Metadata(), true));
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => {
          if (!open.pending.delete(id)) return;
          this.h2.end(open.session);
          // The server still completes the call; its answer is dropped.
          reject(new H2CallError(grpc.status.DEADLINE_EXCEEDED, 'Deadline exceeded', new grpc.Metadata(), false));
        },
        Math.max(1, Math.ceil(deadline - Date.now())),
      );
      open.pending.set(id, { field, resolve, reject, timer });
      this.h2.begin(open.session);
      open.stream.write(frame);
    });
  }

  /** Ends the stream's sending side: the server answers the calls in flight, then ends it. */
  close(): void {
    const open = this.current;
    this.current = undefined;
    if (open !== undefined && !open.done) open.stream.end();
  }

  private open(): Open {
    const { session, stream } = this.h2.openStream(this.method.path);
    const o: Open = {
      session,
      stream,
      pending: new Map(),
      sentBeforeConnect: !this.h2.isConnected,
      headers: undefined,
      trailers: undefined,
      buffer: undefined,
      done: false,
    };
    this.current = o;
    stream.on('response', (h) => {
      o.headers = h;
    });
    stream.on('data', (chunk: Buffer) => this.receive(o, chunk));
    stream.on('trailers', (t) => {
      o.trailers = t;
    });
    stream.on('end', () => this.settle(o));
    stream.on('error', (error: Error) => {
      const unsent = this.unsent(o);
      this.fail(o, () => new H2CallError(grpc.status.UNAVAILABLE, unsent ? `No connection established: ${error.message}` : `Connection dropped: ${error.message}`, new grpc.Metadata(), unsent));
    });
    stream.on('close', () => {
      if (o.done) return;
      const unsent = this.unsent(o);
      if (this.h2.isClosed) this.fail(o, () => new H2CallError(grpc.status.CANCELLED, 'Channel closed', new grpc.Metadata(), false));
      else this.fail(o, () => new H2CallError(grpc.status.UNAVAILABLE, unsent ? 'No connection established: stream closed before it was sent' : `Stream closed (code ${stream.rstCode}) without a status`, new grpc.Metadata(), unsent));
    });
    return o;
  }

  private unsent(o: Open): boolean {
    return (o.sentBeforeConnect && !this.h2.isConnected) || o.stream.rstCode === constants.NGHTTP2_REFUSED_STREAM;
  }

  /** Splits received bytes into messages and answers their calls. */
  private receive(o: Open, chunk: Buffer): void {
    if (o.done) return;
    let buffer = o.buffer === undefined ? chunk : Buffer.concat([o.buffer, chunk]);
    while (buffer.length >= 5) {
      const length = buffer.readUInt32BE(1);
      if (buffer[0] !== 0 || length > this.maxReceiveBytes) {
        const why = buffer[0] !== 0 ? 'a compressed answer (never asked for)' : `an answer larger than max (${length} vs ${this.maxReceiveBytes})`;
        this.fail(o, () => new H2CallError(grpc.status.INTERNAL, `TaskStream received ${why}`, new grpc.Metadata(), false));
        o.stream.close(constants.NGHTTP2_CANCEL);
        return;
      }
      if (buffer.length < 5 + length) break;
      this.answer(o, buffer.subarray(5, 5 + length));
      buffer = buffer.subarray(5 + length);
    }
    o.buffer = buffer.length > 0 ? buffer : undefined;
  }

  private answer(o: Open, bytes: Buffer): void {
    let answer: Answer;
    try {
      answer = this.method.responseDeserialize(bytes) as Answer;
    } catch (error) {
      this.fail(o, () => new H2CallError(grpc.status.INTERNAL, `TaskStream answer deserialization failed: ${String(error)}`, new grpc.Metadata(), false));
      o.stream.close(constants.NGHTTP2_CANCEL);
      return;
    }
    const id = Number(answer.id ?? 0);
    const call = o.pending.get(id);
    // Not pending: its deadline passed.
    if (call === undefined) return;
    o.pending.delete(id);
    clearTimeout(call.timer);
    this.h2.end(o.session);
    if (answer.result === 'failure') {
      const f = answer.failure ?? {};
      const md = new grpc.Metadata();
      if (f.leader !== undefined) md.set('cursorlog-leader', f.leader);
      if (f.retry !== undefined) md.set('cursorlog-retry', f.retry);
      call.reject(new H2CallError((f.code ?? grpc.status.UNKNOWN) as grpc.status, f.message ?? '', md, false));
    } else if (answer.result === call.field) {
      call.resolve(answer[call.field] ?? {});
    } else {
      call.reject(new H2CallError(grpc.status.INTERNAL, `TaskStream answered ${call.field} with ${String(answer.result)}`, new grpc.Metadata(), false));
    }
  }

  /** The stream ended: its unanswered calls fail with its status. */
  private settle(o: Open): void {
    if (o.done) return;
    const status = o.trailers?.['grpc-status'] ?? o.headers?.['grpc-status'];
    if (status === undefined) {
      const unsent = this.unsent(o);
      this.fail(o, () => new H2CallError(grpc.status.UNAVAILABLE, 'TaskStream ended without a status', metadataOf(o.headers, o.trailers), unsent));
      return;
    }
    const code = Number(status) as grpc.status;
    if (code === grpc.status.UNIMPLEMENTED) {
      this.unsupported = true;
      this.fail(o, () => new TaskStreamUnsupported('TaskStream'));
      return;
    }
    const details = decodeMessage(o.trailers?.['grpc-message'] ?? o.headers?.['grpc-message']);
    const md = metadataOf(o.headers, o.trailers);
    // An OK end with calls unanswered is the server's bug: their outcome is unknown.
    const failed = code === grpc.status.OK ? grpc.status.INTERNAL : code;
    this.fail(o, () => new H2CallError(failed, code === grpc.status.OK ? 'TaskStream ended OK with calls unanswered' : details, md, false));
  }

  /** Ends `o` (the next call opens another stream) and fails every call waiting on it. */
  private fail(o: Open, error: () => Error): void {
    o.done = true;
    o.buffer = undefined;
    if (this.current === o) this.current = undefined;
    // Our sending side may still be open (the server ended the call): close the stream, or the session would wait for it.
    if (!o.stream.closed) o.stream.close(constants.NGHTTP2_CANCEL);
    const pending = [...o.pending.values()];
    o.pending.clear();
    for (const call of pending) {
      clearTimeout(call.timer);
      this.h2.end(o.session);
      call.reject(error());
    }
  }
}
