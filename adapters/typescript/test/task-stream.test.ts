/**
 * Task calls on `TaskStream` (issue 31 item 3): many calls in flight on one stream answer as
 * their unary calls do (a failure rejects only its own call, with the same code), and a server
 * without the RPC (UNIMPLEMENTED) is served by unary calls, the failed stream costing nothing.
 */
import assert from 'node:assert/strict';
import * as http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { CursorlogClient, CursorlogError } from '../src/client.js';
import { loadTasksConstructor } from '../src/proto.js';
import { CursorlogServer } from './harness.js';

let cursorlog: CursorlogServer;

before(async () => {
  cursorlog = await CursorlogServer.start();
});

after(async () => {
  await cursorlog?.stop();
});

/** A task's answer without its times, comparable across clients. */
function timeless(task: Record<string, unknown> | undefined): Record<string, unknown> | undefined {
  if (task === undefined) return undefined;
  const { createdAtMs: _c, lastUpdatedAtMs: _u, endedAtMs: _e, ...rest } = task;
  return rest;
}

/** One task's calls; resolves with what each answered (a rejection as its code and details). */
async function lifecycle(client: CursorlogClient, owner: string, taskId: string): Promise<unknown[]> {
  const out: unknown[] = [];
  const record = async (p: Promise<object>): Promise<void> => {
    try {
      const r = (await p) as { task?: unknown; view?: { task?: unknown } };
      out.push({ ...r, task: timeless(r.task as Record<string, unknown> | undefined), view: r.view && { ...r.view, task: timeless(r.view.task as Record<string, unknown> | undefined) } });
    } catch (error) {
      assert.ok(error instanceof CursorlogError, String(error));
      out.push({ code: error.code, details: error.details });
    }
  };
  await record(client.call('CreateTask', { owner, taskId, requestKey: `k-${taskId}`, context: Buffer.from('{}') }));
  await record(client.call('UpdateTask', { owner, taskId, status: 'INPUT_REQUIRED', statusMessage: 'waiting' }));
  await record(client.call('GetTask', { owner, taskId }));
  await record(client.call('FinishTask', { owner, taskId, status: 'COMPLETED', outcome: { kind: 'RESULT', json: Buffer.from('{"ok":true}') } }));
  await record(client.call('GetTask', { owner, taskId, includeOutcome: true }));
  await record(client.call('UpdateTask', { owner, taskId, status: 'WORKING' }));
  await record(client.call('UpdateTask', { owner, taskId: `${taskId}-never`, status: 'WORKING' }));
  return out;
}

describe('TaskStream', () => {
  it('64 tasks in flight on one stream answer as the unary calls do; a failure rejects only its call', async () => {
    const streamed = new CursorlogClient({ address: cursorlog.address });
    const unary = new CursorlogClient({ address: cursorlog.address, taskTransport: 'unary' });
    try {
      const ids = Array.from({ length: 64 }, (_, i) => `t${i}`);
      const viaStream = await Promise.all(ids.map((id) => lifecycle(streamed, 'stream', id)));
      const viaUnary = await Promise.all(ids.map((id) => lifecycle(unary, 'unary', id)));
      assert.equal(viaStream.length, viaUnary.length);
      viaStream.forEach((calls, i) => calls.forEach((answer, k) => assert.deepEqual(answer, viaUnary[i]![k], `task ${i} call ${k}`)));
      const codes = viaStream[0]!.map((r) => (r as { code?: number }).code);
      assert.deepEqual(codes, [undefined, undefined, undefined, undefined, undefined, grpc.status.FAILED_PRECONDITION, grpc.status.NOT_FOUND]);
      // The calls went on a stream (the channel exists and the server has the RPC).
      const channels = (streamed as unknown as { taskStreams: Map<string, { unsupported: boolean }> }).taskStreams;
      assert.equal(channels.get(cursorlog.address)?.unsupported, false);
    } finally {
      streamed.close();
      unary.close();
    }
  });

  it('a server without TaskStream (UNIMPLEMENTED) gets unary calls, the one in flight included', async () => {
    const Tasks = loadTasksConstructor() as unknown as { service: Record<string, { responseSerialize: (v: unknown) => Buffer }> };
    const seen: string[] = [];
    const server = http2.createServer();
    server.on('stream', (stream, headers) => {
      const path = String(headers[':path']);
      seen.push(path);
      stream.on('data', () => {});
      if (path.endsWith('/TaskStream')) {
        stream.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': '12', 'grpc-message': 'unimplemented' }, { endStream: true });
        return;
      }
      stream.on('end', () => {
        const message = Tasks.service['GetTask']!.responseSerialize({ verdict: 'TASK_UNKNOWN' });
        const frame = Buffer.alloc(5 + message.length);
        frame.writeUInt32BE(message.length, 1);
        message.copy(frame, 5);
        stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
        stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
        stream.end(frame);
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
    const client = new CursorlogClient({ address });
    try {
      const [a, b] = await Promise.all([client.call('GetTask', { owner: 'o', taskId: 'a' }), client.call('GetTask', { owner: 'o', taskId: 'b' })]);
      assert.equal(a.verdict, 'TASK_UNKNOWN');
      assert.equal(b.verdict, 'TASK_UNKNOWN');
      const c = await client.call('GetTask', { owner: 'o', taskId: 'c' });
      assert.equal(c.verdict, 'TASK_UNKNOWN');
      assert.deepEqual(
        seen.filter((p) => p.endsWith('/TaskStream')),
        ['/cursorlog.v1.Tasks/TaskStream'],
        'one stream tried, then unary only',
      );
      assert.equal(seen.filter((p) => p.endsWith('/GetTask')).length, 3);
    } finally {
      client.close();
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});
