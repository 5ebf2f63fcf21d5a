/**
 * Issue 20 item 2, the last piece: a client's answer to a task's elicitation reaches the task
 * whichever replica the client POSTs it to (docs/TASKS-DESIGN.md §1.6 "Inbound (channel 1)").
 * Three in-process replicas A, B, C (`CursorlogSessions`, each with its own cursorlog
 * connection, task store and `CursorlogTaskMessageQueue`) on the real cursorlog binary, and a
 * real SDK client behind a routing `fetch`: the tool runs as a task on A and asks for
 * elicitation, the client gets the request through `tasks/result` on B and POSTs its answer
 * to C; the tool on A resumes with it.
 */
import assert from 'node:assert/strict';
import { createServer, type Server as HttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CreateTaskResultSchema } from '@modelcontextprotocol/sdk/experimental/tasks';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { CallToolResultSchema, ElicitRequestSchema, type ElicitResult } from '@modelcontextprotocol/sdk/types.js';
import * as grpc from '@grpc/grpc-js';
import { CursorlogError } from '../src/client.js';
import { Cursorlog } from '../src/core.js';
import { CursorlogSessions } from '../src/sessions.js';
import { TASK_REQUEST_ID_PREFIX } from '../src/task-answers.js';
import { CursorlogTaskMessageQueue } from '../src/task-queue.js';
import { CursorlogTaskStore } from '../src/tasks.js';
import { CursorlogServer } from './harness.js';

const PROTOCOL = '2025-11-25';
const quiet = (): void => {};
let cursorlog: CursorlogServer;

before(async () => {
  cursorlog = await CursorlogServer.start();
});

after(async () => {
  await cursorlog?.stop();
});

/** What a tool on a replica did with its elicitation. */
interface Asked {
  taskId: string;
  answer: Promise<ElicitResult>;
}

/** One replica: `CursorlogSessions` with a task store and queue of its own, in this process. */
class TaskReplica {
  readonly cursorlog: Cursorlog;
  readonly store: CursorlogTaskStore;
  readonly queue: CursorlogTaskMessageQueue;
  readonly sessions: CursorlogSessions;
  /** What each POST carried: a method, or `answer` for a JSON-RPC response. */
  readonly posts: string[] = [];
  /** The SDK's `onerror` of this replica's servers. */
  readonly errors: string[] = [];
  readonly asked: Asked[] = [];
  private http!: HttpServer;
  url = '';

  constructor(
    readonly name: string,
    address: string,
    routing: boolean,
  ) {
    this.cursorlog = new Cursorlog({ address, logger: quiet });
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
            { relatedTask: { taskId: task.taskId }, timeout: 60_000 },
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

type Target = 'A' | 'B' | 'C';

/** Where the load balancer sends each kind of POST (n: how many of that kind went before). */
interface Routes {
  /** `tools/call` (and everything else but tasks/* and answers). */
  call?: (n: number) => Target;
  /** `tasks/*`. */
  tasks?: Target;
  /** An answer: every target in turn, as a client resending a POST whose response it lost. */
  answer: (n: number) => Target[];
}

/** The load balancer; by default the issue's case: tasks/* to B, the rest to A. */
function balancer(replicas: Record<Target, TaskReplica>, routes: Routes): typeof fetch {
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
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

async function cluster(routing = true): Promise<Record<Target, TaskReplica>> {
  const r = {
    A: new TaskReplica('A', cursorlog.address, routing),
    B: new TaskReplica('B', cursorlog.address, routing),
    C: new TaskReplica('C', cursorlog.address, routing),
  };
  await Promise.all(Object.values(r).map((x) => x.start()));
  return r;
}

async function connect(replicas: Record<Target, TaskReplica>, routes: Routes, onElicit: () => ElicitResult) {
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
async function inboundLeft(r: TaskReplica, sessionId: string, taskId: string): Promise<number> {
  const left = await r.cursorlog.client.call('DequeueTaskMessages', { owner: `s:${sessionId}`, taskId, channel: 1, maxMessages: 0, token: `check-${taskId}` });
  return (left.messages ?? []).length;
}

describe('an answer to a task request, posted to another replica (issue 20 item 2)', () => {
  it('tool on A asks; the client gets the request via tasks/result on B, answers to C; A resumes; the result comes through B', async () => {
    const r = await cluster();
    const { client, transport, elicited } = await connect(r, { answer: () => ['C'] }, () => ({ action: 'accept', content: { name: 'Ada' } }));
    try {
      const { task } = await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 60_000 } } }, CreateTaskResultSchema);
      assert.equal(r.A.asked.length, 1, 'the tool ran on A');
      const result = await within(client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema), 20_000, 'the task result');
      assert.deepEqual(result.content, [{ type: 'text', text: 'hello Ada from A' }]);
      assert.deepEqual(await r.A.asked[0]!.answer, { action: 'accept', content: { name: 'Ada' } });
      assert.deepEqual(elicited, ['your name?']);
      // Who did what: A ran the tool and got the answer from cursorlog; B served tasks/result; C routed the answer.
      assert.ok(r.B.posts.includes('tasks/result') && !r.A.posts.includes('tasks/result'), `A ${r.A.posts} B ${r.B.posts}`);
      assert.deepEqual(r.C.posts, ['answer']);
      assert.equal(r.C.queue.answerStats.routed, 1);
      assert.equal(r.A.queue.answerStats.delivered, 1);
      assert.equal(r.A.queue.answerStats.unmatched, 0);
      assert.equal(r.B.asked.length + r.C.asked.length, 0);
      // The SDK on C saw no stray response (the routed answer was taken out of the POST).
      assert.deepEqual(r.C.errors.filter((e) => e.includes('unknown message ID')), []);
      // A's watch of the task ended with its last waiting request; nothing is left in the inbound queue.
      await r.A.queue.whenIdle();
      assert.equal(await inboundLeft(r.A, transport.sessionId!, task.taskId), 0);
      // And once more, through C, now that the task has ended.
      const again = await client.experimental.tasks.getTask(task.taskId);
      assert.equal(again.status, 'completed');
    } finally {
      await client.close();
      await Promise.all(Object.values(r).map((x) => x.stop()));
    }
  });

