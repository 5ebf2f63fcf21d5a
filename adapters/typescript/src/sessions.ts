/**
 * `CursorlogSessions`: the per-session wiring the SDK leaves to the application (it keeps
 * one transport per session in a map the app owns). It creates each session's transport with
 * a store bound to that session, records the session in cursorlog, restores sessions that
 * another replica created, and expires them on DELETE.
 */
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import {
  StreamableHTTPServerTransport,
  type StreamableHTTPServerTransportOptions,
} from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import type { AuthInfo } from '@modelcontextprotocol/sdk/server/auth/types.js';
import { CursorlogError, CursorlogMcpError } from './client.js';
import type { Cursorlog } from './core.js';
import { checkTransport } from './sdk-internals.js';
import type { SessionEventStore } from './store.js';
import type { CursorlogTaskMessageQueue } from './task-queue.js';

/** Anything the SDK can connect a transport to (`McpServer`, `Server`). */
export interface Connectable {
  connect(transport: StreamableHTTPServerTransport): Promise<void>;
  close(): Promise<void>;
}

/** Options of {@link CursorlogSessions}. */
export interface SessionsOptions {
  /** A new MCP server for each session (as with the SDK's own per-session transports). */
  createServer: () => Connectable;
  /** Passed to every `StreamableHTTPServerTransport` (retryInterval, DNS-rebinding protection, …). */
  transportOptions?: Omit<
    StreamableHTTPServerTransportOptions,
    'sessionIdGenerator' | 'eventStore' | 'onsessioninitialized' | 'onsessionclosed'
  >;
  /** New session ids (default `randomUUID`). */
  sessionIdGenerator?: () => string;
  /** How long a session known in this process is trusted before cursorlog is asked again whether it still lives, ms (default 1 000). */
  verifyAfterMs?: number;
  /**
   * The `taskMessageQueue` every server of `createServer` is built with: each server is
   * attached to it, and a POSTed answer to a task's request is routed to the replica that
   * asked (see `CursorlogTaskMessageQueue.attach` / `routeAnswers`).
   */
  taskMessageQueue?: CursorlogTaskMessageQueue;
}

/** What cursorlog keeps with a session (`OpenSession.state`), for any replica to restore it. */
interface SessionRecord {
  v: 1;
  initialize: unknown;
  owner: string | null;
}

interface Live {
  transport: StreamableHTTPServerTransport;
  server: Connectable;
  store: SessionEventStore;
  verifiedAt: number;
}

type AuthedRequest = IncomingMessage & { auth?: AuthInfo };

function jsonError(res: ServerResponse, status: number, code: number, message: string): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ jsonrpc: '2.0', error: { code, message }, id: null }));
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString('utf8');
  return text.length === 0 ? undefined : (JSON.parse(text) as unknown);
}

/**
 * True for a POST carrying a JSON-RPC request under protocol 2025-11-25 or later: the SDK
 * stores its priming event first, so opening its stream in cursorlog vouches for the session.
 */
function opensStream(req: IncomingMessage, body: unknown): boolean {
  if (req.method !== 'POST') return false;
  const version = req.headers['mcp-protocol-version'];
  if (typeof version !== 'string' || version < '2025-11-25') return false;
  const messages = Array.isArray(body) ? body : [body];
  return messages.some((m) => typeof m === 'object' && m !== null && 'method' in m && 'id' in m);
}

/** Session-aware request handling for the SDK's Node Streamable HTTP transport. */
export class CursorlogSessions {
  private readonly live = new Map<string, Live>();
  private readonly restoring = new Map<string, Promise<Live | undefined>>();
  private readonly verifyAfterMs: number;

  constructor(
    private readonly cursorlog: Cursorlog,
    private readonly options: SessionsOptions,
  ) {
    this.verifyAfterMs = options.verifyAfterMs ?? 1_000;
  }

  /** Sessions live in this process. */
  get size(): number {
    return this.live.size;
  }

  /** The store of a session live in this process (tests, diagnostics). */
  storeOf(sessionId: string): SessionEventStore | undefined {
    return this.live.get(sessionId)?.store;
  }

