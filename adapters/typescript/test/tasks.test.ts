/**
 * `CursorlogTaskStore` against the real cursorlog binary: every `TaskStore` method with its
 * errors, and the test (issue 20 item 2): two SDK server replicas A and B, each with
 * its own store on the same cursorlog, and a real SDK client whose task-augmented tool call is
 * created on A, polled with `tasks/get` on B, and whose result comes through `tasks/result`
 * on B.
 */
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server as HttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CreateTaskResultSchema } from '@modelcontextprotocol/sdk/experimental/tasks';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { CallToolResultSchema, LoggingMessageNotificationSchema, type Request } from '@modelcontextprotocol/sdk/types.js';
import { CursorlogClient } from '../src/client.js';
import { isIdempotent } from '../src/router.js';
import { CursorlogTaskMessageQueue, TaskQueueFullError } from '../src/task-queue.js';
import { CursorlogTaskStore, TaskStoreError } from '../src/tasks.js';
import { CursorlogServer, waitFor } from './harness.js';

let cursorlog: CursorlogServer;
let grpc: CursorlogClient;
let store: CursorlogTaskStore;

const REQUEST: Request = { method: 'tools/call', params: { name: 'x', arguments: {} } };
const isTerminalError = (e: unknown): boolean => e instanceof TaskStoreError && e.reason === 'terminal';

before(async () => {
  cursorlog = await CursorlogServer.start();
  grpc = new CursorlogClient({ address: cursorlog.address });
  store = new CursorlogTaskStore(grpc);
});

after(async () => {
  grpc?.close();
  await cursorlog?.stop();
});

describe('Tasks retry classes (router)', () => {
  it('resends reads, CreateTask, FinishTask, AnswerInput, CancelTask; not a blind UpdateTask, RequestInput or DeleteTask', () => {
    for (const rpc of ['GetTask', 'ListTasks', 'CreateTask', 'FinishTask', 'AnswerInput', 'CancelTask', 'KeepAliveTask']) assert.ok(isIdempotent(rpc, {}), rpc);
    for (const rpc of ['UpdateTask', 'RequestInput', 'DeleteTask']) assert.ok(!isIdempotent(rpc, {}), rpc);
    assert.ok(isIdempotent('UpdateTask', { expectedVersion: '3' }), 'a compare-and-set update');
  });
});

