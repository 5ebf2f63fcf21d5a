/**
 * Test helpers of the cross-replica task answer tests (test/task-route*.test.ts): in-process
 * MCP replicas (`CursorlogSessions`, each with its own cursorlog connection, task store and
 * `CursorlogTaskMessageQueue`), a load balancer `fetch` that sends each kind of POST to a
 * chosen replica, and a client whose elicitation handler the test supplies.
 */
import { createServer, type Server as HttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { ElicitRequestSchema, type ElicitResult } from '@modelcontextprotocol/sdk/types.js';
import { Cursorlog, type CursorlogOptions } from '../src/core.js';
import { CursorlogSessions } from '../src/sessions.js';
import { CursorlogTaskMessageQueue } from '../src/task-queue.js';
import { CursorlogTaskStore } from '../src/tasks.js';

const quiet = (): void => {};

/** What a tool on a replica did with its elicitation. */
export interface Asked {
  taskId: string;
  answer: Promise<ElicitResult>;
}

/** One replica: `CursorlogSessions` with a task store and queue of its own, in this process. */
export class TaskReplica {
  readonly cursorlog: Cursorlog;
  readonly store: CursorlogTaskStore;
  readonly queue: CursorlogTaskMessageQueue;
  readonly sessions: CursorlogSessions;
  /** What each POST carried: a method, or `answer` for a JSON-RPC response. */
  readonly posts: string[] = [];
  /** The SDK's `onerror` of this replica's servers. */
  readonly errors: string[] = [];
  readonly asked: Asked[] = [];
  /** The `timeout` of the tool's elicitation, ms. */
  elicitTimeoutMs = 60_000;
  private http!: HttpServer;
  url = '';

  constructor(
    readonly name: string,
    address: string,
    routing: boolean,
    options: Partial<CursorlogOptions> = {},
  ) {
    this.cursorlog = new Cursorlog({ address, logger: quiet, ...options });
    this.store = new CursorlogTaskStore(this.cursorlog.client);
    this.queue = new CursorlogTaskMessageQueue(this.cursorlog.client, { logger: quiet });
    this.sessions = new CursorlogSessions(this.cursorlog, {
      createServer: () => this.server(),
      ...(routing ? { taskMessageQueue: this.queue } : {}),
    });
  }

  private server(): McpServer {
    const server = new McpServer(
      { name: `replica-${this.name}`, version: '1.0.0' },
      { capabilities: { tasks: { requests: { tools: { call: {} } }, list: {}, cancel: {} } }, taskStore: this.store, taskMessageQueue: this.queue },
    );
    server.server.onerror = (error) => this.errors.push(error.message);
    server.experimental.tasks.registerToolTask(
      'ask',
      { description: 'asks the client for a name, then greets it', execution: { taskSupport: 'required' } },
      {
        createTask: async (extra) => {
          const task = await extra.taskStore.createTask({ ttl: 60_000, pollInterval: 50 });
          const sessionId = extra.sessionId;
          // The work goes on after createTask answered: ask the client, related to the task.
          const answer = server.server.elicitInput(
            { message: 'your name?', requestedSchema: { type: 'object', properties: { name: { type: 'string' } }, required: ['name'] } },
            { relatedTask: { taskId: task.taskId }, timeout: this.elicitTimeoutMs },
          );
          this.asked.push({ taskId: task.taskId, answer });
          void answer.then(
            (r) => this.store.storeTaskResult(task.taskId, 'completed', { content: [{ type: 'text', text: `hello ${String(r.content?.['name'])} from ${this.name}` }] }, sessionId),
            () => undefined,
          );
          return { task };
        },
        getTask: async (extra) => extra.taskStore.getTask(extra.taskId),
        getTaskResult: async (extra) => (await extra.taskStore.getTaskResult(extra.taskId)) as never,
      },
    );
    return server;
  }

  async start(): Promise<void> {
    this.http = createServer((req, res) => {
      void (async () => {
        const chunks: Buffer[] = [];
        for await (const chunk of req) chunks.push(chunk as Buffer);
        const body = chunks.length === 0 ? undefined : (JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown);
        for (const m of Array.isArray(body) ? body : body === undefined ? [] : [body]) {
          this.posts.push((m as { method?: string }).method ?? 'answer');
        }
        await this.sessions.handleRequest(req, res, body);
      })().catch((error: unknown) => {
        res.statusCode = 500;
        res.end(String(error));
      });
    });
    await new Promise<void>((r) => this.http.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.http.address() as AddressInfo).port}/mcp`;
  }

  async stop(): Promise<void> {
    this.http.closeAllConnections();
    await new Promise((r) => this.http.close(r));
    await this.sessions.close();
    await this.cursorlog.close();
  }
}

export type Target = 'A' | 'B' | 'C';

/** Where the load balancer sends each kind of POST (n: how many of that kind went before). */
export interface Routes {
  /** `tools/call` (and everything else but tasks/* and answers). */
  call?: (n: number) => Target;
  /** `tasks/*`. */
  tasks?: Target;
  /** An answer: every target in turn, as a client resending a POST whose response it lost. */
  answer: (n: number) => Target[];
}

/** The load balancer; by default the issue's case: tasks/* to B, the rest to A. */
export function balancer(replicas: Record<Target, TaskReplica>, routes: Routes): typeof fetch {
  let answers = 0;
  let calls = 0;
  return async (input, init) => {
    const body = typeof init?.body === 'string' ? (JSON.parse(init.body) as { method?: string; result?: unknown; error?: unknown }) : undefined;
    if (body !== undefined && body.method === undefined && ('result' in body || 'error' in body)) {
      let last: Response | undefined;
      for (const t of routes.answer(answers++)) {
        last = await fetch(replicas[t].url, init);
        if (last.status !== 202) return last;
      }
      return last!;
    }
    if (body?.method?.startsWith('tasks/')) return fetch(replicas[routes.tasks ?? 'B'].url, init);
    const target = body?.method === 'tools/call' && routes.call !== undefined ? routes.call(calls++) : 'A';
    return fetch(replicas[target].url, init);
  };
}

/** Fails with `what` if `p` has not settled within `ms` (the answer never reached the task). */
export function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

/** Replicas A, B and C on the cursorlog at `address` (one address, or a cluster's member list). */
export async function replicas(address: string, routing = true, options: Partial<CursorlogOptions> = {}): Promise<Record<Target, TaskReplica>> {
  const r = {
    A: new TaskReplica('A', address, routing, options),
    B: new TaskReplica('B', address, routing, options),
    C: new TaskReplica('C', address, routing, options),
  };
  await Promise.all(Object.values(r).map((x) => x.start()));
  return r;
}

export async function connect(replicas: Record<Target, TaskReplica>, routes: Routes, onElicit: () => ElicitResult | Promise<ElicitResult>) {
  const client = new Client({ name: 'task-route', version: '1.0.0' }, { capabilities: { elicitation: { form: {} } } });
  const elicited: unknown[] = [];
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    elicited.push(request.params.message);
    return onElicit();
  });
  const transport = new StreamableHTTPClientTransport(new URL(replicas.A.url), { fetch: balancer(replicas, routes) });
  await client.connect(transport);
  return { client, transport, elicited };
}

/** The task's inbound queue in cursorlog, taken: what an answer left behind. */
export async function inboundLeft(r: TaskReplica, sessionId: string, taskId: string): Promise<number> {
  const left = await r.cursorlog.client.call('DequeueTaskMessages', { owner: `s:${sessionId}`, taskId, channel: 1, maxMessages: 0, token: `check-${taskId}` });
  return (left.messages ?? []).length;
}
