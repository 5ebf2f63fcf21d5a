/**
 * How replica A's watch of a task (src/task-answers.ts) behaves when cursorlog misbehaves:
 * a dequeue of the task's answers whose outcome is unknown is resent with the same token (the
 * answer it took is not lost), a watch call that keeps failing or ends early is opened again
 * after a growing backoff for as long as a request waits (it neither gives up after one call
 * deadline nor spins) or is refused for want of a read slot, and a watch ends when its last
 * request stops waiting (timed out) even
 * though the task does not change. Replicas A, B, C on one real cursorlog, with A's gRPC
 * client wrapped to inject the failures.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { performance } from 'node:perf_hooks';
import { Readable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { CreateTaskResultSchema } from '@modelcontextprotocol/sdk/experimental/tasks';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { CursorlogError, type CursorlogClient } from '../src/client.js';
import { CursorlogServer } from './harness.js';
import { connect, replicas, within, type TaskReplica } from './task-replicas.js';

const GUARD_MS = 30_000;
let cursorlog: CursorlogServer;

before(async () => {
  cursorlog = await CursorlogServer.start();
});

after(async () => {
  await cursorlog?.stop();
});

type Step = 'fail' | 'end';

/**
 * Makes the next `plan.length` WatchTask calls of `client` fake ones: `fail` fails with
 * UNAVAILABLE (`cursorlog-retry: safe`, no leader known: an election), `end` ends at once
 * without a message. Later calls are real. Returns when each call was opened (ms).
 */
function stubWatches(client: CursorlogClient, plan: Step[]): number[] {
  const opened: number[] = [];
  const real = client.openWatchTask.bind(client);
  client.openWatchTask = (request) => {
    opened.push(performance.now());
    const step = plan.shift();
    if (step === undefined) return real(request);
    const stream = new Readable({ objectMode: true, read() {} }) as Readable & { cancel(): void };
    stream.cancel = () => stream.destroy();
    setImmediate(() => {
      if (step === 'end') {
        stream.push(null);
        return;
      }
      const metadata = new grpc.Metadata();
      metadata.set('cursorlog-retry', 'safe');
      stream.destroy(Object.assign(new Error('14 UNAVAILABLE: no leader (test)'), { code: grpc.status.UNAVAILABLE, details: 'no leader (test)', metadata }));
    });
    return { address: client.router.current, stream: stream as never };
  };
  return opened;
}

/** Starts the ask tool on A with the client answering `name` to C; resolves with the task result's text. */
async function askAndAnswer(r: Record<'A' | 'B' | 'C', TaskReplica>, name: string): Promise<{ text: string; close: () => Promise<void> }> {
  const { client } = await connect(r, { answer: () => ['C'] }, () => ({ action: 'accept', content: { name } }));
  try {
    const { task } = await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 60_000 } } }, CreateTaskResultSchema);
    // The tool's request failing fails the test at once (the task would never complete).
    const failed = r.A.asked[0]!.answer.then(() => new Promise<never>(() => {}));
    const result = await within(Promise.race([client.experimental.tasks.getTaskResult(task.taskId, CallToolResultSchema), failed]), GUARD_MS, 'the task result');
    return { text: (result.content[0] as { text: string }).text, close: () => client.close() };
  } catch (error) {
    await client.close();
    throw error;
  }
}