describe('CursorlogTaskStore', () => {
  it('createTask: a working task with a UUID id, the asked ttl and poll interval, ISO times', async () => {
    const task = await store.createTask({ ttl: 60_000, pollInterval: 250 }, 1, REQUEST, 'sess-1');
    assert.match(task.taskId, /^[0-9a-f-]{36}$/);
    assert.equal(task.status, 'working');
    assert.equal(task.ttl, 60_000);
    assert.equal(task.pollInterval, 250);
    assert.ok(Math.abs(Date.parse(task.createdAt) - Date.now()) < 60_000, task.createdAt);
    assert.equal(task.lastUpdatedAt, task.createdAt);
    assert.deepEqual(await store.getTask(task.taskId, 'sess-1'), task);
  });

  it('createTask is idempotent by request id within a session, not across sessions', async () => {
    const first = await store.createTask({}, 'req-7', REQUEST, 'sess-idem');
    const again = await store.createTask({}, 'req-7', REQUEST, 'sess-idem');
    assert.equal(again.taskId, first.taskId);
    assert.equal(first.pollInterval, 1000, 'the SDK default poll interval');
    const other = await store.createTask({}, 'req-7', REQUEST, 'sess-other');
    assert.notEqual(other.taskId, first.taskId);
    // Without a session, every client shares owner "" and counts request ids from 0: no dedup across calls.
    const s1 = await store.createTask({}, 1, REQUEST);
    const s2 = await store.createTask({}, 1, REQUEST);
    assert.notEqual(s1.taskId, s2.taskId);
  });

  it("getTask: another session's task, an unknown id and a sessionless lookup of a session's task are null", async () => {
    const task = await store.createTask({}, 1, REQUEST, 'sess-a');
    assert.equal(await store.getTask(task.taskId, 'sess-b'), null);
    assert.equal(await store.getTask(task.taskId), null);
    assert.equal(await store.getTask('no-such-task', 'sess-a'), null);
    assert.equal((await store.getTask(task.taskId, 'sess-a'))?.taskId, task.taskId);
  });

  it('updateTaskStatus: working <-> input_required with messages; a terminal status ends it; then every write throws', async () => {
    const task = await store.createTask({}, 1, REQUEST, 'sess-upd');
    await store.updateTaskStatus(task.taskId, 'input_required', 'need a name', 'sess-upd');
    let now = await store.getTask(task.taskId, 'sess-upd');
    assert.equal(now?.status, 'input_required');
    assert.equal(now?.statusMessage, 'need a name');
    await store.updateTaskStatus(task.taskId, 'working', undefined, 'sess-upd');
    now = await store.getTask(task.taskId, 'sess-upd');
    assert.equal(now?.status, 'working');
    assert.equal(now?.statusMessage, 'need a name', 'an absent message keeps the last one');
    await store.updateTaskStatus(task.taskId, 'cancelled', 'Client cancelled task execution.', 'sess-upd');
    now = await store.getTask(task.taskId, 'sess-upd');
    assert.equal(now?.status, 'cancelled');
    assert.equal(now?.statusMessage, 'Client cancelled task execution.');
    await assert.rejects(store.updateTaskStatus(task.taskId, 'working', undefined, 'sess-upd'), isTerminalError);
    await assert.rejects(store.updateTaskStatus(task.taskId, 'failed', 'late', 'sess-upd'), isTerminalError);
    await assert.rejects(store.storeTaskResult(task.taskId, 'completed', { content: [] }, 'sess-upd'), isTerminalError);
    await assert.rejects(store.getTaskResult(task.taskId, 'sess-upd'), (e: unknown) => e instanceof TaskStoreError && e.reason === 'no-result');
  });

  it("writes to another session's task are 'not found' and change nothing", async () => {
    const task = await store.createTask({}, 1, REQUEST, 'sess-own');
    const notFound = (e: unknown): boolean => e instanceof TaskStoreError && e.reason === 'not-found';
    await assert.rejects(store.updateTaskStatus(task.taskId, 'input_required', 'x', 'sess-thief'), notFound);
    await assert.rejects(store.storeTaskResult(task.taskId, 'completed', { content: [] }, 'sess-thief'), notFound);
    await assert.rejects(store.getTaskResult(task.taskId, 'sess-thief'), notFound);
    assert.equal((await store.getTask(task.taskId, 'sess-own'))?.status, 'working');
  });

  it('storeTaskResult: status and result in one write; getTaskResult returns it; a second store throws', async () => {
    const task = await store.createTask({ ttl: 30_000 }, 2, REQUEST, 'sess-res');
    await assert.rejects(store.getTaskResult(task.taskId, 'sess-res'), (e: unknown) => e instanceof TaskStoreError && e.reason === 'no-result');
    const result = { content: [{ type: 'text', text: 'hello' }], isError: true, structuredContent: { n: 1 } };
    await store.storeTaskResult(task.taskId, 'failed', result, 'sess-res');
    const ended = await store.getTask(task.taskId, 'sess-res');
    assert.equal(ended?.status, 'failed');
    assert.deepEqual(await store.getTaskResult(task.taskId, 'sess-res'), result);
    await assert.rejects(store.storeTaskResult(task.taskId, 'completed', { content: [] }, 'sess-res'), isTerminalError);
  });

  it('listTasks: pages of 10 in creation order with an opaque cursor, only the caller\'s own; a bad cursor throws', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 23; i++) ids.push((await store.createTask({}, i, REQUEST, 'sess-list')).taskId);
    await store.createTask({}, 99, REQUEST, 'sess-list-other');
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const page = await store.listTasks(cursor, 'sess-list');
      pages += 1;
      assert.ok(page.tasks.length <= 10);
      seen.push(...page.tasks.map((t) => t.taskId));
      cursor = page.nextCursor;
    } while (cursor !== undefined);
    assert.deepEqual(seen, ids);
    assert.equal(pages, 3);
    assert.deepEqual((await store.listTasks(undefined, 'sess-nobody')).tasks, []);
    await assert.rejects(store.listTasks('not-a-cursor!', 'sess-list'));
  });
});

