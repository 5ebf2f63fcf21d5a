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
 * Output: a Markdown table on stdout (medians over rounds, per-call p50/p99 pooled).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
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
import { PACKAGE_DIR, Proc } from '../test/harness.js';
import { RedisTaskStore } from './redis-task-store.js';

const { values } = parseArgs({
  options: {
    'cursorlog-bin': { type: 'string', default: join(PACKAGE_DIR, '..', '..', 'target', 'release', 'cursorlog') },
    'redis-server': { type: 'string', default: 'redis-server' },
    rounds: { type: 'string', default: '3' },
    tasks: { type: 'string', default: '1:60,16:320,64:640' },
    gets: { type: 'string', default: '400' },
    'data-root': { type: 'string', default: join(PACKAGE_DIR, 'bench', 'results') },
  },
});
const ROUNDS = Number(values.rounds);
const LEVELS = values.tasks!.split(',').map((p) => p.split(':').map(Number) as [number, number]);
const GETS = Number(values.gets);

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

/** CPU time (user + system) of a process so far, ms (Linux /proc; 100 ticks/s). */
function cpuMs(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
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

async function round(store: TaskStore, concurrency: number, total: number, serverPid: number | undefined): Promise<Round> {
  const lat: Record<Kind, number[]> = { create: [], update: [], store: [], result: [] };
  let next = 0;
  const cpu0 = cpuMs(serverPid);
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
    serverCpuMsPerTask: (cpuMs(serverPid) - cpu0) / total,
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
  const sides: { name: string; store: TaskStore; pid: number | undefined; before?: () => Promise<void> }[] = [
    { name: 'cursorlog (sync always)', store: new CursorlogTaskStore(grpcA), pid: cl.child.pid },
    { name: 'redis (appendfsync always)', store: new RedisTaskStore(redis), pid: rd.child.pid, before: async () => void (await redis.config('SET', 'appendfsync', 'always')) },
    { name: 'redis (appendfsync everysec)', store: new RedisTaskStore(redis), pid: rd.child.pid, before: async () => void (await redis.config('SET', 'appendfsync', 'everysec')) },
  ];
  const load = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  console.error(`load before: ${load}`);
  // Warm-up: JIT, connections, first segment.
  for (const s of sides) {
    await s.before?.();
    await round(s.store, 4, 20, s.pid);
  }
  const results = new Map<string, Round[]>();
  for (const [concurrency, total] of LEVELS) {
    for (let r = 0; r < ROUNDS; r++) {
      // Rotate the order each round so no side always runs first.
      for (let k = 0; k < sides.length; k++) {
        const s = sides[(k + r) % sides.length]!;
        await s.before?.();
        const res = await round(s.store, concurrency, total, s.pid);
        const key = `${s.name}|${concurrency}`;
        results.set(key, [...(results.get(key) ?? []), res]);
        console.error(`c=${concurrency} round ${r} ${s.name}: ${f1(res.tasksPerSec)} tasks/s`);
      }
    }
  }
  await redis.config('SET', 'appendfsync', 'always');
  const getsCursorlog = await getLatency(new CursorlogTaskStore(grpcA), new CursorlogTaskStore(grpcB));
  const getsRedis = await getLatency(new RedisTaskStore(redis), new RedisTaskStore(redis));
  const loadAfter = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

  console.log(`Run ${new Date().toISOString()}, ${ROUNDS} rounds per level, load average before ${load}, after ${loadAfter}.`);
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
  console.log(`| cursorlog (GetTask, linearizable) | ${f2(getsCursorlog.p50)} | ${f2(getsCursorlog.p99)} |`);
  console.log(`| redis (GET) | ${f2(getsRedis.p50)} | ${f2(getsRedis.p99)} |`);

  grpcA.close();
  grpcB.close();
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