  it('a resent answer POST (first to C, again to B) reaches the task once', async () => {
    const r = await cluster();
    const { client, transport } = await connect(r, { answer: () => ['C', 'B'] }, () => ({ action: 'accept', content: { name: 'Bo' } }));
    try {
      const { task } = await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 60_000 } } }, CreateTaskResultSchema);
      const result = await within(client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema), 20_000, 'the task result');
      assert.deepEqual(result.content, [{ type: 'text', text: 'hello Bo from A' }]);
      assert.deepEqual(r.C.posts, ['answer']);
      assert.ok(r.B.posts.includes('answer'), `B ${r.B.posts}`);
      assert.equal(r.C.queue.answerStats.routed, 1);
      // The resend: cursorlog answers `duplicate` (the same task and place, nothing written).
      assert.deepEqual([r.B.queue.answerStats.routed, r.B.queue.answerStats.duplicates, r.B.queue.answerStats.notRouted], [1, 1, 0]);
      assert.equal(r.C.queue.answerStats.duplicates, 0);
      await r.A.queue.whenIdle();
      assert.equal(r.A.queue.answerStats.delivered, 1);
      assert.equal(r.A.queue.answerStats.unmatched, 0);
      assert.equal(await inboundLeft(r.A, transport.sessionId!, task.taskId), 0, 'the resend queued nothing');
    } finally {
      await client.close();
      await Promise.all(Object.values(r).map((x) => x.stop()));
    }
  });

  it("two replicas' servers of one session ask at once (the SDK numbers both requests 0): each answer reaches its own task", async () => {
    const r = await cluster();
    let n = 0;
    const { client } = await connect(r, { call: (i) => (i === 0 ? 'A' : 'B'), tasks: 'C', answer: () => ['A'] }, () => ({ action: 'accept', content: { name: `n${n++}` } }));
    try {
      const first = await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 60_000 } } }, CreateTaskResultSchema);
      const second = await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 60_000 } } }, CreateTaskResultSchema);
      assert.deepEqual([r.A.asked.length, r.B.asked.length], [1, 1]);
      const [a, b] = await within(
        Promise.all([
          client.experimental.tasks.getTaskResult(first.task.taskId, CallToolResultSchema),
          client.experimental.tasks.getTaskResult(second.task.taskId, CallToolResultSchema),
        ]),
        20_000,
        'both task results',
      );
      const textOf = (x: typeof a): string => (x.content[0] as { text: string }).text;
      assert.match(textOf(a), /^hello n[01] from A$/);
      assert.match(textOf(b), /^hello n[01] from B$/);
      assert.notEqual(textOf(a).split(' ')[1], textOf(b).split(' ')[1], 'each task got its own answer');
      // Both answers were posted to A: one routed to A's own task, one to B's.
      assert.equal(r.A.queue.answerStats.routed, 2);
      assert.deepEqual([r.A.queue.answerStats.delivered, r.B.queue.answerStats.delivered], [1, 1]);
      assert.equal(r.A.queue.answerStats.unmatched + r.B.queue.answerStats.unmatched, 0);
    } finally {
      await client.close();
      await Promise.all(Object.values(r).map((x) => x.stop()));
    }
  });

  it('an answer with an id nobody asked is left to the SDK (202 and its "unknown message ID"), not swallowed; a route that cannot be asked is 503', async () => {
    const r = await cluster();
    const { client, transport } = await connect(r, { answer: () => ['C'] }, () => ({ action: 'decline' }));
    try {
      const headers = {
        accept: 'application/json, text/event-stream',
        'content-type': 'application/json',
        'mcp-session-id': transport.sessionId!,
        'mcp-protocol-version': PROTOCOL,
      };
      for (const id of [`${TASK_REQUEST_ID_PREFIX}00000000-0000-4000-8000-000000000000`, 4242]) {
        const response = await fetch(r.C.url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id, result: { action: 'decline' } }) });
        assert.equal(response.status, 202);
        assert.ok(r.C.errors.some((e) => e.includes('unknown message ID') && e.includes(JSON.stringify(id))), `C errors: ${r.C.errors.join(' | ')}`);
      }
      assert.equal(r.C.queue.answerStats.notRouted, 2);
      assert.equal(r.C.queue.answerStats.routed, 0);
      // When cursorlog cannot be asked, the POST fails visibly (503), not the SDK's silent 202.
      const grpcC = r.C.cursorlog.client;
      const call = grpcC.call.bind(grpcC);
      grpcC.call = (async (rpc: string, request: unknown) => {
        if (rpc === 'RouteTaskMessage') throw new CursorlogError(rpc, grpc.status.UNAVAILABLE, 'cursorlog is down (test)');
        return call(rpc as never, request as never);
      }) as typeof grpcC.call;
      const errorsBefore = r.C.errors.length;
      const refused = await fetch(r.C.url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: `${TASK_REQUEST_ID_PREFIX}x`, result: {} }) });
      assert.equal(refused.status, 503);
      assert.match(((await refused.json()) as { error: { message: string } }).error.message, /cannot route the answer to its task.*cursorlog is down/);
      assert.equal(r.C.errors.length, errorsBefore, 'the SDK never saw it');
    } finally {
      await client.close();
      await Promise.all(Object.values(r).map((x) => x.stop()));
    }
  });

  it('a task that ends while its request waits fails the request as the SDK does, and A stops watching', async () => {
    const r = await cluster();
    // The client never answers: its handler waits until the test ends.
    let release: () => void = () => {};
    const never = new Promise<void>((resolve) => {
      release = resolve;
    });
    const client = new Client({ name: 'task-route', version: '1.0.0' }, { capabilities: { elicitation: { form: {} } } });
    let elicitedOnB!: () => void;
    const elicited = new Promise<void>((resolve) => {
      elicitedOnB = resolve;
    });
    client.setRequestHandler(ElicitRequestSchema, async () => {
      elicitedOnB();
      await never;
      return { action: 'cancel' };
    });
    await client.connect(new StreamableHTTPClientTransport(new URL(r.A.url), { fetch: balancer(r, { answer: () => ['C'] }) }));
    try {
      const { task } = await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 60_000 } } }, CreateTaskResultSchema);
      const pending = client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema).catch(() => undefined);
      await elicited;
      assert.equal(r.A.queue.watching, 1);
      await client.experimental.tasks.cancelTask(task.taskId);
      await assert.rejects(within(r.A.asked[0]!.answer, 20_000, 'the request to fail'), /Task cancelled or completed/);
      await r.A.queue.whenIdle();
      assert.equal(r.A.queue.watching, 0);
      release();
      await pending;
    } finally {
      release();
      await client.close();
      await Promise.all(Object.values(r).map((x) => x.stop()));
    }
  });
});