describe('CursorlogTaskMessageQueue', () => {
  const queue = (): CursorlogTaskMessageQueue => new CursorlogTaskMessageQueue(grpc);
  const note = (n: number) => ({ type: 'notification' as const, message: { jsonrpc: '2.0' as const, method: 'notifications/message', params: { level: 'info', data: n } }, timestamp: 1000 + n });

  it('FIFO per task: dequeue takes the oldest, dequeueAll the rest in order, an empty queue answers undefined at once', async () => {
    const q = queue();
    const task = await store.createTask({}, 1, REQUEST, 'sess-q');
    const other = await store.createTask({}, 2, REQUEST, 'sess-q');
    const request = { type: 'request' as const, message: { jsonrpc: '2.0' as const, id: 42, method: 'elicitation/create', params: { message: 'name?', requestedSchema: { type: 'object' as const, properties: {} } } }, timestamp: 5 };
    await q.enqueue(task.taskId, note(1), 'sess-q');
    await q.enqueue(other.taskId, note(100), 'sess-q');
    await q.enqueue(task.taskId, request, 'sess-q');
    await q.enqueue(task.taskId, note(3), 'sess-q');
    assert.deepEqual(await q.dequeue(task.taskId, 'sess-q'), note(1));
    assert.deepEqual(await q.dequeueAll(task.taskId, 'sess-q'), [request, note(3)]);
    assert.equal(await q.dequeue(task.taskId, 'sess-q'), undefined);
    assert.deepEqual(await q.dequeueAll(task.taskId, 'sess-q'), []);
    assert.deepEqual(await q.dequeueAll(other.taskId, 'sess-q'), [note(100)]);
  });

  it('maxSize: a full queue throws, and takes messages again once drained', async () => {
    const q = queue();
    const task = await store.createTask({}, 3, REQUEST, 'sess-q');
    await q.enqueue(task.taskId, note(1), 'sess-q', 2);
    await q.enqueue(task.taskId, note(2), 'sess-q', 2);
    await assert.rejects(q.enqueue(task.taskId, note(3), 'sess-q', 2), TaskQueueFullError);
    await assert.rejects(q.enqueue(task.taskId, note(3), 'sess-q', 0), TaskQueueFullError);
    assert.deepEqual(await q.dequeue(task.taskId, 'sess-q'), note(1));
    await q.enqueue(task.taskId, note(3), 'sess-q', 2);
    assert.deepEqual(await q.dequeueAll(task.taskId, 'sess-q'), [note(2), note(3)]);
  });

  it("another session's task: enqueue is 'not found', dequeue finds nothing and leaves the owner's messages", async () => {
    const q = queue();
    const task = await store.createTask({}, 4, REQUEST, 'sess-q-owner');
    await q.enqueue(task.taskId, note(1), 'sess-q-owner');
    await assert.rejects(q.enqueue(task.taskId, note(2), 'sess-q-thief'), (e: unknown) => e instanceof TaskStoreError && e.reason === 'not-found');
    assert.equal(await q.dequeue(task.taskId, 'sess-q-thief'), undefined);
    assert.deepEqual(await q.dequeueAll(task.taskId, 'sess-q-thief'), []);
    assert.equal(await q.dequeue('no-such-task', 'sess-q-owner'), undefined);
    assert.deepEqual(await q.dequeueAll(task.taskId, 'sess-q-owner'), [note(1)]);
  });
});

/** One SDK server replica: stateless Streamable HTTP (a server and transport per request), its own store. */
class SdkReplica {
  readonly methods: string[] = [];
  private http!: HttpServer;
  url = '';

