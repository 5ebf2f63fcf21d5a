/**
 * Test harness: the real cursorlog binary, replica processes (examples/replica.ts), and a
 * TCP proxy that switches replicas, holds new connections and cuts live ones. Everything
 * listens on port 0 and lives in temp dirs removed on stop.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { createServer, connect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
/** adapters/typescript */
export const PACKAGE_DIR = join(here, '..', '..');
const REPO = join(PACKAGE_DIR, '..', '..');

/** The cursorlog binary: $CURSORLOG_BIN, else <repo>/target/debug/cursorlog. */
export function cursorlogBin(): string {
  const bin = process.env['CURSORLOG_BIN'] ?? join(process.env['CARGO_TARGET_DIR'] ?? join(REPO, 'target'), 'debug', 'cursorlog');
  if (!existsSync(bin)) throw new Error(`cursorlog binary ${bin} not found: run \`cargo build -p cursorlog-server\` or set CURSORLOG_BIN`);
  return bin;
}

/** Resolves when `predicate` holds, polling every 20 ms; rejects after `timeoutMs` naming `what`. */
export async function waitFor<T>(what: string, predicate: () => T | undefined | false | Promise<T | undefined | false>, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A child process whose stdout lines are collected. */
export class Proc {
  readonly lines: string[] = [];
  /** Stderr lines (the adapter's log lines). */
  readonly errLines: string[] = [];
  private exited = false;
  constructor(
    readonly name: string,
    readonly child: ChildProcess,
  ) {
    let buffer = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      buffer += chunk.toString('utf8');
      let nl;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        this.lines.push(buffer.slice(0, nl));
        buffer = buffer.slice(nl + 1);
      }
    });
    let errBuffer = '';
    child.stderr?.on('data', (chunk: Buffer) => {
      if (process.env['TEST_VERBOSE']) process.stderr.write(`[${name}] ${chunk.toString('utf8')}`);
      errBuffer += chunk.toString('utf8');
      let nl;
      while ((nl = errBuffer.indexOf('\n')) >= 0) {
        this.errLines.push(errBuffer.slice(0, nl));
        errBuffer = errBuffer.slice(nl + 1);
      }
    });
    child.on('exit', () => {
      this.exited = true;
    });
  }

  /** The first stdout line matching `re` (waits for it). */
  line(re: RegExp, timeoutMs = 15_000): Promise<RegExpExecArray> {
    return waitFor(`${this.name} to print ${re}`, () => {
      for (const l of this.lines) {
        const m = re.exec(l);
        if (m) return m;
      }
      if (this.exited) throw new Error(`${this.name} exited before printing ${re}`);
      return undefined;
    }, timeoutMs);
  }

  count(re: RegExp): number {
    return this.lines.filter((l) => re.test(l)).length;
  }

  kill(signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    if (this.exited) return Promise.resolve();
    return new Promise((resolve) => {
      this.child.once('exit', () => resolve());
      this.child.kill(signal);
    });
  }
}

/** The real cursorlog server on a free port with a temp data dir. */
export class CursorlogServer {
  private constructor(
    readonly proc: Proc,
    readonly address: string,
    readonly dataDir: string,
  ) {}

  static async start(extraArgs: string[] = []): Promise<CursorlogServer> {
    const dataDir = mkdtempSync(join(tmpdir(), 'cursorlog-ts-'));
    const child = spawn(cursorlogBin(), ['serve', '--data-dir', dataDir, '--listen', '127.0.0.1:0', ...extraArgs], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const proc = new Proc('cursorlog', child);
    const m = await proc.line(/^listening on (\S+)$/);
    return new CursorlogServer(proc, m[1]!, dataDir);
  }

  async stop(): Promise<void> {
    await this.proc.kill('SIGTERM');
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}

/** A replica: `node dist/examples/replica.js`. */
export class Replica {
  private constructor(
    readonly proc: Proc,
    readonly url: string,
    readonly port: number,
  ) {}

  static async start(name: string, cursorlog: string, extraArgs: string[] = [], env: Record<string, string> = {}): Promise<Replica> {
    const script = join(PACKAGE_DIR, 'dist', 'examples', 'replica.js');
    const child = spawn(process.execPath, [script, '--cursorlog', cursorlog, '--port', '0', ...extraArgs], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...env },
    });
    const proc = new Proc(name, child);
    // Generous: a loaded 2-core machine starts node slowly.
    const m = await proc.line(/^listening on (http:\/\/127\.0\.0\.1:(\d+)\/mcp)$/, 60_000);
    return new Replica(proc, m[1]!, Number(m[2]!));
  }

  runs(tool: string): number {
    return this.proc.count(new RegExp(`^RUN ${tool} `));
  }

  stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    return this.proc.kill(signal);
  }
}

/** A TCP proxy in front of the replicas: `target` picks the replica for new connections. */
export class Proxy {
  private readonly server: Server;
  private readonly live = new Set<Socket>();
  private held: Socket[] = [];
  private holding = false;
  target: number;
  port = 0;

  private constructor(target: number) {
    this.target = target;
    this.server = createServer((client) => this.accept(client));
  }