describe("A's watch of a task for answers, when cursorlog misbehaves", () => {
  it('a dequeue of the answers whose outcome is unknown is resent with the same token: the answer it took reaches the tool', async () => {
    const r = await replicas(cursorlog.address);
    const grpcA = r.A.cursorlog.client;
    const call = grpcA.call.bind(grpcA);
    const tokens: string[] = [];
    grpcA.call = (async (rpc: string, request: { channel?: number; token?: string }) => {
      const response = await call(rpc as never, request as never);
      if (rpc === 'DequeueTaskMessages' && request.channel === 1) {
        tokens.push(request.token ?? '');
        // The first dequeue took the answer, but its response was lost.
        if (tokens.length === 1) throw new CursorlogError(rpc, grpc.status.UNAVAILABLE, 'response lost (test)');
      }
      return response;
    }) as typeof grpcA.call;
    try {
      const { text, close } = await askAndAnswer(r, 'Ada');
      await close();
      assert.equal(text, 'hello Ada from A');
      assert.equal(tokens.length, 2, `dequeues: ${tokens.join(', ')}`);
      assert.equal(tokens[1], tokens[0], 'the resend carries the token of the lost dequeue');
      assert.equal(r.A.queue.answerStats.delivered, 1);
      assert.equal(r.A.queue.answerStats.unmatched, 0);
    } finally {
      await Promise.all(Object.values(r).map((x) => x.stop()));
    }
  });

  it('a watch that fails longer than a call deadline (an election) keeps watching while the request waits', async () => {
    // A short call deadline: the old watch gave up (and failed the request) after one.
    const r = await replicas(cursorlog.address, true, { deadlineMs: 1_000 });
    const opened = stubWatches(r.A.cursorlog.client, ['fail', 'fail', 'fail', 'fail', 'fail', 'fail', 'fail']);
    try {
      const { text, close } = await askAndAnswer(r, 'Bo');
      await close();
      assert.equal(text, 'hello Bo from A');
      assert.ok(opened.length >= 8, `watch calls: ${opened.length}`);
      assert.ok(opened[7]! - opened[0]! > 1_000, `the outage outlasted the call deadline (${Math.round(opened[7]! - opened[0]!)} ms)`);
      assert.equal(r.A.queue.answerStats.reopened, opened.length - 1);
      assert.equal(r.A.queue.answerStats.delivered, 1);
    } finally {
      await Promise.all(Object.values(r).map((x) => x.stop()));
    }
  });

  it('a watch call that ends without the task ending is opened again after a growing backoff, not at once', async () => {
    const r = await replicas(cursorlog.address);
    const opened = stubWatches(r.A.cursorlog.client, ['end', 'end', 'end', 'end']);
    try {
      const { text, close } = await askAndAnswer(r, 'Cy');
      await close();
      assert.equal(text, 'hello Cy from A');
      const gaps = opened.slice(1, 5).map((t, i) => Math.round(t - opened[i]!));
      // Timers never fire early (1 ms of rounding aside): 50, 100, 200, 400 ms at least.
      gaps.forEach((gap, i) => assert.ok(gap >= 50 * 2 ** i - 2, `re-open ${i + 1} after ${gap} ms (gaps ${gaps.join(', ')})`));
    } finally {
      await Promise.all(Object.values(r).map((x) => x.stop()));
    }
  });

  it('a watch refused because every read slot is taken (RESOURCE_EXHAUSTED) is opened again once one frees, and the answer reaches the tool', async () => {
    // One read slot, held by another watch: A's watch is refused until it is released.
    const tight = await CursorlogServer.start(['--read-calls-max', '1']);
    const r = await replicas(tight.address);
    const other = r.B.cursorlog.client;
    await other.call('CreateTask', { owner: 'test:hold', taskId: 'hold', requestKey: 'hold' });
    const held = other.openWatchTask({ owner: 'test:hold', taskId: 'hold' }).stream;
    held.on('error', () => {});
    try {
      await within(once(held, 'data'), GUARD_MS, 'the holding watch to take the slot');
      // Released only after A's watch was refused twice: the old watch failed the request at the first.
      let refusals = 0;
      r.A.queue.answerEvents.on('refused', () => {
        refusals += 1;
        if (refusals === 2) held.cancel();
      });
      const { text, close } = await askAndAnswer(r, 'Di');
      await close();
      assert.equal(text, 'hello Di from A');
      assert.ok(r.A.queue.answerStats.refused >= 2, `refusals: ${r.A.queue.answerStats.refused}`);
      assert.equal(r.A.queue.answerStats.delivered, 1);
    } finally {
      held.cancel();
      await Promise.all(Object.values(r).map((x) => x.stop()));
      await tight.stop();
    }
  });

  it('a watch ends when its only request timed out, though the task never changes', async () => {
    const r = await replicas(cursorlog.address);
    r.A.elicitTimeoutMs = 300;
    // The client never fetches the request: nothing touches the task after the enqueue.
    const { client } = await connect(r, { answer: () => ['C'] }, () => ({ action: 'decline' }));
    try {
      const watching = once(r.A.queue.answerEvents, 'view');
      await client.request({ method: 'tools/call', params: { name: 'ask', arguments: {}, task: { ttl: 60_000 } } }, CreateTaskResultSchema);
      await within(watching, GUARD_MS, "A's watch");
      await assert.rejects(within(r.A.asked[0]!.answer, GUARD_MS, 'the request to time out'), /timed out/i);
      await within(r.A.queue.whenIdle(), 10_000, "A's watch to end after the timeout");
      assert.equal(r.A.queue.watching, 0);
    } finally {
      await client.close();
      await Promise.all(Object.values(r).map((x) => x.stop()));
    }
  });
});
