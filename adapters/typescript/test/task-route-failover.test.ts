/**
 * Cross-replica task answers (issue 20 item 2) across a failover of cursorlog itself: MCP
 * replicas A, B and C on a 3-member cursorlog cluster. The tool on A asks for elicitation;
 * once the request is queued and A watches the task, the cursorlog LEADER is SIGKILLed; the
 * client fetches the request through B's `tasks/result` and answers to C once a new leader
 * is elected. A must re-watch the task on the new leader and resume with the answer exactly
 * once, and the result must come through B.
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { once } from 'node:events';
import { afterEach, describe, it } from 'node:test';
import { CreateTaskResultSchema } from '@modelcontextprotocol/sdk/experimental/tasks';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import * as grpc from '@grpc/grpc-js';
import { CursorlogClient, CursorlogError } from '../src/client.js';
import { CursorlogCluster } from './harness.js';
import { connect, inboundLeft, replicas, within, type Target, type TaskReplica } from './task-replicas.js';

/** Hang guard of every wait: an election on a loaded 2-core machine can take seconds. */
const GUARD_MS = 60_000;

let teardown: (() => Promise<void>)[] = [];

afterEach(async () => {
  const steps = teardown.reverse();
  teardown = [];
  for (const step of steps) await step().catch(() => undefined);
});

/** The member that leads now: the one a write (an idempotent OpenSession) succeeded on. */
async function leaderOf(probe: CursorlogClient): Promise<string> {
  await probe.call('OpenSession', { session: `probe-${randomUUID()}` });
  return probe.router.current;
}

