/**
 * `CursorlogTaskMessageQueue`: the `TaskMessageQueue` of `@modelcontextprotocol/sdk` 1.32.x on
 * cursorlog's per-task outbound queue (`EnqueueTaskMessage` / `DequeueTaskMessages`, channel 0;
 * docs/TASKS-DESIGN.md §1.6). A message a replica queues for a task (a notification, an
 * elicitation or sampling request related to it) is delivered by the `tasks/result` of
 * whichever replica the client reaches: FIFO per task, each message once.
 *
 * Owners follow the task store's rule (`s:<sessionId>`, or `""` without a session): give both
 * the same `ownerOf`.
 */
import { randomUUID } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import type { QueuedMessage, TaskMessageQueue } from '@modelcontextprotocol/sdk/experimental/tasks';
import { CursorlogError, CursorlogMcpError, type CursorlogClient } from './client.js';
import { sessionOwner, TaskStoreError } from './tasks.js';

/** The outbound queue: messages to the client, delivered through `tasks/result`. */
const OUTBOUND = 0;

/** Options of a {@link CursorlogTaskMessageQueue}. */
export interface TaskMessageQueueOptions {
  /** The owner of a call's tasks, as the task store's (default: `s:<sessionId>`, or `""`). */
  ownerOf?: (sessionId: string | undefined) => string;
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

  constructor(
    private readonly client: CursorlogClient,
    options: TaskMessageQueueOptions = {},
  ) {
    this.ownerOf = options.ownerOf ?? sessionOwner;
  }

  /**
   * Appends `message` to the task's queue. Throws {@link TaskQueueFullError} when the queue
   * holds `maxSize` messages (absent: the server's bound), and {@link TaskStoreError}
   * (`not-found`) when this owner has no such task.
   */
  async enqueue(taskId: string, message: QueuedMessage, sessionId?: string, maxSize?: number): Promise<void> {
    const id = (message.message as { id?: string | number }).id;
    // The SDK's in-memory queue refuses every message at maxSize 0; cursorlog's max_len 0 means "the server's bound".
    if (maxSize !== undefined && maxSize <= 0) throw new TaskQueueFullError(`Task message queue overflow: task ${taskId} (maxSize ${maxSize})`);
    try {
      await this.client.call('EnqueueTaskMessage', {
        owner: this.ownerOf(sessionId),
        taskId,
        channel: OUTBOUND,
        message: Buffer.from(JSON.stringify(message)),
        ...(maxSize !== undefined ? { maxLen: Math.min(maxSize, 0xffff_ffff) } : {}),
        dedupeKey: randomUUID(),
        ...(message.type === 'request' && id !== undefined ? { correlation: String(id) } : {}),
      });
    } catch (error) {
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
