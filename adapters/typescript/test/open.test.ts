/**
 * Streams are opened through the producer's coalesced `AppendBatch` (`open` items), not with
 * one unary `OpenStream` per tool call: counted over concurrent tool calls of the real SDK
 * (client and server in this process), and the failure paths of an open inside a batch.
 */
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { z } from 'zod';
import { CursorlogError } from '../src/client.js';
import { Cursorlog } from '../src/core.js';
import type { BatchItem, BatchResult } from '../src/proto.js';
import { CursorlogSessions } from '../src/sessions.js';
import { parseCursor } from '../src/store.js';
import { CursorlogServer } from './harness.js';

const quiet = (): void => {};
const event = (n: number): { kind: string; payload: Buffer } => ({ kind: 'notification', payload: Buffer.from(JSON.stringify({ n })) });

/** What the adapter asked cursorlog for, seen at its gRPC client. */
interface Seen {
  unaryOpens: number;
  batchOpens: number;
  /** Streams opened by `open` items (from their results). */
  opened: Set<string>;
  /** Failures answered to `open` items. */
  openFailures: { code?: number; message?: string }[];
  /** The items of every AppendBatch call, in call order. */
  batches: BatchItem[][];
}

/** Counts unary OpenStream calls and AppendBatch open items of `cl`; `inject` may fail an AppendBatch before it is sent. */
function watch(cl: Cursorlog, inject?: (items: BatchItem[]) => Error | undefined): Seen {
  const seen: Seen = { unaryOpens: 0, batchOpens: 0, opened: new Set(), openFailures: [], batches: [] };
  const call = cl.client.call.bind(cl.client);
  cl.client.call = (async (rpc: string, request: unknown) => {
    if (rpc === 'OpenStream') seen.unaryOpens += 1;
    if (rpc !== 'AppendBatch') return call(rpc as 'Stats', request as Record<string, never>);
    const items = (request as { items: BatchItem[] }).items;
    seen.batches.push([...items]);
    const injected = inject?.(items);
    if (injected !== undefined) throw injected;
    seen.batchOpens += items.filter((i) => i.open !== undefined).length;
    const response = await call('AppendBatch', { items });
    (response.results ?? []).forEach((r: BatchResult, i) => {
      if (items[i]?.open === undefined) return;
      if (r.result === 'opened' && r.opened !== undefined) seen.opened.add(r.opened.stream);
      if (r.result === 'failure') seen.openFailures.push(r.failure ?? {});
    });
    return response;
  }) as typeof cl.client.call;
  return seen;
}

/** A replica in this process: the real SDK server behind `CursorlogSessions`, with a `work` tool that counts its runs. */
class InProcessReplica {
  runs = 0;
  private constructor(
    readonly cl: Cursorlog,
    readonly sessions: CursorlogSessions,
    private readonly http: Server,
    readonly url: string,
  ) {}

  static async start(cl: Cursorlog): Promise<InProcessReplica> {
    let replica: InProcessReplica | undefined;
    const createServer_ = (): McpServer => {
      const server = new McpServer({ name: 'open-test', version: '1.0.0' });
      server.registerTool('work', { inputSchema: { steps: z.number().int() } }, async ({ steps }, extra) => {
        if (replica !== undefined) replica.runs += 1;
        const token = extra._meta?.progressToken;
        for (let i = 1; i <= steps; i += 1) {
          if (token !== undefined) await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: steps } });
        }
        return { content: [{ type: 'text', text: `done ${steps}` }] };
      });
      return server;
    };
    const sessions = new CursorlogSessions(cl, { createServer: createServer_ });
    const http = createServer((req, res) => {
      sessions.handleRequest(req, res).catch(() => {
        if (!res.headersSent) res.writeHead(500).end();
      });
    });
    await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
    const port = (http.address() as AddressInfo).port;
    replica = new InProcessReplica(cl, sessions, http, `http://127.0.0.1:${port}/mcp`);
    return replica;
  }

  async connect(): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
    const client = new Client({ name: 'open-test', version: '1.0.0' }, { capabilities: {} });
    const transport = new StreamableHTTPClientTransport(new URL(this.url), { reconnectionOptions: { initialReconnectionDelay: 100, maxReconnectionDelay: 100, reconnectionDelayGrowFactor: 1, maxRetries: 0 } });
    await client.connect(transport);
    return { client, transport };
  }

  async stop(): Promise<void> {
    await this.sessions.close();
    this.http.closeAllConnections();
    await new Promise<void>((r) => this.http.close(() => r()));
    await this.cl.close();
  }
}

