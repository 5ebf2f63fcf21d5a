/**
 * Tasks benchmark (issue 20 item 6; docs/TASKS-DESIGN.md §5.3): the same `TaskStore` workload
 * through `CursorlogTaskStore` and through `bench/redis-task-store.ts` (a Redis store written the
 * way users write one), same run, same box, rounds interleaved.
 *
 * Per task: `createTask` + 10 `updateTaskStatus` (a message each; every 3rd `input_required`,
 * the next back to `working`) + `storeTaskResult` + `getTaskResult` = 13 calls, 12 writes.
 * Concurrency 1, 16 and 64 tasks in flight (closed loop); each task has its own session
 * (owner), as tasks of many clients do.
 *
 * Sides: `cursorlog` (`serve --sync always`: fdatasync before every answer), `redis-always`
 * and `redis-everysec` (one `redis-server --appendonly yes`, switched with `CONFIG SET
 * appendfsync`). Then `tasks/get` latency through an SDK server replica other than the
 * creator's: tasks are created through the store (replica A's), and a stateless `McpServer`
 * (replica B, in this process, its own store and gRPC client) answers raw HTTP `tasks/get`.
 *
 * `--cluster N` (N ≥ 3) adds a side: N `cursorlog serve --node-id … --peers …` members (default
 * Raft timing, `--sync always`) in the same run, driven through a client given the member list
 * (it follows the `cursorlog-leader` hints to the leader); its server CPU is every member's.
 * `--cluster 0` (the default) runs the three sides above and nothing else.
 *
 * `--sides` picks among `cursorlog`, `redis-always`, `redis-everysec` (default: all three).
 *
 * Output: a Markdown table on stdout (medians over rounds, per-call p50/p99 pooled); with
 * `--json PATH`, every round's figures as JSON too.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type IncomingMessage } from 'node:http';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { TaskStore } from '@modelcontextprotocol/sdk/experimental/tasks';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { Request } from '@modelcontextprotocol/sdk/types.js';
import { Redis } from 'ioredis';
import { Agent, fetch } from 'undici';
import { CursorlogClient } from '../src/client.js';
import { CursorlogTaskStore } from '../src/tasks.js';
import { freePort as memberPort, PACKAGE_DIR, Proc } from '../test/harness.js';
import { RedisTaskStore } from './redis-task-store.js';

const { values } = parseArgs({
  options: {
    'cursorlog-bin': { type: 'string', default: join(PACKAGE_DIR, '..', '..', 'target', 'release', 'cursorlog') },
    'redis-server': { type: 'string', default: 'redis-server' },
    rounds: { type: 'string', default: '3' },
    tasks: { type: 'string', default: '1:60,16:320,64:640' },
    gets: { type: 'string', default: '400' },
    'data-root': { type: 'string', default: join(PACKAGE_DIR, 'bench', 'results') },
    cluster: { type: 'string', default: '0' },
    sides: { type: 'string', default: 'cursorlog,redis-always,redis-everysec' },
    json: { type: 'string' },
  },
});
const ROUNDS = Number(values.rounds);
const LEVELS = values.tasks!.split(',').map((p) => p.split(':').map(Number) as [number, number]);
const GETS = Number(values.gets);
const CLUSTER = Number(values.cluster);
/**
 * Which single-node sides run (`--sides cursorlog` alone, e.g. under `node --cpu-prof`); the
 * `tasks/get` table needs both `cursorlog` and `redis-always`. `cursorlog` sends the task calls
 * on one `TaskStream` call per member; `cursorlog-unary` (not run by default) the same server
 * through a client with `taskTransport: 'unary'` (one unary call per task call, on node:http2),
 * as every release before `TaskStream` did. `cursorlog-grpc-js` (not run by
 * default) is the same server through a client whose unary calls go through grpc-js.
 */
