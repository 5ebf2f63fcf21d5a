/**
 * The SDK internals this adapter relies on, in one place (`@modelcontextprotocol/sdk` 1.32.x,
 * `server/webStandardStreamableHttp.js`). `test/sdk-internals.test.ts` fails when any of them
 * changes; `checkTransport` refuses a transport that lacks them at run time.
 *
 * - `_streamMapping: Map<streamId, {controller, cleanup}>`: the live SSE connection of each
 *   stream. The detached tail checks its own entry to notice that the client left (the SDK
 *   never tells the store) and calls its `cleanup()` to end the response after the terminal
 *   frame (the SDK ends a replayed response only when its own process sends the response).
 * - `_requestToStreamMapping: Map<requestId, streamId>`: set before the priming event is
 *   stored, so the store learns which JSON-RPC request a new stream answers (its
 *   correlation, needed to address an error to the client's pending call).
 * - `_webStandardTransport` of the Node `StreamableHTTPServerTransport`.
 * - `send` passed to `replayEventsAfter` keeps writing to the response after the call
 *   returned (the detached tail).
 *
 * And of `Protocol` (`shared/protocol.js`, the base of `Server`), for answers to a task's
 * requests that reach another replica (src/task-answers.ts):
 * - `_taskMessageQueue`: the queue `_enqueueTaskMessage` (hence `request(…, { relatedTask })`)
 *   writes to and the `tasks/result` handler reads from; {@link checkProtocol} lets the
 *   adapter put a per-server view of the same queue there, which knows the server.
 * - `_responseHandlers: Map<number, handler>`: a request waits for its answer while its id is
 *   in it (a timeout, an abort or a close removes it); `_requestResolvers` holds the task
 *   requests' resolvers under the same id. `_onresponse` looks both up by `Number(id)`, and is
 *   what the transport's `onmessage` calls for a response.
 * - `_requestMessageId` counts from 0 in every instance: two servers (two replicas, or one per
 *   request on a stateless server) use the same ids, hence the adapter's own ids for queued
 *   task requests.
 */
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { CursorlogMcpError } from './client.js';

/** The supported SDK range (also `peerDependencies` in package.json). */
export const SUPPORTED_SDK_RANGE = '>=1.32.0 <1.33.0';

/** The installed SDK lacks an internal this adapter relies on. */
export class SdkCompatibilityError extends CursorlogMcpError {
  override name = 'SdkCompatibilityError';
}

/** What the adapter reads of a stream's live connection. */
export interface StreamEntry {
  controller?: unknown;
  cleanup: () => void;
}

/** The web-standard transport's internals the adapter reads. */
export interface TransportInternals {
  _streamMapping: Map<string, StreamEntry>;
  _requestToStreamMapping: Map<string | number, string>;
  sessionId?: string;
  handleRequest(req: Request, options?: { parsedBody?: unknown; authInfo?: unknown }): Promise<Response>;
}

/** The installed SDK version, from its package.json. */
export function installedSdkVersion(): string {
  const require = createRequire(import.meta.url);
  // The package's `exports` map `./package.json` to a dist file; walk up from its entry point.
  let dir = dirname(require.resolve('@modelcontextprotocol/sdk/server/streamableHttp.js'));
  for (;;) {
    const candidate = join(dir, 'package.json');
    if (existsSync(candidate)) {
      const pkg = JSON.parse(readFileSync(candidate, 'utf8')) as { name?: string; version?: string };
      if (pkg.name === '@modelcontextprotocol/sdk') return pkg.version ?? 'unknown';
    }
    const parent = dirname(dir);
    if (parent === dir) return 'unknown';
    dir = parent;
  }
}

/** True for 1.32.x. */
export function sdkVersionSupported(version: string): boolean {
  return /^1\.32\.\d+$/.test(version);
}

