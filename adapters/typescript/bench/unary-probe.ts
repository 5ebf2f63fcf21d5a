/**
 * CPU cost of one unary gRPC call from Node (grpc-js), with and without grpc-js's retry and
 * channelz layers: `KeepAlive` calls at concurrency 50, four passes (the first ones warm up).
 *
 *   node dist/bench/unary-probe.js 127.0.0.1:50051
 */
import * as grpc from '@grpc/grpc-js';
import { loadClientConstructor } from '../src/proto.js';

type Unary = (req: unknown, md: grpc.Metadata, opts: grpc.CallOptions, cb: (e: grpc.ServiceError | null) => void) => void;

async function measure(addr: string, name: string, opts: grpc.ChannelOptions): Promise<void> {
  const Ctor = loadClientConstructor();
  const c = new Ctor(addr, grpc.credentials.createInsecure(), opts) as unknown as Record<string, Unary> & grpc.Client;
  const md = new grpc.Metadata();
  const call = (rpc: string, req: unknown): Promise<void> =>
    new Promise((res, rej) => c[rpc]!.call(c, req, md, { deadline: Date.now() + 10_000 }, (e) => (e ? rej(e) : res())));
  await call('OpenSession', { session: 'unary-probe' });
  for (let i = 0; i < 100; i += 1) await call('KeepAlive', { session: 'unary-probe' });
  const n = 3000;
  const conc = 50;
  const cpu = process.cpuUsage();
  await Promise.all(Array.from({ length: conc }, async () => {
    for (let i = 0; i < n / conc; i += 1) await call('KeepAlive', { session: 'unary-probe' });
  }));
  const u = process.cpuUsage(cpu);
  console.log(`${name}: ${((u.user + u.system) / n).toFixed(0)} us CPU per call`);
  c.close();
}

const addr = process.argv[2] ?? '127.0.0.1:50051';
for (let pass = 0; pass < 4; pass += 1) {
  await measure(addr, 'default', {});
  await measure(addr, 'channelz off', { 'grpc.enable_channelz': 0 });
  await measure(addr, 'retries off', { 'grpc.enable_retries': 0 });
  await measure(addr, 'both off', { 'grpc.enable_channelz': 0, 'grpc.enable_retries': 0 });
}
