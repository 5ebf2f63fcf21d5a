/**
 * `SessionEventStore`: the SDK's `EventStore` for ONE MCP session, over cursorlog.
 *
 * The SDK never tells a store which session it serves, and its stream ids collide across
 * sessions (`_GET_stream`, and the same ids in every process), so each session's transport
 * gets its own store, bound to the real `Mcp-Session-Id` and naming it in every cursorlog
 * call. Each SDK stream this process produces maps to its own cursorlog stream (opened at the
 * priming event, `correlation` = the request id, with a producer lease, as an `open` item of
 * the producer's coalesced `AppendBatch`). Event ids are cursorlog cursors
 * `{epoch}-{stream}-{seq}`; a priming event's id is the stream's start cursor
 * `{epoch}-{stream}-0` (nothing is written for it).
 */
import type { EventStore, EventId, StreamId } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { CursorlogError, CursorlogMcpError } from './client.js';
import type { Core } from './core.js';
import type { OpenStreamRequest, OpenStreamResponse, Rpcs } from './proto.js';
import { ANSWERED_SUFFIX } from './resume.js';
import { Resumer } from './replay.js';
import { checkTransport, requestIdsOfStream, type TransportInternals } from './sdk-internals.js';

/** A stream this process produces in this session. */
export interface LocalStream {
  readonly sdkId: string;
  /** The cursorlog stream id. */
  stream: string;
  correlation: string | undefined;
  /** Not yet terminal (no response stored, not aborted). */
  open: boolean;
  /** Resumes of this stream replaying right now (see `Resumer.replayLocal`). */
  resumesInProgress: number;
  /** Events stored while a resume replays: delivered by that resume (with their seq). */
  pending: { seq: number; id: string; message: JSONRPCMessage }[];
  /** When an append or keep-alive last renewed its lease (ms). */
  renewedAt: number;
}

const CURSOR = /^(\d{1,20})-(\d{1,20})-(\d{1,20})$/;

/** `{epoch, stream, seq}` of a cursor text, or undefined when it is not one. */
export function parseCursor(id: string): { epoch: string; stream: string; seq: number } | undefined {
  const m = CURSOR.exec(id);
  if (m === null) return undefined;
  return { epoch: m[1]!, stream: m[2]!, seq: Number(m[3]!) };
}

/** The event kind recorded for a message: request, notification, result or error. */
export function kindOf(message: JSONRPCMessage): string {
  if ('method' in message) return 'id' in message ? 'request' : 'notification';
  return 'error' in message ? 'error' : 'result';
}

/** The EventStore of one MCP session. Create it with `Cursorlog.bindSession`. */
export class SessionEventStore implements EventStore {
  private transport: TransportInternals | undefined;
  private readonly local = new Map<string, LocalStream>();
  private readonly byStream = new Map<string, LocalStream>();
  private readonly opening = new Map<string, Promise<LocalStream>>();
  private restoringIds = 0;
  /** True while a restored session's synthetic handshake runs: nothing is recorded. */
  restoring = false;
  /** Set once the session ended here (DELETE, transport closed): the store refuses to write. */
  released = false;
  /** Called when cursorlog says the session ended (the session handler then answers 404). */
  onSessionGone: (() => void) | undefined;
  /** When a call last named this session (ms), for the idle-TTL renewal. */
  touchedAt = Date.now();
  readonly resumer: Resumer;

  constructor(
    readonly core: Core,
    readonly session: string,
    public epoch: string,
  ) {
    this.resumer = new Resumer(this);
  }

  /** Binds the store to the session's transport (Node or web-standard); checks the SDK internals. */
  attach(transport: object): void {
    this.transport = checkTransport(transport);
  }

  /** The transport internals; throws when `attach` was not called. */
  internals(): TransportInternals {
    if (this.transport === undefined) {
      throw new CursorlogMcpError(`the event store of session ${this.session} is not attached to its transport`);
    }
    return this.transport;
  }

  /** The local stream record of a cursorlog stream, if this process produces it. */
  localByStream(stream: string): LocalStream | undefined {
    return this.byStream.get(stream);
  }

  /** Open local streams, for lease renewal. */
  openStreams(): LocalStream[] {
    return [...this.local.values()].filter((s) => s.open);
  }

  /** The SDK stream id under which a cursorlog stream is served in this process. */
  sdkIdFor(stream: string): string {
    return this.byStream.get(stream)?.sdkId ?? `cursorlog:${stream}`;
  }

  async storeEvent(streamId: StreamId, message: JSONRPCMessage): Promise<EventId> {
    if (this.restoring) {
      // The synthetic initialize of a restored session: its response goes nowhere.
      this.restoringIds += 1;
      return `restore-${this.restoringIds}`;
    }
    if (this.released) throw new CursorlogMcpError(`session ${this.session} has ended on this replica; nothing is recorded`);
    const local = await this.ensureOpen(streamId);
    if (!('jsonrpc' in message)) {
      // The priming event (`{}`): its id is the stream's start cursor; nothing is written.
      return `${this.epoch}-${local.stream}-0`;
    }
    if (!local.open) {
      throw new CursorlogMcpError(`stream ${local.stream} (${streamId}) of session ${this.session} is already terminal`);
    }
    const payload = Buffer.from(JSON.stringify(message));
    const isOwnResponse =
      !('method' in message) && local.correlation !== undefined && String(message.id) === local.correlation;
    // The request id is the stream's correlation (OpenStream), not repeated on every event.
    const event = { kind: kindOf(message), payload };
    this.touchedAt = Date.now();
    local.renewedAt = Date.now();
    let id: string;
    if (isOwnResponse) {
      local.open = false;
      try {
        id = await this.core.producer.complete(this.session, local.stream, event);
      } catch (error) {
        await this.abortQuietly(local, `terminal frame not recorded: ${(error as Error).message}`);
        throw error;
      }
    } else {
      id = await this.core.producer.append(this.session, local.stream, event);
    }
    // Decided in the same synchronous step that resolves the SDK's await (see Resumer.replayLocal).
    if (local.resumesInProgress > 0) {
      const cursor = parseCursor(id);
      if (cursor !== undefined) local.pending.push({ seq: cursor.seq, id, message });
    }
    return id;
  }

