/**
 * `CursorlogTaskMessageQueue`: the `TaskMessageQueue` of `@modelcontextprotocol/sdk` 1.32.x on
 * cursorlog's per-task outbound queue (`EnqueueTaskMessage` / `DequeueTaskMessages`, channel 0;
 * docs/TASKS-DESIGN.md §1.6). A message a replica queues for a task (a notification, an
 * elicitation or sampling request related to it) is delivered by the `tasks/result` of
 * whichever replica the client reaches: FIFO per task, each message once.
 *
 * The client's answer to a queued request reaches the task on the replica that asked, whichever
 * replica it is posted to, for the servers {@link CursorlogTaskMessageQueue.attach}ed to the
 * queue, when the replica receiving the POST passes it through
 * {@link CursorlogTaskMessageQueue.routeAnswers} (`CursorlogSessions` does both with its
 * `taskMessageQueue` option). See src/task-answers.ts.
 *
 * Owners follow the task store's rule (`s:<sessionId>`, or `""` without a session): give both
 * the same `ownerOf`.
 */
import { randomUUID } from 'node:crypto';
import type { EventEmitter } from 'node:events';
import * as grpc from '@grpc/grpc-js';
import type { QueuedMessage, TaskMessageQueue } from '@modelcontextprotocol/sdk/experimental/tasks';
import { CursorlogError, CursorlogMcpError, type CursorlogClient } from './client.js';
import { defaultLogger, type Logger } from './core.js';
import { checkProtocol, replaceTaskMessageQueue, type ProtocolInternals } from './sdk-internals.js';
import { TaskAnswers, type OpenedRequest, type TaskAnswersStats } from './task-answers.js';
import { sessionOwner, TaskStoreError } from './tasks.js';

/** The outbound queue: messages to the client, delivered through `tasks/result`. */
const OUTBOUND = 0;

/** Options of a {@link CursorlogTaskMessageQueue}. */
export interface TaskMessageQueueOptions {
  /** The owner of a call's tasks, as the task store's (default: `s:<sessionId>`, or `""`). */
  ownerOf?: (sessionId: string | undefined) => string;
  /** Log sink (default: the package's `defaultLogger`). */
  logger?: Logger;
  /**
   * How often a task watched for answers checks that its requests still wait, ms (default
   * 1000): a watch ends within this time of its last request timing out.
   */
  answerRecheckMs?: number;
}

/** The queue of a task is full (`maxSize`, or the server's bound). Thrown by `enqueue`, as the SDK's in-memory queue throws. */
export class TaskQueueFullError extends CursorlogMcpError {
  override name = 'TaskQueueFullError';
}

/**
 * The SDK's `TaskMessageQueue` on cursorlog: every enqueue is durable before it resolves,
 * and a dequeue never blocks (an empty queue answers at once). Retries after an unknown
 * outcome are safe: an enqueue carries a fresh dedupe key, a dequeue a fresh token, and the
 * client resends them with the same ones.
 */
export class CursorlogTaskMessageQueue implements TaskMessageQueue {
  private readonly ownerOf: (sessionId: string | undefined) => string;
  private readonly answers: TaskAnswers;
  private readonly attached = new WeakSet<object>();

  constructor(
    private readonly client: CursorlogClient,
    options: TaskMessageQueueOptions = {},
  ) {
    this.ownerOf = options.ownerOf ?? sessionOwner;
    this.answers = new TaskAnswers(client, options.logger ?? defaultLogger, options.answerRecheckMs);
  }

  /**
   * Makes the answers to `server`'s task requests (an `McpServer` or a `Server` built with
   * this queue as its `taskMessageQueue`) reach it from any replica: each request it queues
   * gets an id of this adapter (`cursorlog-task-<uuid>`, the route's correlation), and while
   * one waits the task is watched and its inbound queue handed to the server. Throws when the
   * server was built with another queue (or none), and `SdkCompatibilityError` when the SDK's
   * internals changed. Attaching twice is harmless.
   */
  attach(server: object): void {
    const p = checkProtocol(server);
    if (this.attached.has(p)) return;
    if (p._taskMessageQueue !== this) throw new CursorlogMcpError('attach: the server was not built with this CursorlogTaskMessageQueue as its taskMessageQueue');
    const view = {
      enqueue: (taskId: string, message: QueuedMessage, sessionId?: string, maxSize?: number) => this.enqueueFrom(p, taskId, message, sessionId, maxSize),
      dequeue: (taskId: string, sessionId?: string) => this.dequeue(taskId, sessionId),
      dequeueAll: (taskId: string, sessionId?: string) => this.dequeueAll(taskId, sessionId),
    } satisfies TaskMessageQueue;
    replaceTaskMessageQueue(p, view);
    this.attached.add(p);
  }

