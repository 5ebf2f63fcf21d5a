/**
 * Front-end benchmark: a TS SDK server replica (examples/replica.ts) under many concurrent
 * streaming tool calls, with the cursorlog adapter and with a Redis-Streams EventStore
 * (`appendonly yes`, `appendfsync always`), rounds interleaved in one run.
 *
 *   node dist/bench/bench.js --cursorlog-bin ../../target/release/cursorlog \
 *     [--calls 200] [--steps 10] [--delay-ms 0] [--rounds 6] [--data-root DIR] \
 *     [--sides cursorlog,cursorlog-unary-open,cursorlog-stream,redis] [--json PATH]
 *
 * Each round: `calls` sessions (created beforehand) each call the `work` tool at once; the
 * tool sends `steps` progress notifications and a result, each through the SDK's transport,
 * so each is appended to the store (durably) before it is written to the SSE response.
 * Measured at the client: durable events/s (progress + results received / wall time of the
 * round) and per-event latency (the tool stamps each notification with the time it called
 * `sendNotification`; latency = receive time - that stamp, so it covers the durable append).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Agent, fetch } from 'undici';
import { Proc, PACKAGE_DIR } from '../test/harness.js';

const { values } = parseArgs({
  options: {
    'cursorlog-bin': { type: 'string', default: join(PACKAGE_DIR, '..', '..', 'target', 'release', 'cursorlog') },
    'redis-server': { type: 'string', default: 'redis-server' },
    calls: { type: 'string', default: '200' },
    steps: { type: 'string', default: '10' },
    'delay-ms': { type: 'string', default: '0' },
    rounds: { type: 'string', default: '6' },
    'data-root': { type: 'string', default: join(PACKAGE_DIR, 'bench', 'results') },
    'replica-node-args': { type: 'string', default: '' },
    'max-in-flight': { type: 'string', default: '1' },
    sides: { type: 'string', default: 'cursorlog,redis' },
    json: { type: 'string' },
  },
});
const CALLS = Number(values.calls);
const STEPS = Number(values.steps);
const DELAY = Number(values['delay-ms']);
const ROUNDS = Number(values.rounds);
const now = (): number => performance.timeOrigin + performance.now();

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

/** CPU time (user + system) a process used so far, ms (Linux /proc; 100 ticks/s). */
function cpuMs(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

const agent = new Agent({ connections: 512, pipelining: 1 });
const PROTOCOL = '2025-11-25';
const headers = (sid?: string): Record<string, string> => ({
  accept: 'application/json, text/event-stream',
  'content-type': 'application/json',
  'mcp-protocol-version': PROTOCOL,
  ...(sid !== undefined ? { 'mcp-session-id': sid } : {}),
});

async function openSession(url: string): Promise<string> {
  const init = { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'bench', version: '1' } } };
  const r = await fetch(url, { method: 'POST', headers: headers(), body: JSON.stringify(init), dispatcher: agent });
  await r.text();
  const sid = r.headers.get('mcp-session-id');
  if (sid === null) throw new Error(`initialize answered ${r.status} without a session id`);
  const n = await fetch(url, { method: 'POST', headers: headers(sid), body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }), dispatcher: agent });
  await n.text();
  return sid;
}

/** One tool call; pushes the latency of each progress event; returns the events received. */
async function call(url: string, sid: string, id: number, latencies: number[]): Promise<number> {
  const body = { jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'work', arguments: { steps: STEPS, delay_ms: DELAY }, _meta: { progressToken: id } } };
  const r = await fetch(url, { method: 'POST', headers: headers(sid), body: JSON.stringify(body), dispatcher: agent });
  if (!r.ok || r.body === null) throw new Error(`tools/call answered ${r.status}`);
  const decoder = new TextDecoder();
  let buffer = '';
  let events = 0;
  let result = false;
  for await (const chunk of r.body) {
    buffer += decoder.decode(chunk as Uint8Array, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame.split('\n').find((l) => l.startsWith('data: '))?.slice(6);
      if (data === undefined || data.trim() === '') continue;
      const message = JSON.parse(data) as { method?: string; params?: { message?: string }; result?: unknown; error?: unknown };
      if (message.method === 'notifications/progress') {
        latencies.push(now() - Number(message.params?.message));
        events += 1;
      } else if (message.result !== undefined) {
        events += 1;
        result = true;
      } else if (message.error !== undefined) {
        throw new Error(`tool call failed: ${JSON.stringify(message.error)}`);
      }
    }
  }
  if (!result || events !== STEPS + 1) throw new Error(`call ${id}: ${events} events, result ${result}`);
  return events;
}