  async getStreamIdForEventId(eventId: EventId): Promise<StreamId | undefined> {
    if (eventId.endsWith(ANSWERED_SUFFIX)) return undefined;
    const resolution = await this.call('Resolve', { session: this.session, lastEventId: eventId });
    const verdict = resolution.verdict;
    if (verdict === 'MALFORMED_CURSOR' || verdict === 'UNKNOWN_CURSOR' || verdict === 'UNKNOWN_SESSION') {
      this.core.log('info', 'cursor refused (400)', { session: this.session, cursor: eventId, verdict, detail: resolution.detail ?? '' });
      return undefined;
    }
    const stream = resolution.cursor?.stream;
    if (stream === undefined) return undefined;
    return this.sdkIdFor(stream);
  }

  replayEventsAfter(
    lastEventId: EventId,
    { send }: { send: (eventId: EventId, message: JSONRPCMessage) => Promise<void> },
  ): Promise<StreamId> {
    return this.resumer.resume(lastEventId, send);
  }

  /** A unary call naming this session (renews its idle TTL). */
  call<K extends keyof Rpcs>(rpc: K, request: Rpcs[K][0]): Promise<Rpcs[K][1]> {
    this.touchedAt = Date.now();
    return this.core.client.call(rpc, request);
  }

  private ensureOpen(sdkId: string): Promise<LocalStream> {
    const existing = this.local.get(sdkId);
    if (existing !== undefined) return Promise.resolve(existing);
    let opening = this.opening.get(sdkId);
    if (opening === undefined) {
      opening = this.open(sdkId).finally(() => this.opening.delete(sdkId));
      this.opening.set(sdkId, opening);
    }
    return opening;
  }

  private async open(sdkId: string): Promise<LocalStream> {
    const ids = this.transport === undefined ? [] : requestIdsOfStream(this.transport, sdkId);
    const correlation = ids.length > 0 ? String(ids[0]) : undefined;
    const request: OpenStreamRequest = {
      session: this.session,
      epoch: this.epoch,
      ...(correlation !== undefined ? { correlation } : {}),
      ...(this.core.leaseMs > 0 ? { leaseMs: String(this.core.leaseMs) } : {}),
    };
    let opened;
    try {
      opened = await this.openStream(request);
    } catch (error) {
      if (!(error instanceof CursorlogError) || (error.code !== 9 /* FAILED_PRECONDITION */ && error.code !== 5) /* NOT_FOUND */) throw error;
      // A stale epoch (the session advanced elsewhere) or a session that ended elsewhere.
      const session = await this.call('GetSession', { session: this.session }).catch(() => undefined);
      if (session === undefined || session.expired) {
        this.onSessionGone?.();
        throw new CursorlogMcpError(`session ${this.session} has ended (expired or deleted on another replica): ${error.message}`);
      }
      this.epoch = session.epoch;
      opened = await this.openStream({ ...request, epoch: this.epoch });
    }
    const local: LocalStream = {
      sdkId,
      stream: opened.stream,
      correlation,
      open: true,
      resumesInProgress: 0,
      pending: [],
      renewedAt: Date.now(),
    };
    this.core.producer.track(opened.stream);
    this.local.set(sdkId, local);
    this.byStream.set(opened.stream, local);
    return local;
  }

  /** Opens a cursorlog stream in this session (renews its idle TTL), through the batch unless `openVia: 'unary'`. */
  private openStream(request: OpenStreamRequest): Promise<OpenStreamResponse> {
    if (this.core.openVia === 'unary') return this.call('OpenStream', request);
    this.touchedAt = Date.now();
    return this.core.producer.open(request);
  }

  private async abortQuietly(local: LocalStream, reason: string): Promise<void> {
    local.open = false;
    this.core.producer.untrack(local.stream);
    try {
      await this.call('Abort', { session: this.session, stream: local.stream, reason: reason.slice(0, 250) });
    } catch (error) {
      this.core.log('warn', 'abort failed', { session: this.session, stream: local.stream, error: String(error) });
    }
  }

  /**
   * The session ended on this replica (DELETE, shutdown): abort its still-open streams so
   * clients resuming elsewhere get the producer-aborted error at once instead of after the
   * lease, stop resumes, and refuse further writes.
   */
  async release(reason: string): Promise<void> {
    if (this.released) return;
    this.released = true;
    this.resumer.stopAll();
    await Promise.all(this.openStreams().map((s) => this.abortQuietly(s, reason)));
  }
}
