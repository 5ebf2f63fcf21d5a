/**
 * End to end with the real SDK: two replica processes (examples/replica.ts) on one real
 * cursorlog, the SDK's own client with its resumption tokens, and a proxy that switches
 * replicas and cuts connections.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { LoggingMessageNotificationSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { Agent, fetch as undiciFetch } from 'undici';
import { CursorlogClient } from '../src/client.js';
import { parseCursor } from '../src/store.js';
import { CursorlogServer, Proxy, Replica, waitFor } from './harness.js';

interface Call {
  progress: number[];
  tokens: string[];
  warnings: Record<string, unknown>[];
  result: Promise<unknown>;
  client: Client;
  transport: StreamableHTTPClientTransport;
}

let cursorlog: CursorlogServer;
let a: Replica;
let b: Replica;
let proxy: Proxy;
let grpc: CursorlogClient;

async function connect(url: string): Promise<{ client: Client; transport: StreamableHTTPClientTransport; warnings: Record<string, unknown>[] }> {
  const client = new Client({ name: 'e2e', version: '1.0.0' }, { capabilities: {} });
  // Each client gets its own connection pool, so a new client never reuses a kept-alive
  // connection the proxy routed to another replica (or cut).
  const agent = new Agent();
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: ((u: string | URL, init?: RequestInit) => undiciFetch(u, { ...(init as object), dispatcher: agent })) as unknown as typeof fetch,
    reconnectionOptions: { initialReconnectionDelay: 100, maxReconnectionDelay: 500, reconnectionDelayGrowFactor: 1.2, maxRetries: 30 },
  });
  const warnings: Record<string, unknown>[] = [];
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
    warnings.push(n.params.data as Record<string, unknown>);
  });
  await client.connect(transport);
  return { client, transport, warnings };
}

async function callWork(url: string, steps: number, delayMs: number): Promise<Call> {
  const { client, transport, warnings } = await connect(url);
  const progress: number[] = [];
  const tokens: string[] = [];
  const result = client.callTool({ name: 'work', arguments: { steps, delay_ms: delayMs } }, undefined, {
    onprogress: (p) => progress.push(p.progress),
    onresumptiontoken: (t) => tokens.push(t),
    timeout: 60_000,
  });
  result.catch(() => {});
  return { progress, tokens, warnings, result, client, transport };
}

const range = (from: number, to: number): number[] => Array.from({ length: to - from + 1 }, (_, i) => from + i);

/** The cursorlog stream and session of a call (from its latest resumption token). */
function streamOf(call: Call): { session: string; stream: string; seq: number } {
  const token = call.tokens.at(-1);
  assert.ok(token !== undefined, 'the call has a resumption token');
  const c = parseCursor(token);
  assert.ok(c !== undefined, `token ${token} is a cursor`);
  return { session: call.transport.sessionId!, stream: c.stream, seq: c.seq };
}

async function stats(): Promise<Record<string, unknown>> {
  return grpc.call('Stats', {});
}

