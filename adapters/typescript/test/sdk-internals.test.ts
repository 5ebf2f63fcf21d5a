/**
 * The SDK behaviours and internals the adapter relies on (src/sdk-internals.ts). Every test
 * here fails when the installed `@modelcontextprotocol/sdk` changes one of them.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { WebStandardStreamableHTTPServerTransport, type EventStore } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js';
import { InMemoryTaskStore, type QueuedMessage, type TaskMessageQueue } from '@modelcontextprotocol/sdk/experimental/tasks';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { ElicitResultSchema, McpError, type JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import {
  awaitsResponse,
  checkProtocol,
  checkTransport,
  installedSdkVersion,
  replaceTaskMessageQueue,
  requestIdsOfStream,
  SdkCompatibilityError,
  sdkVersionSupported,
  waitsForResponse,
} from '../src/sdk-internals.js';

const PROTOCOL = '2025-11-25';
const note = (n: number): JSONRPCMessage => ({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: n } });

/** A scripted store: replays one event, then keeps `send` for later (the detached tail). */
class ProbeStore implements EventStore {
  send: ((id: string, m: JSONRPCMessage) => Promise<void>) | undefined;
  primingRequestIds: (string | number)[][] = [];
  transport: WebStandardStreamableHTTPServerTransport | undefined;
  async storeEvent(streamId: string, message: JSONRPCMessage): Promise<string> {
    if (!('jsonrpc' in message) && this.transport !== undefined) {
      this.primingRequestIds.push(requestIdsOfStream(checkTransport(this.transport), streamId));
    }
    return `${streamId}:x`;
  }
  async getStreamIdForEventId(eventId: string): Promise<string | undefined> {
    return eventId.startsWith('known') ? 'probe-stream' : undefined;
  }
  async replayEventsAfter(_last: string, { send }: { send: (id: string, m: JSONRPCMessage) => Promise<void> }): Promise<string> {
    await send('e1', note(1));
    this.send = send;
    return 'probe-stream';
  }
}

async function session(store: ProbeStore): Promise<{ t: WebStandardStreamableHTTPServerTransport; sid: string }> {
  const t = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: () => 'probe-session', eventStore: store });
  store.transport = t;
  await new McpServer({ name: 'probe', version: '1' }).connect(t);
  const init = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: PROTOCOL, capabilities: {}, clientInfo: { name: 'c', version: '1' } } };
  const r = await t.handleRequest(
    new Request('http://localhost/mcp', { method: 'POST', headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json' }, body: JSON.stringify(init) }),
  );
  await r.text();
  return { t, sid: r.headers.get('mcp-session-id')! };
}

function get(sid: string, lastEventId: string): Request {
  return new Request('http://localhost/mcp', {
    headers: { accept: 'text/event-stream', 'mcp-session-id': sid, 'mcp-protocol-version': PROTOCOL, 'last-event-id': lastEventId },
  });
}

async function readUntil(reader: ReadableStreamDefaultReader<Uint8Array>, needle: string): Promise<string> {
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes(needle)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`stream ended before ${needle}; got ${text}`);
    text += decoder.decode(value);
  }
  return text;
}

describe('SDK internals relied on (@modelcontextprotocol/sdk 1.32.x)', () => {
  it('the installed SDK is in the supported range', () => {
    assert.ok(sdkVersionSupported(installedSdkVersion()), `installed ${installedSdkVersion()}`);
  });

  it('both transports expose the internals checkTransport needs', () => {
    const node = new StreamableHTTPServerTransport({ sessionIdGenerator: () => 'x' });
    const web = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: () => 'x' });
    assert.doesNotThrow(() => checkTransport(node));
    assert.doesNotThrow(() => checkTransport(web));
    assert.throws(() => checkTransport({}), /lacks _streamMapping, _requestToStreamMapping, handleRequest/);
  });

  it('the request id is mapped to its stream before the priming event is stored', async () => {
    const store = new ProbeStore();
    const { t, sid } = await session(store);
    const r = await t.handleRequest(
      new Request('http://localhost/mcp', {
        method: 'POST',
        headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-session-id': sid, 'mcp-protocol-version': PROTOCOL },
        body: JSON.stringify({ jsonrpc: '2.0', id: 'req-7', method: 'tools/list' }),
      }),
    );
    await r.text();
    assert.deepEqual(store.primingRequestIds.at(-1), ['req-7']);
  });

  it('an unknown cursor is 400 when getStreamIdForEventId says undefined', async () => {
    const { t, sid } = await session(new ProbeStore());
    const r = await t.handleRequest(get(sid, 'nope'));
    assert.equal(r.status, 400);
  });

  it('send keeps writing after replayEventsAfter returned (detached tail); cleanup() ends the response', async () => {
    const store = new ProbeStore();
    const { t, sid } = await session(store);
    const r = await t.handleRequest(get(sid, 'known-1'));
    assert.equal(r.status, 200);
    const reader = r.body!.getReader();
    assert.match(await readUntil(reader, 'id: e1'), /"data":1/);
    await store.send!('e2', note(2));
    assert.match(await readUntil(reader, 'id: e2'), /"data":2/);
    const internals = checkTransport(t);
    const entry = internals._streamMapping.get('probe-stream');
    assert.ok(entry !== undefined, 'the resumed connection is registered under the returned stream id');
    entry.cleanup();
    for (;;) {
      const { done } = await reader.read();
      if (done) break;
    }
  });

  it('a client that leaves removes the connection from _streamMapping', async () => {
    const store = new ProbeStore();
    const { t, sid } = await session(store);
    const r = await t.handleRequest(get(sid, 'known-1'));
    const internals = checkTransport(t);
    assert.ok(internals._streamMapping.get('probe-stream') !== undefined);
    await r.body!.cancel();
    assert.equal(internals._streamMapping.get('probe-stream'), undefined);
  });

  it('a second resume of a connected stream is 409', async () => {
    const store = new ProbeStore();
    const { t, sid } = await session(store);
    const first = await t.handleRequest(get(sid, 'known-1'));
    const second = await t.handleRequest(get(sid, 'known-2'));
    assert.equal(second.status, 409);
    await first.body!.cancel();
  });
});

