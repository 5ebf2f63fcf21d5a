/**
 * The store against the real cursorlog binary: session isolation, coalesced appends, lease
 * renewal, and a store that cannot store failing loudly.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { CursorlogError, CursorlogMcpError } from '../src/client.js';
import { Cursorlog } from '../src/core.js';
import { checkTransport } from '../src/sdk-internals.js';
import { parseCursor, type SessionEventStore } from '../src/store.js';
import { CursorlogServer, waitFor } from './harness.js';

const note = (n: number): JSONRPCMessage => ({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: n } });
const quiet = (): void => {};

let server: CursorlogServer;

async function bound(cl: Cursorlog, session: string): Promise<SessionEventStore> {
  const opened = await cl.client.call('OpenSession', { session });
  const store = cl.bindSession(session, opened.epoch);
  store.attach(new StreamableHTTPServerTransport({ sessionIdGenerator: () => session }));
  return store;
}

describe('SessionEventStore on the real cursorlog', () => {
  before(async () => {
    server = await CursorlogServer.start();
  });
  after(async () => {
    await server.stop();
  });

  it('isolates sessions: the same SDK stream ids map to different streams, foreign cursors are unknown', async () => {
    const cl = new Cursorlog({ address: server.address, logger: quiet });
    const [s1, s2] = await Promise.all([bound(cl, 'iso-1'), bound(cl, 'iso-2')]);
    const g1 = await s1.storeEvent('_GET_stream', note(1));
    const g2 = await s2.storeEvent('_GET_stream', note(2));
    const p1 = await s1.storeEvent('req-1', {} as JSONRPCMessage);
    const p2 = await s2.storeEvent('req-1', {} as JSONRPCMessage);
    assert.notEqual(parseCursor(g1)!.stream, parseCursor(g2)!.stream);
    assert.notEqual(parseCursor(p1)!.stream, parseCursor(p2)!.stream);
    assert.equal(parseCursor(p1)!.seq, 0, 'a priming event writes nothing: its id is the start cursor');
    assert.equal(await s1.getStreamIdForEventId(g1), '_GET_stream');
    assert.equal(await s1.getStreamIdForEventId(p1), 'req-1');
    for (const foreign of [g1, p1]) assert.equal(await s2.getStreamIdForEventId(foreign), undefined, `session 2 must not know ${foreign}`);
    assert.equal(await s1.getStreamIdForEventId('garbage'), undefined);
    assert.equal(await s1.getStreamIdForEventId(`${g1}.answered`), undefined);
    await cl.close();
  });

  it('coalesces concurrent appends of many sessions into shared batches; each caller gets its own id, in order', async () => {
    const cl = new Cursorlog({ address: server.address, logger: quiet });
    const stores = await Promise.all([0, 1, 2].map((i) => bound(cl, `co-${i}`)));
    const streams = stores.flatMap((s) => Array.from({ length: 10 }, (_, j) => ({ s, id: `req-${j}` })));
    await Promise.all(streams.map(({ s, id }) => s.storeEvent(id, {} as JSONRPCMessage)));
    const before = { ...cl.producer.stats };
    const calls = streams.flatMap(({ s, id }) => Array.from({ length: 10 }, (_, k) => ({ s, id, k, p: s.storeEvent(id, note(k)) })));
    const ids = await Promise.all(calls.map((c) => c.p));
    const batches = cl.producer.stats.batches - before.batches;
    assert.equal(cl.producer.stats.events - before.events, 300);
    assert.ok(batches <= 30, `300 concurrent appends took ${batches} AppendBatch calls`);
    calls.forEach((c, i) => assert.equal(parseCursor(ids[i]!)!.seq, c.k + 1, `${c.id} event ${c.k} got ${ids[i]}`));
    // Idle: one append is sent at once, alone.
    const one = cl.producer.stats.batches;
    await stores[0]!.storeEvent('req-0', note(99));
    assert.equal(cl.producer.stats.batches, one + 1);
    await cl.close();
  });

  it('appendVia stream: appends pipelined on one AppendStream call, in order, the result after them', async () => {
    const cl = new Cursorlog({ address: server.address, logger: quiet, appendVia: 'stream' });
    const opened = await cl.client.call('OpenSession', { session: 'st-1' });
    const store = cl.bindSession('st-1', opened.epoch);
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => 'st-1' });
    store.attach(transport);
    const requests = Array.from({ length: 10 }, (_, j) => j);
    for (const j of requests) checkTransport(transport)._requestToStreamMapping.set(j, `sdk-${j}`);
    await Promise.all(requests.map((j) => store.storeEvent(`sdk-${j}`, {} as JSONRPCMessage)));
    await cl.producer.idle();
    // The opens went through AppendBatch; count the calls from here.
    const b0 = cl.producer.stats.batches;
    const calls = requests.flatMap((j) => Array.from({ length: 10 }, (_, k) => ({ j, k, p: store.storeEvent(`sdk-${j}`, note(k)) })));
    // The results are handed in right behind the appends, without awaiting them.
    const results = requests.map((j) => store.storeEvent(`sdk-${j}`, { jsonrpc: '2.0', id: j, result: {} } as JSONRPCMessage));
    const ids = await Promise.all(calls.map((c) => c.p));
    calls.forEach((c, i) => assert.equal(parseCursor(ids[i]!)!.seq, c.k + 1));
    const done = await Promise.all(results);
    done.forEach((id) => assert.equal(parseCursor(id)!.seq, 11));
    // One AppendStream call for the 100 appends; the 10 results leave in AppendBatch calls.
    assert.ok(cl.producer.stats.batches - b0 <= 1 + 10, `${cl.producer.stats.batches - b0} calls`);
    await cl.close();
  });

  it('a resume of a stream this process produces hands over the events stored during the replay, once', async () => {
    const cl = new Cursorlog({ address: server.address, logger: quiet });
    const opened = await cl.client.call('OpenSession', { session: 'hand-1' });
    const store = cl.bindSession('hand-1', opened.epoch);
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => 'hand-1' });
    store.attach(transport);
    checkTransport(transport)._requestToStreamMapping.set(1, 'sdk-1');
    const start = await store.storeEvent('sdk-1', {} as JSONRPCMessage);
    const e1 = await store.storeEvent('sdk-1', note(1));
    const e2 = await store.storeEvent('sdk-1', note(2));
    // The Read's replay ends only after one more event was stored: that event is not in the
    // Read's snapshot, so only the hand-over can deliver it.
    let e3 = '';
    const read = cl.client.read.bind(cl.client);
    cl.client.read = ((request: Parameters<typeof read>[0]) => {
      const call = read(request);
      return Object.assign(Object.create(call) as typeof call, {
        async *[Symbol.asyncIterator]() {
          yield* call;
          e3 = await store.storeEvent('sdk-1', note(3));
        },
      });
    }) as typeof cl.client.read;
    const sent: string[] = [];
    const returned = await store.replayEventsAfter(start, { send: async (id) => void sent.push(id) });
    assert.equal(returned, 'sdk-1', 'the SDK keeps delivering the live rest in-process');
    assert.deepEqual(sent, [e1, e2, e3]);
    await store.storeEvent('sdk-1', note(4));
    assert.deepEqual(sent, [e1, e2, e3], 'after the hand-over the SDK writes, not the replay');
    await cl.close();
  });

  it('renews producer leases while the process lives', async () => {
    const cl = new Cursorlog({ address: server.address, leaseMs: 300, logger: quiet });
    const store = await bound(cl, 'lease-1');
    let keepAlives = 0;
    const call = cl.client.call.bind(cl.client);
    cl.client.call = ((rpc: string, req: unknown) => {
      if (rpc === 'KeepAlive') keepAlives += 1;
      return call(rpc as 'KeepAlive', req as { session: string });
    }) as typeof cl.client.call;
    const renewed = parseCursor(await store.storeEvent('req-1', {} as JSONRPCMessage))!.stream;
    // The control: a stream with the same lease that nothing renews is aborted.
    const bare = await cl.client.call('OpenStream', { session: 'lease-1', epoch: store.epoch, leaseMs: '300' });
    await waitFor('the unrenewed stream to be aborted', async () => {
      const r = await cl.client.call('Resolve', { session: 'lease-1', lastEventId: `${store.epoch}-${bare.stream}-0` });
      return r.streamState === 'STREAM_STATE_ABORTED';
    });
    await waitFor('more keep-alives', () => keepAlives >= 6);
    const r = await cl.client.call('Resolve', { session: 'lease-1', lastEventId: `${store.epoch}-${renewed}-0` });
    assert.equal(r.streamState, 'STREAM_STATE_OPEN');
    await cl.close();
  });

  it("the response to the stream's own request is its terminal frame (Complete), with the request id as correlation", async () => {
    const cl = new Cursorlog({ address: server.address, logger: quiet });
    const opened = await cl.client.call('OpenSession', { session: 'term-1' });
    const store = cl.bindSession('term-1', opened.epoch);
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => 'term-1' });
    store.attach(transport);
    checkTransport(transport)._requestToStreamMapping.set(7, 'sdk-7');
    await store.storeEvent('sdk-7', {} as JSONRPCMessage);
    const progress = await store.storeEvent('sdk-7', note(1));
    const stream = parseCursor(progress)!.stream;
    assert.equal((await cl.client.call('GetOutcome', { session: 'term-1', stream })).outcome?.state, 'STREAM_STATE_OPEN');
    const done = await store.storeEvent('sdk-7', { jsonrpc: '2.0', id: 7, result: { ok: true } } as JSONRPCMessage);
    const o = await cl.client.call('GetOutcome', { session: 'term-1', correlation: '7' });
    assert.equal(o.outcome?.state, 'STREAM_STATE_COMPLETED');
    assert.equal(o.outcome?.frame?.id, done);
    await assert.rejects(store.storeEvent('sdk-7', note(2)), /already terminal/);
    await cl.close();
  });

  it('fails loudly when it cannot store: released session, and cursorlog gone', async () => {
    const own = await CursorlogServer.start();
    const cl = new Cursorlog({ address: own.address, logger: quiet, attempts: 2 });
    const store = await bound(cl, 'loud-1');
    await store.storeEvent('req-1', {} as JSONRPCMessage);
    await own.stop();
    await assert.rejects(store.storeEvent('req-1', note(1)), (e: unknown) => e instanceof CursorlogError && e.retryable);
    // The stream is broken from then on: later events fail too, never an id-less success.
    await assert.rejects(store.storeEvent('req-1', note(2)), CursorlogError);
    await store.release('test');
    await assert.rejects(store.storeEvent('req-2', note(3)), CursorlogMcpError);
    await cl.close();
  });
});