  constructor(
    readonly name: string,
    readonly store: CursorlogTaskStore,
    private readonly onTool: (taskId: string, server: McpServer) => void,
    readonly queue?: CursorlogTaskMessageQueue,
  ) {}

  private server(): McpServer {
    const server = new McpServer(
      { name: `replica-${this.name}`, version: '1.0.0' },
      {
        capabilities: { logging: {}, tasks: { requests: { tools: { call: {} } }, list: {}, cancel: {} } },
        taskStore: this.store,
        ...(this.queue !== undefined ? { taskMessageQueue: this.queue, maxTaskQueueSize: 8 } : {}),
      },
    );
    server.experimental.tasks.registerToolTask(
      'slow',
      { description: 'ends when the test says so', execution: { taskSupport: 'required' } },
      {
        createTask: async (extra) => {
          const task = await extra.taskStore.createTask({ ttl: extra.taskRequestedTtl ?? 60_000, pollInterval: 50 });
          this.onTool(task.taskId, server);
          if (this.queue !== undefined) {
            // Queued through the SDK while this request's transport is connected (the SDK refuses
            // a notification on a closed server, queued or not).
            await server.server.notification({ method: 'notifications/message', params: { level: 'info', data: 'first from A' } }, { relatedTask: { taskId: task.taskId } });
          }
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
        const body = await readJson(req);
        const method = (body as { method?: string } | undefined)?.method;
        if (method !== undefined) this.methods.push(method);
        const server = this.server();
        // SSE answers: a queued notification travels on the tasks/result response stream.
        const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: this.queue === undefined });
        res.on('close', () => {
          void transport.close();
          void server.close();
        });
        await server.connect(transport);
        await transport.handleRequest(req, res, body);
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
  }
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return chunks.length === 0 ? undefined : JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

describe('two SDK replicas on one cursorlog (issue 20 item 2)', () => {
  it('a task-augmented tool call created on A is polled with tasks/get on B and its result fetched with tasks/result on B', async () => {
    // Each replica has its own gRPC client and store: nothing is shared in memory.
    const grpcA = new CursorlogClient({ address: cursorlog.address });
    const grpcB = new CursorlogClient({ address: cursorlog.address });
    const created: string[] = [];
    const a = new SdkReplica('A', new CursorlogTaskStore(grpcA), (id) => created.push(id));
    const b = new SdkReplica('B', new CursorlogTaskStore(grpcB), () => assert.fail('B ran the tool'));
    await Promise.all([a.start(), b.start()]);
    // The load balancer: tasks/* go to B, everything else to A.
    const route: typeof fetch = async (input, init) => {
      const method = typeof init?.body === 'string' ? (JSON.parse(init.body) as { method?: string }).method : undefined;
      const target = method?.startsWith('tasks/') ? b.url : a.url;
      return fetch(target, init);
    };
    const client = new Client({ name: 'tasks-e2e', version: '1.0.0' }, { capabilities: {} });
    try {
      await client.connect(new StreamableHTTPClientTransport(new URL(a.url), { fetch: route }));
      const { task } = await client.request(
        { method: 'tools/call', params: { name: 'slow', arguments: {}, task: { ttl: 60_000 } } },
        CreateTaskResultSchema,
      );
      assert.deepEqual(created, [task.taskId]);
      assert.equal(task.status, 'working');

      // B answers tasks/get from cursorlog: the task A created, still working.
      const polled = await client.experimental.tasks.getTask(task.taskId);
      assert.equal(polled.status, 'working');
      // tasks/result on B blocks until the task ends (B polls its own store every pollInterval).
      const result = client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema);

      // The worker on A moves the task and ends it through A's store.
      await a.store.updateTaskStatus(task.taskId, 'working', 'halfway');
      await waitFor('B to see the message', async () => (await client.experimental.tasks.getTask(task.taskId)).statusMessage === 'halfway');
      await waitFor('B to hold the tasks/result call', () => b.methods.includes('tasks/result'));
      await a.store.storeTaskResult(task.taskId, 'completed', { content: [{ type: 'text', text: 'done on A' }] });
      const done = await waitFor('B to see completed', async () => {
        const t = await client.experimental.tasks.getTask(task.taskId);
        return t.status === 'completed' && t;
      });
      assert.equal(done.taskId, task.taskId);
      const got = await result;
      assert.deepEqual(got.content, [{ type: 'text', text: 'done on A' }]);
      assert.equal((got._meta?.['io.modelcontextprotocol/related-task'] as { taskId?: string } | undefined)?.taskId, task.taskId);
      // And again, now that it has ended: straight from the stored result.
      const again = await client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema);
      assert.deepEqual(again.content, got.content);

      assert.ok(a.methods.includes('tools/call'));
      assert.ok(!a.methods.some((m) => m.startsWith('tasks/')), `A served ${a.methods.join(',')}`);
      assert.ok(b.methods.includes('tasks/get') && b.methods.includes('tasks/result'), `B served ${b.methods.join(',')}`);
      assert.ok(!b.methods.includes('tools/call'));
    } finally {
      await client.close();
      await Promise.all([a.stop(), b.stop()]);
      grpcA.close();
      grpcB.close();
    }
  });

  it('a notification queued for the task on A is delivered by tasks/result on B, then the result', async () => {
    const grpcA = new CursorlogClient({ address: cursorlog.address });
    const grpcB = new CursorlogClient({ address: cursorlog.address });
    const servers: McpServer[] = [];
    const a = new SdkReplica('A', new CursorlogTaskStore(grpcA), (_id, server) => servers.push(server), new CursorlogTaskMessageQueue(grpcA));
    const b = new SdkReplica('B', new CursorlogTaskStore(grpcB), () => assert.fail('B ran the tool'), new CursorlogTaskMessageQueue(grpcB));
    await Promise.all([a.start(), b.start()]);
    const route: typeof fetch = async (input, init) => {
      const method = typeof init?.body === 'string' ? (JSON.parse(init.body) as { method?: string }).method : undefined;
      return fetch(method?.startsWith('tasks/') ? b.url : a.url, init);
    };
    const client = new Client({ name: 'tasks-e2e-queue', version: '1.0.0' }, { capabilities: {} });
    const logs: unknown[] = [];
    client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
      logs.push(n.params.data);
    });
    try {
      await client.connect(new StreamableHTTPClientTransport(new URL(a.url), { fetch: route }));
      const { task } = await client.request(
        { method: 'tools/call', params: { name: 'slow', arguments: {}, task: { ttl: 60_000 } } },
        CreateTaskResultSchema,
      );
      assert.equal(servers.length, 1);
      // The worker on A, after the request's stateless server closed: straight into A's queue.
      await a.queue!.enqueue(task.taskId, {
        type: 'notification',
        message: { jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'second from A', _meta: { 'io.modelcontextprotocol/related-task': { taskId: task.taskId } } } },
        timestamp: Date.now(),
      });
      const result = client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema);
      await waitFor('both notifications through B', () => logs.length >= 2);
      assert.deepEqual(logs, ['first from A', 'second from A']);
      await a.store.storeTaskResult(task.taskId, 'completed', { content: [{ type: 'text', text: 'done after the queue' }] });
      const got = await result;
      assert.deepEqual(got.content, [{ type: 'text', text: 'done after the queue' }]);
      assert.deepEqual(logs, ['first from A', 'second from A'], 'each queued message delivered once');
      assert.ok(!a.methods.some((m) => m.startsWith('tasks/')), `A served ${a.methods.join(',')}`);
      assert.ok(b.methods.includes('tasks/result'));
      // B drained the queue when it returned the result.
      assert.deepEqual(await new CursorlogTaskMessageQueue(grpcB).dequeueAll(task.taskId), []);
    } finally {
      await client.close();
      await Promise.all([a.stop(), b.stop()]);
      grpcA.close();
      grpcB.close();
    }
  });
});