const SIDES = new Set(values.sides!.split(',').map((s) => s.trim()));
for (const s of SIDES) if (!['cursorlog', 'cursorlog-unary', 'cursorlog-grpc-js', 'redis-always', 'redis-everysec'].includes(s)) throw new Error(`--sides: unknown side ${s}`);
if (!Number.isInteger(CLUSTER) || (CLUSTER !== 0 && CLUSTER < 3)) throw new Error(`--cluster ${values.cluster}: 0 (off) or a member count of at least 3`);

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

const children: ChildProcess[] = [];
function start(name: string, cmd: string, args: string[]): Proc {
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  return new Proc(name, child);
}

/** CPU time (user + system) of processes so far, summed, ms (Linux /proc; 100 ticks/s). */
function cpuMs(pids: (number | undefined)[]): number {
  let total = 0;
  for (const pid of pids) {
    if (pid === undefined) return NaN;
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    total += (Number(fields[11]) + Number(fields[12])) * 10;
  }
  return total;
}

/**
 * `size` cursorlog members (`--node-id i --peers 1=…,2=…`, default Raft timing, `--sync
 * always`), each on its own data dir under `root`; resolves with the member list once each
 * listens.
 */
async function startCluster(root: string, size: number): Promise<{ list: string; procs: Proc[] }> {
  const addresses: string[] = [];
  for (let i = 0; i < size; i++) addresses.push(`127.0.0.1:${await memberPort()}`);
  const peers = addresses.map((a, i) => `${i + 1}=${a}`).join(',');
  const procs = addresses.map((address, i) =>
    start(`cursorlog-${i + 1}`, values['cursorlog-bin']!, [
      'serve', '--data-dir', join(root, `member-${i + 1}`), '--listen', address, '--node-id', String(i + 1), '--peers', peers,
      '--sync', 'always', '--max-tasks-per-owner', '1000000',
    ]),
  );
  await Promise.all(procs.map((p) => p.line(/^listening on /, 60_000)));
  return { list: addresses.join(','), procs };
}

/** Each member's role and Raft term, from `cursorlog cluster status` ("1 leader t2, 2 follower t2, …"). */
function clusterView(list: string): string {
  const out = execFileSync(values['cursorlog-bin']!, ['cluster', 'status', '--members', list], { encoding: 'utf8' });
  return out
    .split('\n')
    .slice(1)
    .map((l) => l.trim().split(/\s+/))
    .filter((f) => f.length >= 4)
    .map((f) => (f[1] === 'unreachable:' ? `${f[0]} unreachable` : `${f[1]} ${f[2]} t${f[3]}`))
    .join(', ');
}

/** The member that leads now: the one an idempotent write (`OpenSession`) succeeded on. */
async function leaderOf(client: CursorlogClient): Promise<string> {
  await client.call('OpenSession', { session: `bench-leader-probe-${process.pid}` });
  return client.router.current;
}

const REQUEST: Request = { method: 'tools/call', params: { name: 'bench', arguments: {} } };
const KINDS = ['create', 'update', 'store', 'result'] as const;
type Kind = (typeof KINDS)[number];

interface Round {
  tasksPerSec: number;
  callsPerSec: number;
  serverCpuMsPerTask: number;
  benchCpuMsPerTask: number;
  lat: Record<Kind, number[]>;
}

let seq = 0;
async function timed(lat: number[], f: () => Promise<unknown>): Promise<void> {
  const t = performance.now();
  await f();
  lat.push(performance.now() - t);
}

async function oneTask(store: TaskStore, lat: Record<Kind, number[]>): Promise<void> {
  const session = `bench-${process.pid}-${seq++}`;
  let taskId = '';
  await timed(lat.create, async () => {
    taskId = (await store.createTask({ ttl: 600_000, pollInterval: 1000 }, 1, REQUEST, session)).taskId;
  });
  for (let i = 1; i <= 10; i++) {
    const status = i % 3 === 0 ? 'input_required' : 'working';
    await timed(lat.update, () => store.updateTaskStatus(taskId, status, `step ${i}`, session));
  }
  await timed(lat.store, () => store.storeTaskResult(taskId, 'completed', { content: [{ type: 'text', text: `done ${taskId}` }] }, session));
  await timed(lat.result, () => store.getTaskResult(taskId, session));
}