  /**
   * Handles one HTTP request to the MCP endpoint (POST, GET, DELETE), like the SDK's
   * `transport.handleRequest(req, res, parsedBody)`. Pass `parsedBody` when a body parser
   * already consumed the body.
   */
  async handleRequest(req: AuthedRequest, res: ServerResponse, parsedBody?: unknown): Promise<void> {
    let body = parsedBody;
    if (req.method === 'POST' && body === undefined) {
      try {
        body = await readJson(req);
      } catch (error) {
        jsonError(res, 400, -32700, `Parse error: ${(error as Error).message}`);
        return;
      }
    }
    const header = req.headers['mcp-session-id'];
    const sessionId = Array.isArray(header) ? header[0] : header;
    if (sessionId === undefined) {
      if (req.method === 'POST' && isInitializeRequest(body)) {
        const live = await this.create(body.params, req.auth?.clientId ?? null);
        await live.transport.handleRequest(req, res, body);
        return;
      }
      jsonError(res, 400, -32000, 'Bad Request: No valid session ID provided');
      return;
    }
    const live = await this.find(sessionId, req, opensStream(req, body));
    if (live === undefined) {
      jsonError(res, 404, -32001, 'Session not found');
      return;
    }
    const queue = this.options.taskMessageQueue;
    if (queue !== undefined && req.method === 'POST') {
      try {
        // Answers to another replica's task requests go to that task; the SDK answers the rest.
        body = await queue.routeAnswers(body, sessionId, live.server);
      } catch (error) {
        jsonError(res, 503, -32603, `cannot route the answer to its task: ${(error as Error).message}`);
        return;
      }
    }
    await live.transport.handleRequest(req, res, body);
  }

  /** Closes every session of this process (their open streams are aborted in cursorlog). */
  async close(): Promise<void> {
    const all = [...this.live.values()];
    this.live.clear();
    await Promise.all(all.map(async (l) => {
      await l.store.release('replica shut down');
      this.cursorlog.unbind(l.store);
      await l.transport.close();
    }));
  }

  private async create(params: unknown, owner: string | null): Promise<Live> {
    const sessionId = (this.options.sessionIdGenerator ?? randomUUID)();
    const record: SessionRecord = { v: 1, initialize: params, owner };
    const state = Buffer.from(JSON.stringify(record));
    const opened = await this.cursorlog.client.call('OpenSession', { session: sessionId, state });
    if (!opened.created && !(await this.createdByUs(sessionId, state))) throw new CursorlogMcpError(`session id ${sessionId} already exists in cursorlog; the generator must produce unique ids`);
    return this.connect(sessionId, opened.epoch);
  }

  /**
   * An `OpenSession` answered `created: false`: true when the session holds exactly our state,
   * i.e. our own earlier attempt created it and the client resent it after a leader change.
   */
  private async createdByUs(sessionId: string, state: Buffer): Promise<boolean> {
    const existing = await this.cursorlog.client.call('GetSession', { session: sessionId }).catch(() => undefined);
    return existing !== undefined && !existing.expired && existing.state !== undefined && Buffer.from(existing.state).equals(state);
  }

  private async connect(sessionId: string, epoch: string): Promise<Live> {
    const store = this.cursorlog.bindSession(sessionId, epoch);
    const transport = new StreamableHTTPServerTransport({
      ...this.options.transportOptions,
      sessionIdGenerator: () => sessionId,
      eventStore: store,
      onsessionclosed: async (id: string) => {
        await store.release('session deleted');
        await this.cursorlog.client.call('ExpireSession', { session: id });
      },
    });
    store.attach(transport);
    const live: Live = { transport, server: this.options.createServer(), store, verifiedAt: Date.now() };
    this.options.taskMessageQueue?.attach(live.server);
    store.onSessionGone = () => {
      if (this.live.get(sessionId) === live) this.live.delete(sessionId);
      void live.transport.close();
    };
    transport.onclose = () => {
      if (this.live.get(sessionId) === live) this.live.delete(sessionId);
      this.cursorlog.unbind(store);
      void store.release('session closed');
    };
    await live.server.connect(transport);
    this.live.set(sessionId, live);
    return live;
  }