  /**
   * The replica receiving a POST: routes the JSON-RPC responses in `body` that `server` (this
   * process's server of the session, if any) does not wait for to the task that asked, and
   * returns the body the SDK's transport should still handle (an empty batch when everything
   * was routed: the SDK answers 202). Answers without a route stay in it. Throws
   * `CursorlogError` when cursorlog cannot be asked (answer the POST with an error then).
   */
  async routeAnswers(body: unknown, sessionId: string | undefined, server?: object): Promise<unknown> {
    return this.answers.route(this.ownerOf(sessionId), body, server === undefined ? undefined : checkProtocol(server));
  }

  /** Counters of the answer routing (tests, diagnostics). */
  get answerStats(): Readonly<TaskAnswersStats> {
    return this.answers.stats;
  }

  /** The answer routing's `view` and `reopen` events (see `TaskAnswers.events`; tests, diagnostics). */
  get answerEvents(): EventEmitter {
    return this.answers.events;
  }

  /** Watches of tasks with requests waiting for answers, running now. */
  get watching(): number {
    return this.answers.watching;
  }

  /** Resolves once no task is watched for answers (tests, shutdown). */
  whenIdle(): Promise<void> {
    return this.answers.whenIdle();
  }

  /**
   * Appends `message` to the task's queue. Throws {@link TaskQueueFullError} when the queue
   * holds `maxSize` messages (absent: the server's bound), and {@link TaskStoreError}
   * (`not-found`) when this owner has no such task.
   */
  async enqueue(taskId: string, message: QueuedMessage, sessionId?: string, maxSize?: number): Promise<void> {
    return this.enqueueFrom(undefined, taskId, message, sessionId, maxSize);
  }

  /**
   * {@link enqueue} for `protocol`'s queued messages: a request of an attached server gets a
   * route (its own id as correlation) and a watch for its answer. A request queued without a
   * server (plain `enqueue`) opens no route: nobody here could hand its answer to a resolver.
   */
  private async enqueueFrom(protocol: ProtocolInternals | undefined, taskId: string, message: QueuedMessage, sessionId?: string, maxSize?: number): Promise<void> {
    // The SDK's in-memory queue refuses every message at maxSize 0; cursorlog's max_len 0 means "the server's bound".
    if (maxSize !== undefined && maxSize <= 0) throw new TaskQueueFullError(`Task message queue overflow: task ${taskId} (maxSize ${maxSize})`);
    const owner = this.ownerOf(sessionId);
    const id = (message.message as { id?: string | number }).id;
    let opened: OpenedRequest | undefined;
    let queued = message;
    if (protocol !== undefined && message.type === 'request' && id !== undefined) {
      opened = this.answers.open(protocol, owner, taskId, id);
      queued = { ...message, message: { ...message.message, id: opened.routeId } } as QueuedMessage;
    }
    try {
      await this.client.call('EnqueueTaskMessage', {
        owner,
        taskId,
        channel: OUTBOUND,
        message: Buffer.from(JSON.stringify(queued)),
        ...(maxSize !== undefined ? { maxLen: Math.min(maxSize, 0xffff_ffff) } : {}),
        dedupeKey: randomUUID(),
        ...(opened !== undefined ? { correlation: opened.routeId } : {}),
      });
      opened?.watch();
    } catch (error) {
      opened?.cancel();
      if (error instanceof CursorlogError && error.code === grpc.status.RESOURCE_EXHAUSTED) {
        throw new TaskQueueFullError(`Task message queue overflow: task ${taskId} (maxSize ${maxSize ?? 'server bound'}): ${error.details}`);
      }
      if (error instanceof CursorlogError && error.code === grpc.status.NOT_FOUND) throw new TaskStoreError(`Task with ID ${taskId} not found`, 'not-found');
      throw error;
    }
  }

  /** Takes the oldest message of the task's queue; `undefined` when it is empty (or the task is not found). */
  async dequeue(taskId: string, sessionId?: string): Promise<QueuedMessage | undefined> {
    return (await this.take(taskId, sessionId, 1))[0];
  }

  /** Takes every message of the task's queue, oldest first (none when the task is not found). */
  async dequeueAll(taskId: string, sessionId?: string): Promise<QueuedMessage[]> {
    return this.take(taskId, sessionId, 0);
  }

  private async take(taskId: string, sessionId: string | undefined, max: number): Promise<QueuedMessage[]> {
    try {
      const response = await this.client.call('DequeueTaskMessages', {
        owner: this.ownerOf(sessionId),
        taskId,
        channel: OUTBOUND,
        maxMessages: max,
        token: randomUUID(),
      });
      return (response.messages ?? []).map((m) => JSON.parse((m.message ?? Buffer.alloc(0)).toString('utf8')) as QueuedMessage);
    } catch (error) {
      // The SDK drains the queue after a task ended or was cancelled; a task gone since has nothing queued.
      if (error instanceof CursorlogError && error.code === grpc.status.NOT_FOUND) return [];
      throw error;
    }
  }
}