async function round(store: TaskStore, concurrency: number, total: number, serverPids: (number | undefined)[]): Promise<Round> {
  const lat: Record<Kind, number[]> = { create: [], update: [], store: [], result: [] };
  let next = 0;
  const cpu0 = cpuMs(serverPids);
  const self0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < total) {
        next += 1;
        await oneTask(store, lat);
      }
    }),
  );
  const secs = (performance.now() - t0) / 1000;
  const self = process.cpuUsage(self0);
  return {
    tasksPerSec: total / secs,
    callsPerSec: (total * 13) / secs,
    serverCpuMsPerTask: (cpuMs(serverPids) - cpu0) / total,
    benchCpuMsPerTask: (self.user + self.system) / 1000 / total,
    lat,
  };
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor((s.length - 1) / 2)]!;
};
const pct = (xs: number[], p: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};
const f1 = (x: number): string => (Number.isNaN(x) ? '–' : x >= 100 ? x.toFixed(0) : x.toFixed(1));
const f2 = (x: number): string => (Number.isNaN(x) ? '–' : x.toFixed(2));

/** A stateless SDK replica (a server + transport per request) answering `tasks/*` from `store`. */
async function replicaB(store: TaskStore): Promise<{ url: string; close: () => void }> {
  const http = createHttpServer((req, res) => {
    void (async () => {
      const chunks: Buffer[] = [];
      for await (const c of req as IncomingMessage) chunks.push(c as Buffer);
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown;
      const server = new McpServer({ name: 'bench-b', version: '1' }, { capabilities: { tasks: { requests: { tools: { call: {} } } } }, taskStore: store });
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
      res.on('close', () => {
        void transport.close();
        void server.close();
      });
      await server.connect(transport);
      await transport.handleRequest(req, res, body);
    })().catch((e: unknown) => {
      res.statusCode = 500;
      res.end(String(e));
    });
  });
  await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp`, close: () => http.close() };
}

/** p50/p99 of `tasks/get` on replica B for tasks the store (replica A's) created, sequential. */
async function getLatency(creator: TaskStore, reader: TaskStore): Promise<{ p50: number; p99: number }> {
  const b = await replicaB(reader);
  const agent = new Agent({ connections: 4 });
  const ids: string[] = [];
  for (let i = 0; i < 50; i++) ids.push((await creator.createTask({ ttl: 600_000 }, 1, REQUEST)).taskId);
  const lat: number[] = [];
  for (let i = 0; i < GETS + 20; i++) {
    const body = { jsonrpc: '2.0', id: i, method: 'tasks/get', params: { taskId: ids[i % ids.length] } };
    const t = performance.now();
    const r = await fetch(b.url, {
      method: 'POST',
      headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-protocol-version': '2025-11-25' },
      body: JSON.stringify(body),
      dispatcher: agent,
    });
    const answer = (await r.json()) as { result?: { status?: string } };
    if (answer.result?.status !== 'working') throw new Error(`tasks/get answered ${JSON.stringify(answer)}`);
    if (i >= 20) lat.push(performance.now() - t);
  }
  b.close();
  await agent.close();
  return { p50: pct(lat, 50), p99: pct(lat, 99) };
}

async function main(): Promise<void> {
  mkdirSync(values['data-root']!, { recursive: true });
  const root = mkdtempSync(join(values['data-root']!, 'tasks-'));
  const cl = start('cursorlog', values['cursorlog-bin']!, [
    'serve', '--data-dir', join(root, 'cursorlog'), '--listen', '127.0.0.1:0', '--sync', 'always', '--max-tasks-per-owner', '1000000',
  ]);
  const address = (await cl.line(/^listening on (\S+)$/))[1]!;
  const redisPort = await freePort();
  const rd = start('redis', values['redis-server']!, [
    '--port', String(redisPort), '--bind', '127.0.0.1', '--dir', root, '--appendonly', 'yes', '--appendfsync', 'always', '--save', '', '--daemonize', 'no',
  ]);
  await rd.line(/Ready to accept connections/);
  const redis = new Redis({ host: '127.0.0.1', port: redisPort, maxRetriesPerRequest: 2 });
  const grpcA = new CursorlogClient({ address, deadlineMs: 30_000 });
  const grpcB = new CursorlogClient({ address, deadlineMs: 30_000 });
  const grpcJs = new CursorlogClient({ address, deadlineMs: 30_000, unaryTransport: 'grpc-js' });
  const grpcUnary = new CursorlogClient({ address, deadlineMs: 30_000, taskTransport: 'unary' });
  const sides: { key: string; name: string; store: TaskStore; pids: (number | undefined)[]; before?: () => Promise<void> }[] = [
    { key: 'cursorlog', name: 'cursorlog (sync always)', store: new CursorlogTaskStore(grpcA), pids: [cl.child.pid] },
    { key: 'cursorlog-unary', name: 'cursorlog, one unary call per task call (sync always)', store: new CursorlogTaskStore(grpcUnary), pids: [cl.child.pid] },
    { key: 'cursorlog-grpc-js', name: 'cursorlog, unary calls through grpc-js (sync always)', store: new CursorlogTaskStore(grpcJs), pids: [cl.child.pid] },
    { key: 'redis-always', name: 'redis (appendfsync always)', store: new RedisTaskStore(redis), pids: [rd.child.pid], before: async () => void (await redis.config('SET', 'appendfsync', 'always')) },
    { key: 'redis-everysec', name: 'redis (appendfsync everysec)', store: new RedisTaskStore(redis), pids: [rd.child.pid], before: async () => void (await redis.config('SET', 'appendfsync', 'everysec')) },
  ].filter((s) => SIDES.has(s.key));
  // The cluster side: clients given the member list find the leader themselves.
  const cluster = CLUSTER > 0 ? await startCluster(root, CLUSTER) : undefined;
  const grpcCA = cluster && new CursorlogClient({ address: cluster.list, deadlineMs: 30_000 });
  const grpcCB = cluster && new CursorlogClient({ address: cluster.list, deadlineMs: 30_000 });
  let leaderBefore = '';
  let viewBefore = '';
  if (cluster && grpcCA && grpcCB) {
    leaderBefore = await leaderOf(grpcCA);
    await leaderOf(grpcCB);
    viewBefore = clusterView(cluster.list);
    console.error(`cluster ${cluster.list}: leader ${leaderBefore} (${viewBefore})`);
    sides.push({ key: 'cluster', name: `cursorlog ${CLUSTER}-member cluster (sync always)`, store: new CursorlogTaskStore(grpcCA), pids: cluster.procs.map((p) => p.child.pid) });
  }
  const load = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  console.error(`load before: ${load}`);
  // Warm-up: JIT, connections, first segment.
  for (const s of sides) {
    await s.before?.();
    await round(s.store, 4, 20, s.pids);
  }
  const results = new Map<string, Round[]>();
  for (const [concurrency, total] of LEVELS) {
    for (let r = 0; r < ROUNDS; r++) {
      // Rotate the order each round so no side always runs first.
      for (let k = 0; k < sides.length; k++) {
        const s = sides[(k + r) % sides.length]!;
        await s.before?.();
        const res = await round(s.store, concurrency, total, s.pids);
        const key = `${s.name}|${concurrency}`;
        results.set(key, [...(results.get(key) ?? []), res]);
        console.error(`c=${concurrency} round ${r} ${s.name}: ${f1(res.tasksPerSec)} tasks/s`);
      }
    }
  }
  await redis.config('SET', 'appendfsync', 'always');
  const getsCursorlog = SIDES.has('cursorlog') ? await getLatency(new CursorlogTaskStore(grpcA), new CursorlogTaskStore(grpcB)) : undefined;
  const getsRedis = SIDES.has('redis-always') ? await getLatency(new RedisTaskStore(redis), new RedisTaskStore(redis)) : undefined;
  const getsCluster = grpcCA && grpcCB ? await getLatency(new CursorlogTaskStore(grpcCA), new CursorlogTaskStore(grpcCB)) : undefined;
  const leaderAfter = grpcCA ? await leaderOf(grpcCA) : '';
  const viewAfter = cluster ? clusterView(cluster.list) : '';
  const loadAfter = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

  if (values.json !== undefined) {
    const rows = [...results.entries()].map(([key, rs]) => {
      const [name, concurrency] = key.split('|');
      const side = sides.find((s) => s.name === name)!;
      return {
        side: side.key,
        name,
        inFlight: Number(concurrency),
        rounds: rs.map((r) => ({ tasksPerSec: r.tasksPerSec, callsPerSec: r.callsPerSec, serverCpuMsPerTask: r.serverCpuMsPerTask, benchCpuMsPerTask: r.benchCpuMsPerTask })),
      };
    });
    writeFileSync(values.json, JSON.stringify({ rounds: ROUNDS, callsPerTask: 13, rows, gets: { cursorlog: getsCursorlog, redis: getsRedis, cluster: getsCluster } }, null, 2));
  }
  console.log(`Run ${new Date().toISOString()}, ${ROUNDS} rounds per level, load average before ${load}, after ${loadAfter}.`);
  if (cluster) {
    console.log(`Cluster ${cluster.list}: leader ${leaderBefore} before the rounds (${viewBefore}), ${leaderAfter} after (${viewAfter}).`);
  }
  console.log('');
  console.log('| store | in flight | tasks/s | calls/s | create p50/p99 ms | update p50/p99 ms | storeTaskResult p50/p99 ms | getTaskResult p50/p99 ms | server CPU ms/task | bench CPU ms/task |');
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const [concurrency] of LEVELS) {
    for (const s of sides) {
      const rs = results.get(`${s.name}|${concurrency}`)!;
      const pooled = (k: Kind): number[] => rs.flatMap((r) => r.lat[k]);
      const pp = (k: Kind): string => `${f1(pct(pooled(k), 50))} / ${f1(pct(pooled(k), 99))}`;
      console.log(
        `| ${s.name} | ${concurrency} | ${f1(median(rs.map((r) => r.tasksPerSec)))} | ${f1(median(rs.map((r) => r.callsPerSec)))} | ${pp('create')} | ${pp('update')} | ${pp('store')} | ${pp('result')} | ${f2(median(rs.map((r) => r.serverCpuMsPerTask)))} | ${f2(median(rs.map((r) => r.benchCpuMsPerTask)))} |`,
      );
    }
  }
  console.log('');
  console.log(`\`tasks/get\` through replica B (a stateless SDK server, another store instance than the creator's), ${GETS} sequential calls over HTTP:`);
  console.log('');
  console.log('| store | p50 ms | p99 ms |');
  console.log('|---|---:|---:|');
  if (getsCursorlog) console.log(`| cursorlog (GetTask, linearizable) | ${f2(getsCursorlog.p50)} | ${f2(getsCursorlog.p99)} |`);
  if (getsRedis) console.log(`| redis (GET) | ${f2(getsRedis.p50)} | ${f2(getsRedis.p99)} |`);
  if (getsCluster) console.log(`| cursorlog ${CLUSTER}-member cluster (GetTask, linearizable: ReadIndex on the leader) | ${f2(getsCluster.p50)} | ${f2(getsCluster.p99)} |`);

  grpcA.close();
  grpcB.close();
  grpcJs.close();
  grpcUnary.close();
  grpcCA?.close();
  grpcCB?.close();
  redis.disconnect();
  for (const c of children) c.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 300));
  rmSync(root, { recursive: true, force: true });
}

main().catch((e: unknown) => {
  console.error(e);
  for (const c of children) c.kill('SIGKILL');
  process.exit(1);
});
