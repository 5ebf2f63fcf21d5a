/**
 * Store-only micro-benchmark (no SDK, no HTTP): `calls` concurrent producers each append
 * `steps` events one after another (awaiting each), through the adapter's Producer
 * (coalesced AppendBatch) and through Redis XADD, interleaved rounds.
 *
 *   node dist/bench/micro.js --cursorlog ADDR --redis-port PORT [--calls 200] [--steps 10] [--rounds 4]
 */
import { parseArgs } from 'node:util';
import { Cursorlog } from '../src/core.js';
import { connectRedis } from './redis-store.js';

const { values } = parseArgs({ options: { cursorlog: { type: 'string' }, 'redis-port': { type: 'string' }, calls: { type: 'string', default: '200' }, steps: { type: 'string', default: '10' }, rounds: { type: 'string', default: '4' } } });
const CALLS = Number(values.calls);
const STEPS = Number(values.steps);
const payload = Buffer.from(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/progress', params: { progressToken: 1, progress: 1, total: 10, message: '1764550000000.123' } }));

async function main(): Promise<void> {
  const cl = new Cursorlog({ address: values.cursorlog!, logger: () => {} });
  const redis = await connectRedis(Number(values['redis-port']));
  const opened = await cl.client.call('OpenSession', { session: `micro-${Date.now()}` });
  const session = opened.session;
  for (let round = 0; round < Number(values.rounds); round += 1) {
    const streams = await Promise.all(Array.from({ length: CALLS }, () => cl.client.call('OpenStream', { session, epoch: opened.epoch })));
    for (const s of streams) cl.producer.track(s.stream);
    const b0 = cl.producer.stats.batches;
    let cpu = process.cpuUsage();
    let t = performance.now();
    await Promise.all(streams.map(async (s) => {
      for (let i = 0; i < STEPS; i += 1) await cl.producer.append(session, s.stream, { kind: 'notification', payload });
    }));
    const clSec = (performance.now() - t) / 1000;
    const clCpu = process.cpuUsage(cpu);
    cpu = process.cpuUsage();
    const batches = cl.producer.stats.batches - b0;
    t = performance.now();
    await Promise.all(Array.from({ length: CALLS }, async (_, c) => {
      for (let i = 0; i < STEPS; i += 1) await redis.xadd(`micro:${round}:${c}`, 'MAXLEN', '~', '10000', '*', 'm', payload.toString());
    }));
    const rSec = (performance.now() - t) / 1000;
    const rCpu = process.cpuUsage(cpu);
    const n = CALLS * STEPS;
    const us = (c: NodeJS.CpuUsage): string => ((c.user + c.system) / n).toFixed(1);
    cpu = process.cpuUsage();
    for (let i = 0; i < 200; i += 1) await cl.client.call('KeepAlive', { session });
    const unary = process.cpuUsage(cpu);
    console.log(`round ${round}: cursorlog ${(n / clSec).toFixed(0)} ev/s (${batches} batches, ${us(clCpu)} us CPU/event), redis ${(n / rSec).toFixed(0)} ev/s (${us(rCpu)} us CPU/event); unary call ${((unary.user + unary.system) / 200).toFixed(0)} us CPU`);
  }
  await cl.close();
  redis.disconnect();
}
void main();
