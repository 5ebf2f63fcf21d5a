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
import { after, before, describe, it } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CreateTaskResultSchema } from '@modelcontextprotocol/sdk/experimental/tasks';
import { CallToolResultSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import * as grpc from '@grpc/grpc-js';
import { CursorlogError } from '../src/client.js';
import { TASK_REQUEST_ID_PREFIX } from '../src/task-answers.js';
import { CursorlogServer } from './harness.js';
import { balancer, connect, inboundLeft, replicas, within, type Target, type TaskReplica } from './task-replicas.js';

const PROTOCOL = '2025-11-25';
let cursorlog: CursorlogServer;

before(async () => {
  cursorlog = await CursorlogServer.start();
});

after(async () => {
  await cursorlog?.stop();
});

async function cluster(): Promise<Record<Target, TaskReplica>> {
  return replicas(cursorlog.address);
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
