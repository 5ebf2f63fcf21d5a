/**
 * `Cursorlog`: one per process. Owns the gRPC client, the shared producer that coalesces
 * every session's stream opens, appends and completions into `AppendBatch` calls, and the
 * timer that renews producer leases and session idle TTLs.
 */
import { CursorlogClient, type ClientOptions } from './client.js';
import { Producer, type ProducerOptions } from './producer.js';
import { SessionEventStore } from './store.js';

/** Where log lines go; `fields` are the verdict's facts and the like. */
export type Logger = (level: 'info' | 'warn', message: string, fields: Record<string, unknown>) => void;

/** The default logger: warnings to stderr; info lines too when `CURSORLOG_MCP_LOG=info`. */
export const defaultLogger: Logger = (level, message, fields) => {
  if (level === 'info' && process.env['CURSORLOG_MCP_LOG'] !== 'info') return;
  console.error(`cursorlog-mcp ${level}: ${message} ${JSON.stringify(fields)}`);
};

/** Options of {@link Cursorlog}. */
export interface CursorlogOptions extends ClientOptions, ProducerOptions {
  /** Producer lease of every stream, ms; renewed every third of it while this process lives (default 10 000; 0: no lease). */
  leaseMs?: number;
  /** A detached tail that forwarded nothing for this long ends the response (the client reconnects), ms (default 60 000). */
  followIdleMs?: number;
  /** How often a detached tail checks that its client is still connected, ms (default 1 000). */
  tailCheckMs?: number;
  /** Log sink (default: {@link defaultLogger}). */
  logger?: Logger;
  /**
   * How the per-request streams are opened: `batch` (default) as `open` items of the
   * producer's coalesced `AppendBatch` calls; `unary` with one `OpenStream` call each (the
   * behaviour before `BatchItem.open` existed, kept to measure the difference; it costs one
   * more gRPC call per tool call).
   */
  openVia?: 'batch' | 'unary';
}

/** The process-wide cursorlog connection of the adapter. */
export class Cursorlog {
  readonly client: CursorlogClient;
  readonly producer: Producer;
  readonly leaseMs: number;
  readonly openVia: 'batch' | 'unary';
  readonly followIdleMs: number;
  readonly tailCheckMs: number;
  /** The server's session idle TTL (ms) as last reported by `GetSession`; 0 = none. */
  sessionIdleTtlMs = 3_600_000;
  private readonly logger: Logger;
  private readonly stores = new Set<SessionEventStore>();
  private timer: NodeJS.Timeout | undefined;

  constructor(options: CursorlogOptions) {
    this.client = new CursorlogClient(options);
    this.producer = new Producer(this.client, options);
    this.leaseMs = options.leaseMs ?? 10_000;
    if (!Number.isInteger(this.leaseMs) || this.leaseMs < 0) throw new RangeError(`leaseMs must be a non-negative integer, got ${options.leaseMs}`);
    this.openVia = options.openVia ?? 'batch';
    if (this.openVia !== 'batch' && this.openVia !== 'unary') throw new RangeError(`openVia must be 'batch' or 'unary', got ${String(options.openVia)}`);
    this.followIdleMs = options.followIdleMs ?? 60_000;
    this.tailCheckMs = options.tailCheckMs ?? 1_000;
    this.logger = options.logger ?? defaultLogger;
  }

  /** Logs through the configured logger. */
  log(level: 'info' | 'warn', message: string, fields: Record<string, unknown>): void {
    this.logger(level, message, fields);
  }

  /**
   * The event store of one MCP session (opened in cursorlog at `epoch`). Hand it to that
   * session's transport only, then call `store.attach(transport)`.
   */
  bindSession(session: string, epoch: string): SessionEventStore {
    const store = new SessionEventStore(this, session, epoch);
    this.stores.add(store);
    this.ensureTimer();
    return store;
  }

  /** Stops renewing a session's leases (it ended here). */
  unbind(store: SessionEventStore): void {
    this.stores.delete(store);
  }

  private ensureTimer(): void {
    if (this.timer !== undefined) return;
    const period = this.leaseMs > 0 ? Math.max(Math.floor(this.leaseMs / 3), 10) : 60_000;
    this.timer = setInterval(() => void this.renew(period), period);
    this.timer.unref();
  }

  /** Renews the leases of streams nothing appended to lately, and idle sessions. */
  async renew(period: number): Promise<void> {
    const now = Date.now();
    const calls: Promise<unknown>[] = [];
    for (const store of this.stores) {
      if (store.released) continue;
      let renewed = false;
      if (this.leaseMs > 0) {
        for (const local of store.openStreams()) {
          if (now - local.renewedAt < period) continue;
          local.renewedAt = now;
          renewed = true;
          calls.push(store.call('KeepAlive', { session: store.session, stream: local.stream }));
        }
      }
      const ttl = this.sessionIdleTtlMs;
      if (!renewed && ttl > 0 && now - store.touchedAt > ttl / 3) {
        calls.push(store.call('KeepAlive', { session: store.session }));
      }
    }
    for (const result of await Promise.allSettled(calls)) {
      if (result.status === 'rejected') this.log('warn', 'keep-alive failed', { error: String(result.reason) });
    }
  }

  /** Stops the timer and closes the channel (after the producer drained). */
  async close(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    await this.producer.idle();
    this.producer.close();
    this.client.close();
  }
}

/** The name the store modules use for the process-wide part. */
export type Core = Cursorlog;