describe('a task answer routed across a failover of cursorlog (issue 20 item 2)', () => {
  it('leader SIGKILLed while A waits: the request comes through B, the answer through C after the election; A resumes once', async () => {
    const cluster = await CursorlogCluster.start();
    teardown.push(() => cluster.stop());
    const probe = new CursorlogClient({ address: cluster.list, deadlineMs: GUARD_MS });
    teardown.push(async () => probe.close());
    // Unary calls ride out the election within their deadline: generous, for a loaded machine.
    const r: Record<Target, TaskReplica> = await replicas(cluster.list, true, { deadlineMs: GUARD_MS });
    teardown.push(() => Promise.all(Object.values(r).map((x) => x.stop())).then(() => undefined));

    // The client answers only once the test saw a new leader elected.
    let elected!: () => void;
    const newLeader = new Promise<void>((resolve) => {
      elected = resolve;
    });
    const handled: string[] = [];
    const { client, transport, elicited } = await connect(r, { answer: () => ['C'] }, async () => {
      await newLeader;
      handled.push('answered');
      return { action: 'accept', content: { name: 'Ada' } };
    });
    teardown.push(() => client.close());

    const watching = once(r.A.queue.answerEvents, 'view');
    const { task } = await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 120_000 } } }, CreateTaskResultSchema);
    assert.equal(r.A.asked.length, 1, 'the tool ran on A');
    await within(watching, GUARD_MS, "A's watch of the task");
    assert.equal(r.A.queue.watching, 1);

    const leader = await within(leaderOf(probe), GUARD_MS, 'the leader');
    const reopened = once(r.A.queue.answerEvents, 'reopen');
    await cluster.kill(leader);

    // The client fetches the request through B while the election goes on.
    const result = client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema);
    result.catch(() => undefined);
    const next = await within(leaderOf(probe), GUARD_MS, 'a new leader');
    assert.notEqual(next, leader);
    elected();

    const got = await within(result, GUARD_MS, 'the task result through B');
    assert.deepEqual(got.content, [{ type: 'text', text: 'hello Ada from A' }]);
    assert.deepEqual(await within(r.A.asked[0]!.answer, GUARD_MS, "the tool's answer"), { action: 'accept', content: { name: 'Ada' } });
    await within(reopened, GUARD_MS, "A's watch re-opened after the kill");
    // Exactly once: one request shown to the client, one answer routed by C, one delivered on A.
    assert.deepEqual(elicited, ['your name?']);
    assert.deepEqual(handled, ['answered']);
    assert.ok(r.B.posts.includes('tasks/result') && !r.A.posts.includes('tasks/result'), `A ${r.A.posts} B ${r.B.posts}`);
    assert.deepEqual(r.C.posts, ['answer']);
    assert.equal(r.C.queue.answerStats.routed, 1);
    assert.equal(r.A.queue.answerStats.delivered, 1);
    assert.equal(r.A.queue.answerStats.unmatched, 0);
    assert.ok(r.A.queue.answerStats.reopened >= 1, `A re-watched (${r.A.queue.answerStats.reopened})`);
    assert.equal(r.B.asked.length + r.C.asked.length, 0);
    await within(r.A.queue.whenIdle(), GUARD_MS, "A's watch to end");
    assert.equal(await inboundLeft(r.A, transport.sessionId!, task.taskId), 0, 'nothing left in the inbound queue');
  });

  for (const side of ['A dequeues', 'C routes'] as const) {
    it(`leader SIGKILLed while ${side} the answer (outcome unknown): A resumes once, nothing is left queued`, async () => {
      const cluster = await CursorlogCluster.start();
      teardown.push(() => cluster.stop());
      const probe = new CursorlogClient({ address: cluster.list, deadlineMs: GUARD_MS });
      teardown.push(async () => probe.close());
      const r: Record<Target, TaskReplica> = await replicas(cluster.list, true, { deadlineMs: GUARD_MS });
      teardown.push(() => Promise.all(Object.values(r).map((x) => x.stop())).then(() => undefined));
      const leader = await within(leaderOf(probe), GUARD_MS, 'the leader');
      // The kill goes out with the call: it may be applied before the leader dies, or not.
      let killed: Promise<void> | undefined;
      const grpcX = side === 'A dequeues' ? r.A.cursorlog.client : r.C.cursorlog.client;
      const rpcX = side === 'A dequeues' ? 'DequeueTaskMessages' : 'RouteTaskMessage';
      const call = grpcX.call.bind(grpcX);
      grpcX.call = ((rpc: string, request: { channel?: number }) => {
        const response = call(rpc as never, request as never);
        if (rpc === rpcX && (rpc === 'RouteTaskMessage' || request.channel === 1) && killed === undefined) killed = cluster.kill(leader);
        return response;
      }) as typeof grpcX.call;
      const { client, transport, elicited } = await connect(r, { answer: () => ['C'] }, () => ({ action: 'accept', content: { name: 'Eve' } }));
      teardown.push(() => client.close());

      const { task } = await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 120_000 } } }, CreateTaskResultSchema);
      const failed = r.A.asked[0]!.answer.then(() => new Promise<never>(() => {}));
      const got = await within(Promise.race([client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema), failed]), GUARD_MS, 'the task result through B');
      assert.deepEqual(got.content, [{ type: 'text', text: 'hello Eve from A' }]);
      assert.ok(killed !== undefined, `the leader was killed as ${side}`);
      await killed;
      assert.deepEqual(elicited, ['your name?']);
      assert.equal(r.C.queue.answerStats.routed, 1);
      assert.equal(r.A.queue.answerStats.delivered, 1);
      assert.equal(r.A.queue.answerStats.unmatched, 0);
      await within(r.A.queue.whenIdle(), GUARD_MS, "A's watch to end");
      assert.notEqual(await within(leaderOf(probe), GUARD_MS, 'a new leader'), leader);
      assert.equal(await inboundLeft(r.A, transport.sessionId!, task.taskId), 0, 'nothing left in the inbound queue');
    });
  }

  it("a dequeue of the answer whose response was lost: A's re-watch resends its token (a new one found nothing: the answer was lost)", async () => {
    const cluster = await CursorlogCluster.start();
    teardown.push(() => cluster.stop());
    const r: Record<Target, TaskReplica> = await replicas(cluster.list, true, { deadlineMs: GUARD_MS });
    teardown.push(() => Promise.all(Object.values(r).map((x) => x.stop())).then(() => undefined));
    const grpcA = r.A.cursorlog.client;
    const call = grpcA.call.bind(grpcA);
    const tokens: string[] = [];
    grpcA.call = (async (rpc: string, request: { channel?: number; token?: string }) => {
      const response = await call(rpc as never, request as never);
      if (rpc === 'DequeueTaskMessages' && request.channel === 1) {
        tokens.push(request.token ?? '');
        // Applied, but the response lost past the client's retries: the outcome is unknown to A.
        if (tokens.length === 1) throw new CursorlogError(rpc, grpc.status.UNAVAILABLE, 'response lost (test)');
      }
      return response;
    }) as typeof grpcA.call;
    const { client } = await connect(r, { answer: () => ['C'] }, () => ({ action: 'accept', content: { name: 'Flo' } }));
    teardown.push(() => client.close());
    const { task } = await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 120_000 } } }, CreateTaskResultSchema);
    const failed = r.A.asked[0]!.answer.then(() => new Promise<never>(() => {}));
    const got = await within(Promise.race([client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema), failed]), GUARD_MS, 'the task result');
    assert.deepEqual(got.content, [{ type: 'text', text: 'hello Flo from A' }]);
    assert.deepEqual(tokens, [tokens[0], tokens[0]], 'the same token twice');
    assert.equal(r.A.queue.answerStats.delivered, 1);
    assert.ok(r.A.queue.answerStats.reopened >= 1);
  });
});