  private async find(sessionId: string, req: AuthedRequest, verifiedByWrite: boolean): Promise<Live | undefined> {
    const known = this.live.get(sessionId);
    if (known !== undefined) {
      // A request that opens a stream is verified by that open (an ended session fails it and
      // is dropped here, see `onSessionGone`); others ask cursorlog at most every verifyAfterMs.
      if (verifiedByWrite || Date.now() - known.verifiedAt < this.verifyAfterMs) return known;
      const session = await this.getSession(sessionId);
      if (session === undefined || session.expired) {
        this.live.delete(sessionId);
        await known.transport.close();
        return undefined;
      }
      known.verifiedAt = Date.now();
      return known;
    }
    let pending = this.restoring.get(sessionId);
    if (pending === undefined) {
      pending = this.restore(sessionId, req).finally(() => this.restoring.delete(sessionId));
      this.restoring.set(sessionId, pending);
    }
    return pending;
  }

  private async getSession(sessionId: string): Promise<{ epoch: string; state?: Buffer; expired?: boolean; idleTtlMs?: string } | undefined> {
    try {
      const session = await this.cursorlog.client.call('GetSession', { session: sessionId });
      if (session.idleTtlMs !== undefined) this.cursorlog.sessionIdleTtlMs = Number(session.idleTtlMs);
      return session;
    } catch (error) {
      if (error instanceof CursorlogError && error.code === 5 /* NOT_FOUND */) return undefined;
      if (error instanceof CursorlogError && error.code === 3 /* INVALID_ARGUMENT: not a session id cursorlog accepts */) return undefined;
      throw error;
    }
  }

  /**
   * A session another replica created: rebuild its transport and server from the recorded
   * initialize parameters with a synthetic handshake through the SDK's own request path
   * (nothing of it is recorded or sent to the client).
   */
  private async restore(sessionId: string, req: AuthedRequest): Promise<Live | undefined> {
    const session = await this.getSession(sessionId);
    if (session === undefined || session.expired || session.state === undefined || session.state.length === 0) return undefined;
    let record: SessionRecord;
    try {
      record = JSON.parse(session.state.toString('utf8')) as SessionRecord;
    } catch (error) {
      throw new CursorlogMcpError(`session ${sessionId}: its recorded state is not JSON: ${(error as Error).message}`);
    }
    if (record.v !== 1 || typeof record.initialize !== 'object' || record.initialize === null) {
      throw new CursorlogMcpError(`session ${sessionId}: its recorded state is not a v1 session record`);
    }
    if ((record.owner ?? null) !== (req.auth?.clientId ?? null)) return undefined;
    const live = await this.connect(sessionId, session.epoch);
    const web = checkTransport(live.transport);
    const headers: Record<string, string> = {
      accept: 'application/json, text/event-stream',
      'content-type': 'application/json',
    };
    if (req.headers.host !== undefined) headers['host'] = req.headers.host;
    if (typeof req.headers.origin === 'string') headers['origin'] = req.headers.origin;
    const url = `http://${req.headers.host ?? 'localhost'}${req.url ?? '/'}`;
    const init = { jsonrpc: '2.0', id: `cursorlog-restore-${sessionId}`, method: 'initialize', params: record.initialize };
    live.store.restoring = true;
    try {
      const response = await web.handleRequest(new Request(url, { method: 'POST', headers, body: JSON.stringify(init) }), { parsedBody: init });
      await response.text();
      if (!response.ok) throw new CursorlogMcpError(`restoring session ${sessionId}: the synthetic initialize answered ${response.status}`);
      const initialized = { jsonrpc: '2.0', method: 'notifications/initialized' };
      const headers2 = { ...headers, 'mcp-session-id': sessionId };
      const done = await web.handleRequest(new Request(url, { method: 'POST', headers: headers2, body: JSON.stringify(initialized) }), { parsedBody: initialized });
      await done.text();
    } catch (error) {
      this.live.delete(sessionId);
      await live.transport.close();
      throw error;
    } finally {
      live.store.restoring = false;
    }
    this.cursorlog.log('info', 'session restored', { session: sessionId, epoch: session.epoch });
    return live;
  }
}