  static async start(target: number): Promise<Proxy> {
    const proxy = new Proxy(target);
    await new Promise<void>((resolve) => proxy.server.listen(0, '127.0.0.1', resolve));
    proxy.port = (proxy.server.address() as AddressInfo).port;
    return proxy;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}/mcp`;
  }

  private accept(client: Socket): void {
    if (this.holding) {
      client.pause();
      this.held.push(client);
      return;
    }
    const upstream = connect(this.target, '127.0.0.1');
    this.live.add(client);
    this.live.add(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    const close = (): void => {
      client.destroy();
      upstream.destroy();
      this.live.delete(client);
      this.live.delete(upstream);
    };
    client.on('error', close);
    upstream.on('error', close);
    client.on('close', close);
    upstream.on('close', close);
  }

  /** Sends new connections to `port`. */
  switchTo(port: number): void {
    this.target = port;
  }

  /** New connections wait (the client sees a slow server, not a failure) until `release`. */
  hold(): void {
    this.holding = true;
  }

  /** Connects the held connections (to the current target) and stops holding. */
  release(): void {
    this.holding = false;
    const held = this.held;
    this.held = [];
    for (const c of held) {
      c.resume();
      this.accept(c);
    }
  }

  /** Cuts every live connection (both directions), as a failing load balancer would. */
  cutAll(): void {
    for (const s of this.live) s.destroy();
    this.live.clear();
  }

  async stop(): Promise<void> {
    this.cutAll();
    for (const c of this.held) c.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

const handedPorts = new Set<number>();
const PORT_SPAN = 12_000;

/** The lowest port of the kernel's ephemeral range (Linux's default when it cannot be read). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > 0 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

/** Whether `port` can be bound on loopback now. */
async function bindable(port: number): Promise<boolean> {
  const server = createServer();
  const ok = await new Promise<boolean>((resolve) => {
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => resolve(true));
  });
  if (ok) await new Promise<void>((resolve) => server.close(() => resolve()));
  return ok;
}

/**
 * A free loopback port for a cursorlog member to bind, drawn from just below the kernel's
 * ephemeral range and never handed out twice by this process. A port bound on 0 and released
 * comes from the ephemeral range, where any outgoing connection (another member's Raft RPC)
 * may take it before the member binds it; below that range only explicit binds use a port.
 */
export async function freePort(): Promise<number> {
  const high = Math.max(ephemeralLow(), 1024 + PORT_SPAN);
  for (let i = 0; i < 2 * PORT_SPAN; i += 1) {
    const port = high - PORT_SPAN + Math.floor(Math.random() * PORT_SPAN);
    if (handedPorts.has(port)) continue;
    handedPorts.add(port);
    if (await bindable(port)) return port;
  }
  throw new Error(`no free loopback port in ${high - PORT_SPAN}..${high}`);
}

/**
 * Three real `cursorlog serve --node-id … --peers …` members on free ports with short Raft
 * timing (election 300–600 ms, heartbeat 50 ms), temp data dirs removed on stop.
 */
export class CursorlogCluster {
  readonly nodes: (Proc | undefined)[] = [];
  private constructor(
    readonly addresses: string[],
    readonly dataDirs: string[],
  ) {}

  static async start(size = 3): Promise<CursorlogCluster> {
    const ports: number[] = [];
    for (let i = 0; i < size; i += 1) ports.push(await freePort());
    const addresses = ports.map((p) => `127.0.0.1:${p}`);
    const dirs = addresses.map(() => mkdtempSync(join(tmpdir(), 'cursorlog-ts-cluster-')));
    const cluster = new CursorlogCluster(addresses, dirs);
    for (let i = 0; i < size; i += 1) cluster.nodes.push(cluster.spawn(i));
    await Promise.all(cluster.nodes.map((n) => n!.line(/^listening on /, 60_000)));
    return cluster;
  }

  private spawn(i: number): Proc {
    const peers = this.addresses.map((a, j) => `${j + 1}=${a}`).join(',');
    const child = spawn(
      cursorlogBin(),
      ['serve', '--data-dir', this.dataDirs[i]!, '--listen', this.addresses[i]!, '--node-id', String(i + 1), '--peers', peers, '--election-timeout-ms', '300', '--heartbeat-ms', '50'],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    return new Proc(`cursorlog-${i + 1}`, child);
  }

  /** Starts the member at `address` again (after {@link kill}) on its data directory. */
  async restart(address: string): Promise<void> {
    const i = this.addresses.indexOf(address);
    if (i < 0 || this.nodes[i] !== undefined) throw new Error(`${address} is not a stopped member`);
    const node = this.spawn(i);
    this.nodes[i] = node;
    await node.line(/^listening on /, 60_000);
  }

  /** The comma-separated member list, as the adapter takes it. */
  get list(): string {
    return this.addresses.join(',');
  }

  /** SIGKILLs the member at `address`. */
  async kill(address: string): Promise<void> {
    const i = this.addresses.indexOf(address);
    if (i < 0) throw new Error(`${address} is not a member`);
    await this.nodes[i]?.kill('SIGKILL');
    this.nodes[i] = undefined;
  }

  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n?.kill('SIGKILL')));
    for (const d of this.dataDirs) rmSync(d, { recursive: true, force: true });
  }
}