interface Round {
  side: string;
  eventsPerSec: number;
  latencies: number[];
  /** CPU ms per 1000 events of the replica and of the store server. */
  replicaCpu: number;
  storeCpu: number;
  /** CPU ms per 1000 events of this process (the load generator). */
  benchCpu: number;
  /** Mean events per AppendBatch call (cursorlog side). */
  batchSize: number;
  /** Streams opened through AppendBatch `open` items during the round (cursorlog side). */
  batchOpens: number;
}

async function round(side: string, url: string, sessions: string[], base: number, pids: [number | undefined, number | undefined]): Promise<Round> {
  const latencies: number[] = [];
  const statsUrl = url.replace(/\/mcp$/, '/stats');
  const s0 = side !== 'redis' ? ((await (await fetch(statsUrl, { dispatcher: agent })).json()) as { batches: number; events: number; opens: number }) : undefined;
  const c0 = pids.map(cpuMs);
  const self0 = process.cpuUsage();
  const t0 = now();
  const counts = await Promise.all(sessions.map((sid, i) => call(url, sid, base + i, latencies)));
  const seconds = (now() - t0) / 1000;
  const c1 = pids.map(cpuMs);
  const self = process.cpuUsage(self0);
  const s1 = side !== 'redis' ? ((await (await fetch(statsUrl, { dispatcher: agent })).json()) as { batches: number; events: number; opens: number }) : undefined;
  const batchSize = s0 && s1 ? (s1.events - s0.events) / (s1.batches - s0.batches) : NaN;
  const batchOpens = s0 && s1 ? s1.opens - s0.opens : NaN;
  const events = counts.reduce((a, b) => a + b, 0);
  const per = (i: number): number => ((c1[i]! - c0[i]!) / events) * 1000;
  return { side, eventsPerSec: events / seconds, latencies, replicaCpu: per(0), storeCpu: per(1), benchCpu: ((self.user + self.system) / 1000 / events) * 1000, batchSize, batchOpens };
}