/**
 * The web-standard transport behind a Node `StreamableHTTPServerTransport` (or the transport
 * itself when it is web-standard), checked for every internal the adapter uses.
 */
export function checkTransport(transport: object): TransportInternals {
  const inner = (transport as { _webStandardTransport?: object })._webStandardTransport ?? transport;
  const t = inner as Partial<TransportInternals>;
  const missing: string[] = [];
  if (!(t._streamMapping instanceof Map)) missing.push('_streamMapping');
  if (!(t._requestToStreamMapping instanceof Map)) missing.push('_requestToStreamMapping');
  if (typeof t.handleRequest !== 'function') missing.push('handleRequest');
  if (missing.length > 0) {
    throw new SdkCompatibilityError(
      `@modelcontextprotocol/sdk ${installedSdkVersion()} lacks ${missing.join(', ')} on its Streamable HTTP transport; @cursorlog/mcp supports ${SUPPORTED_SDK_RANGE}`,
    );
  }
  return inner as TransportInternals;
}

/** The request ids the SDK routes to a stream (in insertion order). */
export function requestIdsOfStream(t: TransportInternals, streamId: string): (string | number)[] {
  const ids: (string | number)[] = [];
  for (const [id, sid] of t._requestToStreamMapping) if (sid === streamId) ids.push(id);
  return ids;
}

/** What the adapter uses of an SDK `Protocol` (a `Server`, or the `server` of an `McpServer`). */
export interface ProtocolInternals {
  _taskMessageQueue?: unknown;
  _responseHandlers: Map<number, unknown>;
  _requestResolvers: Map<string | number, unknown>;
  _requestMessageId: number;
  readonly transport?: { onmessage?: (message: unknown, extra?: unknown) => void };
}

/**
 * The `Protocol` of an `McpServer` (its `server`) or of a `Server` itself, checked for every
 * internal the adapter uses ({@link ProtocolInternals}); throws {@link SdkCompatibilityError}.
 */
export function checkProtocol(server: object): ProtocolInternals {
  const own = server as Partial<ProtocolInternals>;
  const inner = (own._responseHandlers === undefined ? (server as { server?: object }).server : server) ?? server;
  const p = inner as Partial<ProtocolInternals> & { _onresponse?: unknown; _enqueueTaskMessage?: unknown };
  const missing: string[] = [];
  if (!(p._responseHandlers instanceof Map)) missing.push('_responseHandlers');
  if (!(p._requestResolvers instanceof Map)) missing.push('_requestResolvers');
  if (typeof p._requestMessageId !== 'number') missing.push('_requestMessageId');
  if (typeof p._onresponse !== 'function') missing.push('_onresponse');
  if (typeof p._enqueueTaskMessage !== 'function') missing.push('_enqueueTaskMessage');
  if (!('_taskMessageQueue' in p)) missing.push('_taskMessageQueue');
  if (missing.length > 0) {
    throw new SdkCompatibilityError(
      `@modelcontextprotocol/sdk ${installedSdkVersion()} lacks ${missing.join(', ')} on its Protocol; @cursorlog/mcp supports ${SUPPORTED_SDK_RANGE}`,
    );
  }
  return p as ProtocolInternals;
}

/** True while the SDK waits for the answer to its request `id` (as its `_onresponse` looks it up: `Number(id)`). */
export function awaitsResponse(p: ProtocolInternals, id: string | number): boolean {
  const n = Number(id);
  return p._responseHandlers.has(n) || p._requestResolvers.has(n);
}

/** True while the SDK's request `id` still has a handler (not answered, timed out, aborted, or closed). */
export function waitsForResponse(p: ProtocolInternals, id: string | number): boolean {
  return p._responseHandlers.has(Number(id));
}

/** Puts `queue` where the server's `_enqueueTaskMessage` and `tasks/result` handler find theirs. */
export function replaceTaskMessageQueue(p: ProtocolInternals, queue: unknown): void {
  p._taskMessageQueue = queue;
}
