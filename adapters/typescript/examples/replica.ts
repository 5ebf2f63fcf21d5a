/**
 * A runnable MCP server replica with @cursorlog/mcp (used by the end-to-end tests, the
 * conformance run and the benchmark):
 *
 *   node dist/examples/replica.js --cursorlog 127.0.0.1:50051 --port 8081 [--lease-ms 10000]
 *        [--retry-ms 1000] [--follow-idle-ms 60000] [--store cursorlog|redis --redis-port 6379]
 *        [--max-in-flight 1] [--append-via batch|stream] [--open-via batch|unary]
 *
 * Prints `listening on http://127.0.0.1:PORT/mcp` once it accepts connections, and
 * `RUN <tool> <request id>` each time a tool starts (the tests count executions).
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseArgs } from 'node:util';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { EventStore } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { Cursorlog, CursorlogSessions } from '../src/index.js';

const { values } = parseArgs({
  options: {
    cursorlog: { type: 'string', default: '127.0.0.1:50051' },
    port: { type: 'string', default: '0' },
    'lease-ms': { type: 'string', default: '10000' },
    'retry-ms': { type: 'string', default: '1000' },
    'follow-idle-ms': { type: 'string', default: '60000' },
    store: { type: 'string', default: 'cursorlog' },
    'redis-port': { type: 'string', default: '6379' },
    'max-in-flight': { type: 'string', default: '1' },
    'append-via': { type: 'string', default: 'batch' },
    'open-via': { type: 'string', default: 'batch' },
  },
});

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** The MCP server of one session: the tools the tests, the conformance suite and the benchmark call. */
export function buildServer(): McpServer {
  const server = new McpServer({ name: 'cursorlog-example', version: '0.1.0' }, { capabilities: { logging: {} } });
  server.registerTool(
    'work',
    {
      description: 'Streams `steps` progress notifications `delay_ms` apart, then returns',
      inputSchema: { steps: z.number().int().min(0).default(5), delay_ms: z.number().int().min(0).default(50) },
    },
    async ({ steps, delay_ms }, extra) => {
      console.log(`RUN work ${String(extra.requestId)}`);
      const token = extra._meta?.progressToken;
      for (let i = 1; i <= steps; i += 1) {
        if (delay_ms > 0) await sleep(delay_ms);
        if (token !== undefined) {
          await extra.sendNotification({
            method: 'notifications/progress',
            params: { progressToken: token, progress: i, total: steps, message: String(performance.timeOrigin + performance.now()) },
          });
        }
      }
      return { content: [{ type: 'text', text: `done ${steps}` }] };
    },
  );
  server.registerTool(
    'test_reconnection',
    { description: 'Closes its SSE stream mid-call (SEP-1699 polling), then answers', inputSchema: {} },
    async (_args, extra) => {
      console.log(`RUN test_reconnection ${String(extra.requestId)}`);
      await sleep(100);
      extra.closeSSEStream?.();
      await sleep(200);
      return { content: [{ type: 'text', text: 'Reconnection test completed' }] };
    },
  );
  return server;
}

const transportOptions = { retryInterval: Number(values['retry-ms']) };

async function main(): Promise<void> {
  let handle: (req: IncomingMessage, res: ServerResponse) => Promise<void>;
  let shutdown: () => Promise<void>;
  if (values.store === 'cursorlog') {
    const cursorlog = new Cursorlog({
      address: values.cursorlog!,
      leaseMs: Number(values['lease-ms']),
      followIdleMs: Number(values['follow-idle-ms']),
      maxInFlight: Number(values['max-in-flight']),
      appendVia: values['append-via'] === 'stream' ? 'stream' : 'batch',
      openVia: values['open-via'] === 'unary' ? 'unary' : 'batch',
    });
    const sessions = new CursorlogSessions(cursorlog, { createServer: buildServer, transportOptions });
    handle = async (req, res) => {
      if (req.url === '/stats') {
        // The adapter's producer counters (the benchmark reads them).
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(cursorlog.producer.stats));
        return;
      }
      await sessions.handleRequest(req, res);
    };
    shutdown = async () => {
      await sessions.close();
      await cursorlog.close();
    };
  } else if (values.store === 'redis') {
    // The baseline of the benchmark: the SDK's usual per-session wiring, with a Redis-Streams store.
    const { RedisEventStore, connectRedis } = await import('../bench/redis-store.js');
    const redis = await connectRedis(Number(values['redis-port']));
    const transports = new Map<string, StreamableHTTPServerTransport>();
    handle = async (req, res) => {
      const chunks: Buffer[] = [];
      for await (const c of req) chunks.push(c as Buffer);
      const body = chunks.length > 0 ? (JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown) : undefined;
      const sid = req.headers['mcp-session-id'] as string | undefined;
      let transport = sid === undefined ? undefined : transports.get(sid);
      if (transport === undefined && sid === undefined && isInitializeRequest(body)) {
        const id = randomUUID();
        const store: EventStore = new RedisEventStore(redis, id);
        const t = new StreamableHTTPServerTransport({ ...transportOptions, sessionIdGenerator: () => id, eventStore: store, onsessioninitialized: (s) => void transports.set(s, t) });
        t.onclose = () => void transports.delete(id);
        await buildServer().connect(t);
        transport = t;
      }
      if (transport === undefined) {
        res.writeHead(sid === undefined ? 400 : 404).end();
        return;
      }
      await transport.handleRequest(req, res, body);
    };
    shutdown = async () => {
      for (const t of transports.values()) await t.close();
      redis.disconnect();
    };
  } else {
    throw new Error(`--store must be cursorlog or redis, got ${values.store}`);
  }
  const http = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      console.error('request failed', error);
      if (!res.headersSent) res.writeHead(500).end();
    });
  });
  http.listen(Number(values.port), '127.0.0.1', () => {
    const { port } = http.address() as AddressInfo;
    console.log(`listening on http://127.0.0.1:${port}/mcp`);
  });
  const stop = (): void => {
    http.close();
    void shutdown().finally(() => process.exit(0));
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

void main();