const pct = (sorted: number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
const median = (xs: number[]): number => pct([...xs].sort((a, b) => a - b), 50);

async function main(): Promise<void> {
  // The default data root is gitignored, so a fresh clone does not have it yet.
  mkdirSync(values['data-root']!, { recursive: true });
  const root = mkdtempSync(join(values['data-root']!, 'run-'));
  try {
    const cl = start('cursorlog', values['cursorlog-bin']!, ['serve', '--data-dir', join(root, 'cursorlog'), '--listen', '127.0.0.1:0', '--sync', 'always']);
    const clAddr = (await cl.line(/^listening on (\S+)$/))[1]!;
    const redisPort = await freePort();
    const redis = start('redis', values['redis-server']!, [
      '--port', String(redisPort), '--bind', '127.0.0.1', '--dir', root, '--appendonly', 'yes', '--appendfsync', 'always', '--save', '', '--daemonize', 'no',
    ]);
    await redis.line(/Ready to accept connections/);
    const replica = join(PACKAGE_DIR, 'dist', 'examples', 'replica.js');
    const nodeArgs = values['replica-node-args']!.split(' ').filter((a) => a !== '');
    const SIDES = values.sides!.split(',');
    const sideArgs: Record<string, string[]> = {
      cursorlog: ['--store', 'cursorlog', '--cursorlog', clAddr, '--max-in-flight', values['max-in-flight']!],
      'cursorlog-stream': ['--store', 'cursorlog', '--cursorlog', clAddr, '--append-via', 'stream'],
      'cursorlog-unary-open': ['--store', 'cursorlog', '--cursorlog', clAddr, '--open-via', 'unary'],
      redis: ['--store', 'redis', '--redis-port', String(redisPort)],
    };
    const urls: Record<string, string> = {};
    const pids: Record<string, [number | undefined, number | undefined]> = {};
    for (const side of SIDES) {
      const args = sideArgs[side];
      if (args === undefined) throw new Error(`unknown side ${side} (cursorlog, cursorlog-stream, cursorlog-unary-open, redis)`);
      const proc = start(`replica-${side}`, process.execPath, [...nodeArgs, replica, '--port', '0', ...args]);
      urls[side] = (await proc.line(/^listening on (\S+)$/))[1]!;
      pids[side] = [proc.child.pid, side === 'redis' ? redis.child.pid : cl.child.pid];
    }
    const sessions: Record<string, string[]> = {};
    for (const side of SIDES) {
      sessions[side] = await Promise.all(Array.from({ length: CALLS }, () => openSession(urls[side]!)));
      await round(side, urls[side]!, sessions[side]!, 1_000_000, pids[side]!); // warm-up, not reported
    }
    const rounds: Round[] = [];
    for (let i = 0; i < ROUNDS; i += 1) {
      const order = SIDES.map((_, k) => SIDES[(k + i) % SIDES.length]!);
      for (const side of order) {
        const r = await round(side, urls[side]!, sessions[side]!, (i + 1) * 10_000, pids[side]!);
        rounds.push(r);
        console.error(`round ${i + 1} ${side}: ${r.eventsPerSec.toFixed(0)} events/s, CPU ms/1000 events: replica ${r.replicaCpu.toFixed(0)}, store server ${r.storeCpu.toFixed(0)}${Number.isNaN(r.batchSize) ? '' : `, mean AppendBatch size ${r.batchSize.toFixed(1)} events, ${r.batchOpens} open items`}`);
      }
    }
    const summary: Record<string, { eps: number; p50: number; p99: number; roundsEps: number[]; replicaCpu: number; storeCpu: number }> = {};
    for (const side of SIDES) {
      const mine = rounds.filter((r) => r.side === side);
      const lat = mine.flatMap((r) => r.latencies).sort((a, b) => a - b);
      summary[side] = { eps: median(mine.map((r) => r.eventsPerSec)), p50: pct(lat, 50), p99: pct(lat, 99), roundsEps: mine.map((r) => Math.round(r.eventsPerSec)), replicaCpu: median(mine.map((r) => r.replicaCpu)), storeCpu: median(mine.map((r) => r.storeCpu)) };
    }
    console.log(`calls=${CALLS} steps=${STEPS} delay_ms=${DELAY} rounds=${ROUNDS} (interleaved), events per round=${CALLS * (STEPS + 1)}`);
    console.log('| side | events/s (median of rounds) | p50 ms | p99 ms | events/s per round | CPU ms / 1000 events: replica, store server |');
    console.log('|---|---|---|---|---|---|');
    for (const side of SIDES) {
      const x = summary[side]!;
      console.log(`| ${side} | ${x.eps.toFixed(0)} | ${x.p50.toFixed(2)} | ${x.p99.toFixed(2)} | ${x.roundsEps.join(', ')} | ${x.replicaCpu.toFixed(0)}, ${x.storeCpu.toFixed(0)} |`);
    }
    if (values.json !== undefined) {
      const perSide = Object.fromEntries(
        SIDES.map((side) => [
          side,
          rounds
            .filter((x) => x.side === side)
            .map((x) => {
              const lat = [...x.latencies].sort((a, b) => a - b);
              return { eventsPerSec: x.eventsPerSec, p50: pct(lat, 50), p99: pct(lat, 99), replicaCpuMsPer1000: x.replicaCpu, storeCpuMsPer1000: x.storeCpu, benchCpuMsPer1000: x.benchCpu };
            }),
        ]),
      );
      writeFileSync(values.json, JSON.stringify({ calls: CALLS, steps: STEPS, rounds: ROUNDS, sides: perSide }, null, 2));
    }
    const r = summary['redis'];
    for (const side of SIDES) {
      const c = summary[side]!;
      if (side === 'redis' || r === undefined) continue;
      console.log(`ratio ${side}/redis: throughput ${(c.eps / r.eps).toFixed(2)}x, p50 ${(c.p50 / r.p50).toFixed(2)}x, p99 ${(c.p99 / r.p99).toFixed(2)}x`);
    }
  } finally {
    for (const child of children) child.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 500));
    rmSync(root, { recursive: true, force: true });
    await agent.close();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  for (const child of children) child.kill('SIGKILL');
  process.exit(1);
});