describe('two replicas on one cursorlog, the SDK client behind a cutting proxy', () => {
  before(async () => {
    cursorlog = await CursorlogServer.start();
    const args = ['--lease-ms', '1500', '--retry-ms', '100', '--follow-idle-ms', '3000'];
    [a, b] = await Promise.all([Replica.start('A', cursorlog.address, args), Replica.start('B', cursorlog.address, args)]);
    proxy = await Proxy.start(a.port);
    grpc = new CursorlogClient({ address: cursorlog.address });
  });

  after(async () => {
    grpc.close();
    await proxy.stop();
    await Promise.all([a.stop(), b.stop()]);
    await cursorlog.stop();
  });

  it('cut mid-call: resumed on the other replica, every missed event exactly once, the tool ran once', async () => {
    proxy.switchTo(a.port);
    const runsBefore = a.runs('work') + b.runs('work');
    const call = await callWork(proxy.url, 20, 60);
    await waitFor('5 progress notifications', () => call.progress.length >= 5);
    proxy.target = b.port;
    proxy.cutAll();
    const result = (await call.result) as { content: { text: string }[] };
    assert.equal(result.content[0]!.text, 'done 20');
    assert.deepEqual(call.progress, range(1, 20));
    assert.equal(a.runs('work') + b.runs('work') - runsBefore, 1);
    // B followed A's stream live; its tail ended with the result (no Read call left open).
    await waitFor('no Read call left', async () => Number((await stats())['activeReads'] ?? 0) === 0);
    await call.client.close();
  });

  it('cut mid-call, resumed on the same replica: replay, then the SDK in-process, every event once', async () => {
    proxy.switchTo(a.port);
    const runsBefore = a.runs('work') + b.runs('work');
    const call = await callWork(proxy.url, 30, 30);
    await waitFor('5 progress notifications', () => call.progress.length >= 5);
    proxy.cutAll();
    await waitFor('10 more progress notifications after the cut', () => call.progress.length >= 15);
    proxy.cutAll();
    const result = (await call.result) as { content: { text: string }[] };
    assert.equal(result.content[0]!.text, 'done 30');
    assert.deepEqual(call.progress, range(1, 30));
    assert.equal(a.runs('work') + b.runs('work') - runsBefore, 1);
    await call.client.close();
  });

  it('call finished while away: the missed tail through the result, once', async () => {
    proxy.switchTo(a.port);
    const call = await callWork(proxy.url, 6, 80);
    await waitFor('2 progress notifications', () => call.progress.length >= 2);
    const { session, stream } = streamOf(call);
    proxy.hold();
    proxy.cutAll();
    await waitFor('the call to finish on A', async () => {
      const o = await grpc.call('GetOutcome', { session, stream });
      return o.outcome?.state === 'STREAM_STATE_COMPLETED';
    });
    proxy.target = b.port;
    proxy.release();
    const result = (await call.result) as { content: { text: string }[] };
    assert.equal(result.content[0]!.text, 'done 6');
    assert.deepEqual(call.progress, range(1, 6));
    await call.client.close();
  });

  it('evicted cursor: a visible gap marker, then the retained rest and the result', async () => {
    proxy.switchTo(a.port);
    const call = await callWork(proxy.url, 10, 120);
    await waitFor('2 progress notifications', () => call.progress.length >= 2);
    const { session, stream } = streamOf(call);
    proxy.hold();
    proxy.cutAll();
    const seen = call.progress.length;
    await waitFor('7 events recorded', async () => {
      const r = await grpc.call('Resolve', { session, lastEventId: `1-${stream}-0` });
      return Number(r.head ?? 0) >= 7;
    });
    await grpc.call('Trim', { session, stream, upToSeq: '6' });
    proxy.target = b.port;
    proxy.release();
    const result = (await call.result) as { content: { text: string }[] };
    assert.equal(result.content[0]!.text, 'done 10');
    const gap = call.warnings.find((w) => w['reason'] === 'cursor_evicted');
    assert.ok(gap !== undefined, `a cursor_evicted warning arrived (got ${JSON.stringify(call.warnings)})`);
    assert.equal(gap['verdict'], 'CURSOR_EVICTED');
    assert.equal(gap['evicted_first_seq'], seen + 1);
    assert.equal(gap['evicted_last_seq'], 6);
    assert.deepEqual(call.progress, [...range(1, seen), ...range(7, 10)]);
    await call.client.close();
  });

  it("another session's cursor, an unknown cursor and garbage: 400, nothing leaked", async () => {
    proxy.switchTo(a.port);
    const call = await callWork(proxy.url, 3, 10);
    await call.result;
    const foreign = call.tokens.at(-1)!;
    const { client, transport } = await connect(b.url);
    const { stream } = streamOf(call);
    for (const cursor of [foreign, `1-${stream}-1`, '1-999999-1', 'garbage']) {
      const response = await fetch(b.url, {
        headers: {
          accept: 'text/event-stream',
          'mcp-session-id': transport.sessionId!,
          'mcp-protocol-version': transport.protocolVersion ?? '2025-11-25',
          'last-event-id': cursor,
        },
      });
      const body = await response.text();
      assert.equal(response.status, 400, `cursor ${cursor}: ${body}`);
      assert.ok(!body.includes('done 3') && !body.includes('notifications/progress'), `cursor ${cursor} leaked ${body}`);
    }
    await client.close();
    await call.client.close();
  });

  it('killed producer: the resumed call ends with the producer-aborted error within the lease', async () => {
    const c = await Replica.start('C', cursorlog.address, ['--lease-ms', '1500', '--retry-ms', '100']);
    try {
      proxy.switchTo(c.port);
      const call = await callWork(proxy.url, 200, 100);
      await waitFor('3 progress notifications', () => call.progress.length >= 3);
      proxy.target = b.port;
      await c.stop('SIGKILL');
      const killedAt = Date.now();
      proxy.cutAll();
      const error = await call.result.then(
        () => assert.fail('the call must not succeed'),
        (e: unknown) => e,
      );
      const elapsed = Date.now() - killedAt;
      assert.ok(error instanceof McpError, `an McpError, got ${String(error)}`);
      assert.equal(error.code, -32012);
      assert.equal((error.data as Record<string, unknown>)['reason'], 'producer_aborted');
      assert.ok(elapsed < 1500 + 4000, `ended ${elapsed} ms after the kill (lease 1500 ms)`);
      await call.client.close();
    } finally {
      await c.stop('SIGKILL');
    }
  });

  it('a session created on one replica is served by another; DELETE on one ends it everywhere (404)', async () => {
    proxy.switchTo(a.port);
    const { client, transport } = await connect(proxy.url);
    const sid = transport.sessionId!;
    const version = transport.protocolVersion ?? '2025-11-25';
    const post = (url: string, id: number): Promise<Response> =>
      fetch(url, {
        method: 'POST',
        headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-session-id': sid, 'mcp-protocol-version': version },
        body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/list' }),
      });
    const onB = await post(b.url, 1);
    assert.equal(onB.status, 200, 'B restores the session A created');
    assert.match(await onB.text(), /"work"/);
    const deleted = await fetch(b.url, { method: 'DELETE', headers: { 'mcp-session-id': sid, 'mcp-protocol-version': version } });
    assert.equal(deleted.status, 200);
    // A still holds the session in memory: its next write fails (OpenStream refuses an ended
    // session) and from then on A answers 404, as B does.
    const first = await post(a.url, 2);
    await first.text();
    assert.notEqual(first.status, 200, 'A must not serve a deleted session');
    await waitFor('A to answer 404', async () => {
      const r = await post(a.url, 3);
      await r.text();
      return r.status === 404;
    });
    const onB2 = await post(b.url, 4);
    await onB2.text();
    assert.equal(onB2.status, 404);
    await client.close().catch(() => {});
  });

  it('the detached tail ends when its client leaves, and after idling', async () => {
    proxy.switchTo(a.port);
    const call = await callWork(proxy.url, 1, 8000);
    await waitFor('the priming token', () => call.tokens.length >= 1);
    const cursor = call.tokens.at(-1)!;
    const headers = {
      accept: 'text/event-stream',
      'mcp-session-id': call.transport.sessionId!,
      'mcp-protocol-version': call.transport.protocolVersion ?? '2025-11-25',
      'last-event-id': cursor,
    };
    // Client leaves: B's tail notices within its check period and ends its Read call.
    const abort = new AbortController();
    const response = await fetch(b.url, { headers, signal: abort.signal });
    assert.equal(response.status, 200);
    await waitFor('B following the stream', async () => Number((await stats())['activeFollowers'] ?? 0) >= 1);
    abort.abort();
    await waitFor('the tail to end after the client left', async () => Number((await stats())['activeFollowers'] ?? 0) === 0, 5_000);
    // Idle: nothing arrives for --follow-idle-ms (3 s): B ends the response by itself.
    const started = Date.now();
    const idle = await fetch(b.url, { headers });
    assert.equal(idle.status, 200);
    await idle.text();
    const took = Date.now() - started;
    assert.ok(took >= 2500 && took < 10_000, `the idle response ended after ${took} ms`);
    await waitFor('no follower left', async () => Number((await stats())['activeFollowers'] ?? 0) === 0);
    await call.client.close();
  });
});
