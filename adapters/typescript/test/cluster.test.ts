/**
 * End to end against a replicated cursorlog (issue 19 item 6): three real members, replicas
 * configured with the member list, the SDK's own client. The cursorlog LEADER is SIGKILLed
 * in the middle of a streaming tool call; the MCP client must still get every progress
 * notification exactly once, and the result.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { afterEach, describe, it } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Agent, fetch as undiciFetch } from 'undici';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { CursorlogClient } from '../src/client.js';
import { Cursorlog } from '../src/core.js';
import { parseCursor } from '../src/store.js';
import { CursorlogCluster, Proxy, Replica, waitFor } from './harness.js';

const STEPS = 40;
const range = (from: number, to: number): number[] => Array.from({ length: to - from + 1 }, (_, i) => from + i);

interface Setup {
  cluster: CursorlogCluster;
  a: Replica;
  b: Replica;
  proxy: Proxy;
  grpc: CursorlogClient;
}

let setup: Setup | undefined;

async function start(): Promise<Setup> {
  const cluster = await CursorlogCluster.start();
  const args = ['--lease-ms', '5000', '--retry-ms', '100', '--follow-idle-ms', '20000'];
  // Info logging: the test reads the replicas' resume and tail lines.
  const env = { CURSORLOG_MCP_LOG: 'info' };
  const [a, b] = await Promise.all([Replica.start('A', cluster.list, args, env), Replica.start('B', cluster.list, args, env)]);
  const proxy = await Proxy.start(a.port);
  const grpc = new CursorlogClient({ address: cluster.list, deadlineMs: 30_000 });
  setup = { cluster, a, b, proxy, grpc };
  return setup;
}

afterEach(async () => {
  if (setup === undefined) return;
  const { cluster, a, b, proxy, grpc } = setup;
  setup = undefined;
  grpc.close();
  await proxy.stop();
  await Promise.all([a.stop('SIGKILL'), b.stop('SIGKILL')]);
  await cluster.stop();
});

/** The member that leads now: the one a write (an idempotent OpenSession) succeeded on. */
async function leaderOf(s: Setup): Promise<string> {
  await s.grpc.call('OpenSession', { session: `probe-${randomUUID()}` });
  return s.grpc.router.current;
}

async function callWork(url: string): Promise<{ progress: number[]; result: Promise<unknown>; client: Client }> {
  const client = new Client({ name: 'cluster-e2e', version: '1.0.0' }, { capabilities: {} });
  const agent = new Agent();
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    fetch: ((u: string | URL, init?: RequestInit) => undiciFetch(u, { ...(init as object), dispatcher: agent })) as unknown as typeof fetch,
    reconnectionOptions: { initialReconnectionDelay: 100, maxReconnectionDelay: 500, reconnectionDelayGrowFactor: 1.2, maxRetries: 30 },
  });
  await client.connect(transport);
  const progress: number[] = [];
  const result = client.callTool({ name: 'work', arguments: { steps: STEPS, delay_ms: 50 } }, undefined, {
    onprogress: (p) => progress.push(p.progress),
    timeout: Number(process.env["CLUSTER_CALL_TIMEOUT_MS"] ?? 90_000),
  });
  result.catch(() => {});
  return { progress, result, client };
}