/** `n` SDK clients each call `work` at once; returns the cursorlog stream of each call (from its resumption tokens). */
async function concurrentCalls(replica: InProcessReplica, n: number, steps: number): Promise<string[]> {
  const clients = await Promise.all(Array.from({ length: n }, () => replica.connect()));
  const streams = await Promise.all(
    clients.map(async ({ client }) => {
      const tokens: string[] = [];
      const result = await client.callTool({ name: 'work', arguments: { steps } }, undefined, {
        onprogress: () => {},
        onresumptiontoken: (t) => tokens.push(t),
      });
      assert.deepEqual(result.content, [{ type: 'text', text: `done ${steps}` }]);
      assert.ok(tokens.length >= 1, 'the call got resumption tokens');
      const mine = new Set(tokens.map((t) => parseCursor(t)?.stream));
      assert.equal(mine.size, 1, `one stream per call, got tokens ${tokens.join(', ')}`);
      return [...mine][0]!;
    }),
  );
  await Promise.all(clients.map(({ client }) => client.close()));
  return streams;
}

let server: CursorlogServer;

describe('stream opens through the coalesced AppendBatch', () => {
  before(async () => {
    server = await CursorlogServer.start();
  });
  after(async () => {
    await server.stop();
  });

  it('N concurrent SDK tool calls open their streams as AppendBatch open items, with no unary OpenStream', async () => {
    const N = 20;
    const cl = new Cursorlog({ address: server.address, logger: quiet });
    const seen = watch(cl);
    const replica = await InProcessReplica.start(cl);
    const streams = await concurrentCalls(replica, N, 3);
    assert.equal(seen.unaryOpens, 0, 'no unary OpenStream on the hot path');
    assert.equal(new Set(streams).size, N, 'each call has its own stream');
    for (const s of streams) assert.ok(seen.opened.has(s), `stream ${s} was opened by an AppendBatch open item`);
    // One stream per request: each session's initialize (its response stream) and each tool call.
    assert.equal(seen.batchOpens, 2 * N);
    assert.equal(seen.opened.size, 2 * N, 'every open item opened a stream');
    assert.equal(cl.producer.stats.opens, seen.batchOpens, 'the producer counts the open items it sent');
    assert.equal(replica.runs, N);
    await replica.stop();
  });

  it("the control: openVia 'unary' opens each call's stream with its own OpenStream call (the counter sees them)", async () => {
    const N = 5;
    const cl = new Cursorlog({ address: server.address, logger: quiet, openVia: 'unary' });
    const seen = watch(cl);
    const replica = await InProcessReplica.start(cl);
    const streams = await concurrentCalls(replica, N, 2);
    assert.equal(new Set(streams).size, N);
    assert.equal(seen.unaryOpens, 2 * N, 'one OpenStream per initialize and per tool call');
    assert.equal(seen.batchOpens, 0);
    await replica.stop();
  });

  it('opens handed in while a batch is in flight leave together, with appends, in the next batch; each caller gets its own stream', async () => {
    const cl = new Cursorlog({ address: server.address, logger: quiet });
    const seen = watch(cl);
    const { epoch } = await cl.client.call('OpenSession', { session: 'co-open' });
    const existing = await cl.producer.open({ session: 'co-open', epoch });
    cl.producer.track(existing.stream);
    await cl.producer.idle();
    const b0 = cl.producer.stats.batches;
    const first = cl.producer.open({ session: 'co-open', epoch, correlation: 'first' });
    const opens = Array.from({ length: 10 }, (_, i) => cl.producer.open({ session: 'co-open', epoch, correlation: `r-${i}`, leaseMs: '60000' }));
    const appends = [1, 2, 3].map((n) => cl.producer.append('co-open', existing.stream, event(n)));
    const opened = await Promise.all([first, ...opens]);
    const ids = await Promise.all(appends);
    assert.equal(cl.producer.stats.batches - b0, 2, 'the first open alone, then everything that waited, in one call');
    assert.deepEqual(seen.batches.at(-1)!.map((i) => (i.open ? 'open' : 'append')), [...Array(10).fill('open'), 'append']);
    assert.equal(new Set(opened.map((o) => o.stream)).size, 11);
    for (const o of opened) {
      assert.equal(o.epoch, epoch);
      assert.equal(o.startEventId, `${epoch}-${o.stream}-0`);
    }
    assert.deepEqual(ids.map((id) => parseCursor(id)!.seq), [1, 2, 3]);
    const outcome = await cl.client.call('GetOutcome', { session: 'co-open', correlation: 'r-3' });
    assert.equal(outcome.outcome?.stream, opened[4]!.stream, 'the correlation travelled with its open item');
    assert.equal(seen.unaryOpens, 0);
    await cl.close();
  });

  it('an open refused inside a batch (session expired elsewhere) reaches the SDK as an error; the tool never runs; the session is gone', async () => {
    const cl = new Cursorlog({ address: server.address, logger: quiet });
    const seen = watch(cl);
    const replica = await InProcessReplica.start(cl);
    const { client, transport } = await replica.connect();
    const sid = transport.sessionId!;
    assert.ok(replica.sessions.storeOf(sid) !== undefined);
    // Another replica ended the session (DELETE there): cursorlog expired it.
    await cl.client.call('ExpireSession', { session: sid });
    await assert.rejects(client.callTool({ name: 'work', arguments: { steps: 2 } }), (e: unknown) => {
      assert.match(String(e), /session .* has ended/);
      return true;
    });
    assert.equal(replica.runs, 0, 'nothing ran, so nothing went out without an id');
    assert.equal(seen.unaryOpens, 0);
    assert.equal(seen.openFailures.length, 1, 'the open item failed inside the batch');
    assert.equal(seen.openFailures[0]!.code, 9 /* FAILED_PRECONDITION */);
    assert.equal(replica.sessions.storeOf(sid), undefined, 'the replica dropped the ended session (next request: 404)');
    await client.close().catch(() => {});
    await replica.stop();
  });

  it('an open refused inside a batch rejects only its caller, with the status of OpenStream; the batch-mates are written', async () => {
    const cl = new Cursorlog({ address: server.address, logger: quiet });
    const { epoch } = await cl.client.call('OpenSession', { session: 'mixed-1' });
    const s = await cl.producer.open({ session: 'mixed-1', epoch });
    cl.producer.track(s.stream);
    const blocker = cl.producer.append('mixed-1', s.stream, event(1));
    const stale = cl.producer.open({ session: 'mixed-1', epoch: String(Number(epoch) + 5) });
    const unknown = cl.producer.open({ session: 'never-opened', epoch: '1' });
    const good = cl.producer.open({ session: 'mixed-1', epoch });
    const next = cl.producer.append('mixed-1', s.stream, event(2));
    await assert.rejects(stale, (e: unknown) => e instanceof CursorlogError && e.rpc === 'OpenStream' && e.code === 9);
    await assert.rejects(unknown, (e: unknown) => e instanceof CursorlogError && e.rpc === 'OpenStream' && e.code === 5);
    assert.ok(Number((await good).stream) > Number(s.stream));
    assert.deepEqual([await blocker, await next].map((id) => parseCursor(id)!.seq), [1, 2]);
    await cl.close();
  });

  it('a transport failure fails the opens of the batch at once (never retried: a retry would open another stream) and retries its appends', async () => {
    const cl = new Cursorlog({ address: server.address, logger: quiet });
    let injected = 0;
    const seen = watch(cl, (items) => {
      if (injected > 0 || !items.some((i) => i.open !== undefined)) return undefined;
      injected += 1;
      return new CursorlogError('AppendBatch', 14 /* UNAVAILABLE */, 'injected');
    });
    const { epoch } = await cl.client.call('OpenSession', { session: 'retry-1' });
    const s = await cl.client.call('OpenStream', { session: 'retry-1', epoch });
    cl.producer.track(s.stream);
    const blocker = cl.producer.append('retry-1', s.stream, event(1));
    const opening = cl.producer.open({ session: 'retry-1', epoch });
    const appended = cl.producer.append('retry-1', s.stream, event(2));
    await assert.rejects(opening, (e: unknown) => e instanceof CursorlogError && e.code === 14 && /injected/.test(e.message));
    assert.equal(parseCursor(await appended)!.seq, 2);
    assert.equal(parseCursor(await blocker)!.seq, 1);
    assert.equal(injected, 1);
    assert.equal(cl.producer.stats.retries, 1);
    const retried = seen.batches.at(-1)!;
    assert.deepEqual(retried.map((i) => (i.open ? 'open' : 'append')), ['append'], 'the retry carries the append only');
    await cl.close();
  });
});