/** A queue that records what the server queues (and hands nothing back). */
class RecordingQueue implements TaskMessageQueue {
  readonly queued: { taskId: string; message: QueuedMessage; waiting: boolean }[] = [];
  constructor(private readonly server?: Server) {}
  async enqueue(taskId: string, message: QueuedMessage): Promise<void> {
    const id = (message.message as { id?: number }).id;
    this.queued.push({ taskId, message, waiting: this.server !== undefined && id !== undefined && waitsForResponse(checkProtocol(this.server), id) });
  }
  async dequeue(): Promise<QueuedMessage | undefined> {
    return undefined;
  }
  async dequeueAll(): Promise<QueuedMessage[]> {
    return [];
  }
}

async function taskServer(): Promise<{ server: Server; queue: RecordingQueue }> {
  const placeholder = new RecordingQueue();
  const server = new Server({ name: 'probe', version: '1' }, { capabilities: {}, taskStore: new InMemoryTaskStore(), taskMessageQueue: placeholder });
  const queue = new RecordingQueue(server);
  const p = checkProtocol(server);
  assert.equal(p._taskMessageQueue, placeholder, '_taskMessageQueue is the queue the server was built with');
  replaceTaskMessageQueue(p, queue);
  const [serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  return { server, queue };
}

const ELICIT = { method: 'elicitation/create' as const, params: { mode: 'form' as const, message: 'name?', requestedSchema: { type: 'object' as const, properties: {} } } };

describe('SDK Protocol internals relied on for task answers (src/task-answers.ts)', () => {
  it('checkProtocol finds the Protocol of an McpServer and of a Server; refuses anything else', () => {
    const mcp = new McpServer({ name: 'p', version: '1' });
    assert.equal(checkProtocol(mcp), mcp.server);
    const server = new Server({ name: 'p', version: '1' });
    assert.equal(checkProtocol(server), server);
    assert.throws(() => checkProtocol({}), (e: unknown) => e instanceof SdkCompatibilityError && /_responseHandlers, _requestResolvers, _requestMessageId, _onresponse, _enqueueTaskMessage, _taskMessageQueue/.test(e.message));
  });

  it('every server numbers its requests from 0 (so ids collide across replicas: the adapter gives queued ones its own)', async () => {
    const one = await taskServer();
    const two = await taskServer();
    void one.server.request(ELICIT, ElicitResultSchema, { relatedTask: { taskId: 't1' } }).catch(() => undefined);
    void two.server.request(ELICIT, ElicitResultSchema, { relatedTask: { taskId: 't2' } }).catch(() => undefined);
    await new Promise((r) => setImmediate(r));
    assert.equal((one.queue.queued[0]?.message.message as { id?: number }).id, 0);
    assert.equal((two.queue.queued[0]?.message.message as { id?: number }).id, 0);
    await one.server.close();
    await two.server.close();
  });

  it('a task request goes to the replaced _taskMessageQueue while it waits; its answer through transport.onmessage resolves it', async () => {
    const { server, queue } = await taskServer();
    const asked = server.request(ELICIT, ElicitResultSchema, { relatedTask: { taskId: 'task-1' } });
    await new Promise((r) => setImmediate(r));
    const [entry] = queue.queued;
    assert.equal(entry?.taskId, 'task-1');
    assert.equal(entry?.message.type, 'request');
    assert.ok(entry?.waiting, 'the response handler is registered before the request is queued');
    const id = (entry!.message.message as { id: number }).id;
    const p = checkProtocol(server);
    assert.ok(awaitsResponse(p, id) && awaitsResponse(p, String(id)), 'looked up by Number(id), as _onresponse does');
    assert.ok(!awaitsResponse(p, 'cursorlog-task-x') && !awaitsResponse(p, id + 1));
    p.transport!.onmessage!({ jsonrpc: '2.0', id, result: { action: 'accept', content: {} } });
    assert.deepEqual(await asked, { action: 'accept', content: {} });
    // The resolver is used once; (1.32 quirk) its response handler stays until the request's timeout fires.
    assert.ok(!p._requestResolvers.has(id));
    await server.close();
  });

  it('an error answer rejects the request with its code; a timed-out request no longer waits', async () => {
    const { server } = await taskServer();
    const p = checkProtocol(server);
    const failing = server.request(ELICIT, ElicitResultSchema, { relatedTask: { taskId: 'task-2' } });
    await new Promise((r) => setImmediate(r));
    const id = p._requestMessageId - 1;
    p.transport!.onmessage!({ jsonrpc: '2.0', id, error: { code: -32603, message: 'Task cancelled or completed' } });
    await assert.rejects(failing, (e: unknown) => e instanceof McpError && e.code === -32603 && /Task cancelled or completed/.test(e.message));
    const timing = server.request(ELICIT, ElicitResultSchema, { relatedTask: { taskId: 'task-3' }, timeout: 1 });
    const late = p._requestMessageId - 1;
    assert.ok(waitsForResponse(p, late));
    await assert.rejects(timing, /timed out/);
    assert.ok(!waitsForResponse(p, late), 'a timeout removes the response handler');
    await server.close();
  });
});