describe('a replicated cursorlog: the leader SIGKILLed mid-call', () => {
  it('the producing replica rides out the failover: every progress event once, then the result', async () => {
    const s = await start();
    const call = await callWork(s.proxy.url);
    await waitFor('5 progress notifications', () => call.progress.length >= 5, 30_000);
    const leader = await leaderOf(s);
    await s.cluster.kill(leader);
    const seenAtKill = call.progress.length;
    const result = (await call.result) as { content: { text: string }[] };
    assert.equal(result.content[0]!.text, `done ${STEPS}`);
    assert.deepEqual(call.progress, range(1, STEPS));
    assert.ok(seenAtKill < STEPS, `the leader died mid-call (after ${seenAtKill} of ${STEPS})`);
    assert.equal(s.a.runs('work') + s.b.runs('work'), 1);
    assert.notEqual(await leaderOf(s), leader);
    await call.client.close();
  });

  it("a resumed client followed by another replica's Read(follow): re-resolved on the new leader, every event once", async () => {
    const s = await start();
    const call = await callWork(s.proxy.url);
    await waitFor('5 progress notifications', () => call.progress.length >= 5, 30_000);
    // The client loses A; it resumes on B, whose detached tail follows A's stream in cursorlog.
    s.proxy.switchTo(s.b.port);
    s.proxy.cutAll();
    const atCut = call.progress.length;
    await waitFor('B delivering live events', () => call.progress.length >= atCut + 5 && call.progress.length, 30_000);
    const leader = await leaderOf(s);
    await s.cluster.kill(leader);
    const seenAtKill = call.progress.length;
    const result = (await call.result) as { content: { text: string }[] };
    assert.equal(result.content[0]!.text, `done ${STEPS}`);
    assert.deepEqual(call.progress, range(1, STEPS));
    assert.ok(seenAtKill < STEPS, `the leader died mid-call (after ${seenAtKill} of ${STEPS})`);
    assert.equal(s.a.runs('work') + s.b.runs('work'), 1);
    // B's Read(follow) was re-opened on the new leader: the client never had to resume again.
    const resumes = (r: Replica): number => r.proc.errLines.filter((l) => l.includes('cursorlog-mcp info: resume ')).length;
    assert.equal(resumes(s.a) + resumes(s.b), 1, 'one resume (the cut), none after the leader kill');
    const ended = await waitFor('B\'s tail to end', () => s.b.proc.errLines.find((l) => l.includes('detached tail ended')));
    assert.match(ended, /"why":"stream ended","reopened":[1-9]/);
    await call.client.close();
  });
});

describe('a replicated cursorlog: lease renewal across a failover', () => {
  const LEASE_MS = 1_500;
  const note = (n: number): JSONRPCMessage => ({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: n } });

  it('a renewal that lands on a follower after a failover is followed to the leader: the stream stays open', async () => {
    const cluster = await CursorlogCluster.start();
    let cl: Cursorlog | undefined;
    try {
      const probe = new CursorlogClient({ address: cluster.list, deadlineMs: 30_000 });
      await probe.call('OpenSession', { session: `probe-${randomUUID()}` });
      const leader = probe.router.current;
      probe.close();
      const [follower, heir] = cluster.addresses.filter((a) => a !== leader) as [string, string];
      // The adapter's list: the leader, then a member that will be a follower after the failover.
      cl = new Cursorlog({ address: [leader, follower], leaseMs: LEASE_MS, deadlineMs: 30_000, logger: () => {} });
      const session = `lease-${randomUUID()}`;
      const opened = await cl.client.call('OpenSession', { session });
      const store = cl.bindSession(session, opened.epoch);
      store.attach(new StreamableHTTPServerTransport({ sessionIdGenerator: () => session }));
      await store.storeEvent('req-1', {} as JSONRPCMessage);
      const first = parseCursor(await store.storeEvent('req-1', note(1)))!;
      // The follower misses a write (committed by the leader and the heir): only the heir can win next.
      await cluster.kill(follower);
      await cl.client.call('OpenSession', { session: `missed-${randomUUID()}` });
      // Which members refuse a call from here on (only lease renewals run until the append below).
      const refusedAt: [string, string | undefined][] = [];
      const failed = cl.client.router.failed.bind(cl.client.router);
      cl.client.router.failed = (address: string, hinted: string | undefined): number => {
        refusedAt.push([address, hinted]);
        return failed(address, hinted);
      };
      await cluster.kill(leader);
      await cluster.restart(follower);
      const after = new CursorlogClient({ address: heir, deadlineMs: 30_000 });
      await after.call('OpenSession', { session: `probe-${randomUUID()}` });
      assert.equal(after.router.current, heir);
      after.close();
      await new Promise((r) => setTimeout(r, 3 * LEASE_MS)); // three leases under the new leader, renewals only
      const outcome = await cl.client.call('GetOutcome', { session, stream: first.stream });
      assert.equal(outcome.outcome?.state, 'STREAM_STATE_OPEN', `the stream is open: ${JSON.stringify(outcome.outcome)}`);
      const next = parseCursor(await store.storeEvent('req-1', note(2)))!;
      assert.equal(next.stream, first.stream);
      assert.equal(next.seq, first.seq + 1);
      // A renewal did land on the follower, which named the new leader; the client went on there.
      assert.ok(
        refusedAt.some(([at, hinted]) => at === follower && hinted === heir),
        `a renewal refused by the follower ${follower} naming ${heir} (refusals: ${JSON.stringify(refusedAt)})`,
      );
      assert.equal(cl.client.router.current, heir);
    } finally {
      await cl?.close();
      await cluster.stop();
    }
  });
});
