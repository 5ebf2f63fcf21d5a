/**
 * `CursorlogTaskStore`: the `TaskStore` of `@modelcontextprotocol/sdk` 1.32.x (the 2025-11-25
 * tasks, SEP-1686) on cursorlog's `cursorlog.v1.Tasks` service, so every replica of an MCP
 * server reads and writes the same durable tasks: a task created on replica A is found by a
 * `tasks/get` on replica B, and its result is fetched through `tasks/result` anywhere
 * (docs/TASKS-DESIGN.md §4.1).
 *
 * The owner rule: a task belongs to `s:<sessionId>` (the MCP session of the request that
 * created it) or, without a session (stateless servers), to `""`; only the same owner finds
 * it. Another session's task is `null` / "not found", never "forbidden". (The SDK's
 * `InMemoryTaskStore` hides a task only when both sides have a session; this store hides it
 * whenever the owners differ.) {@link TaskStoreOptions.ownerOf} replaces the rule, e.g. to
 * bind tasks to an authorization context.
 */
import { randomUUID } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import type { CreateTaskOptions, TaskStore } from '@modelcontextprotocol/sdk/experimental/tasks';
import type { Request, RequestId, Result, Task } from '@modelcontextprotocol/sdk/types.js';
import { CursorlogError, CursorlogMcpError, type CursorlogClient } from './client.js';
import type { PbTask, PbTaskStatus } from './proto.js';

/** The SDK's default poll interval (`InMemoryTaskStore` uses 1000 ms). */
export const DEFAULT_POLL_INTERVAL_MS = 1000;

/** The largest `request` kept in a task's context; a larger one keeps only its method (the server caps context at 64 KiB). */
const CONTEXT_REQUEST_MAX = 32 * 1024;

/** Options of a {@link CursorlogTaskStore}. */
export interface TaskStoreOptions {
  /**
   * The owner of a call's tasks, from the SDK's `sessionId` (default: `s:<sessionId>`, or `""`
   * without a session). At most 256 bytes.
   */
  ownerOf?: (sessionId: string | undefined) => string;
  /** A worker lease for every task (ms): without a write or a renewal within it, cursorlog fails the task. Default: none. */
  workerLeaseMs?: number;
}

/** A task operation the SDK's contract refuses (unknown task, terminal task, no result yet). Thrown as the SDK's `InMemoryTaskStore` throws. */
export class TaskStoreError extends CursorlogMcpError {
  override name = 'TaskStoreError';
  constructor(
    message: string,
    /** Why: `not-found`, `terminal` (the task has ended), `no-result` (not ended, or ended without a result). */
    readonly reason: 'not-found' | 'terminal' | 'no-result',
  ) {
    super(message);
  }
}

const TO_PB: Record<Task['status'], PbTaskStatus> = {
  working: 'WORKING',
  input_required: 'INPUT_REQUIRED',
  completed: 'COMPLETED',
  failed: 'FAILED',
  cancelled: 'CANCELLED',
};

const FROM_PB: Partial<Record<PbTaskStatus, Task['status']>> = {
  WORKING: 'working',
  INPUT_REQUIRED: 'input_required',
  COMPLETED: 'completed',
  FAILED: 'failed',
  CANCELLED: 'cancelled',
};

const isTerminalStatus = (s: Task['status']): boolean => s === 'completed' || s === 'failed' || s === 'cancelled';

/** The default owner rule: `s:<sessionId>`, or `""` without a session. */
export function sessionOwner(sessionId: string | undefined): string {
  return sessionId === undefined ? '' : `s:${sessionId}`;
}

const iso = (ms: string | undefined): string => new Date(Number(ms ?? '0')).toISOString();

/** A cursorlog task as the SDK's `Task` (ISO times; `ttl` null when cursorlog granted none). */
export function toSdkTask(t: PbTask): Task {
  const status = FROM_PB[t.status];
  if (status === undefined) throw new CursorlogMcpError(`cursorlog sent task ${t.taskId} with status ${t.status}`);
  const task: Task = {
    taskId: t.taskId,
    status,
    ttl: t.ttlMs === undefined ? null : Number(t.ttlMs),
    createdAt: iso(t.createdAtMs),
    lastUpdatedAt: iso(t.lastUpdatedAtMs ?? t.createdAtMs),
    pollInterval: t.pollIntervalMs === undefined ? DEFAULT_POLL_INTERVAL_MS : Number(t.pollIntervalMs),
  };
  if (t.statusMessage !== undefined) task.statusMessage = t.statusMessage;
  return task;
}

/**
 * The SDK's `TaskStore` on cursorlog. Every write is durable (on a cluster: quorum-committed)
 * before it resolves; reads are linearizable, from any replica. Share one
 * {@link CursorlogClient} per process.
 */
export class CursorlogTaskStore implements TaskStore {
  private readonly ownerOf: (sessionId: string | undefined) => string;
  private readonly workerLeaseMs: number | undefined;

  constructor(
    private readonly client: CursorlogClient,
    options: TaskStoreOptions = {},
  ) {
    this.ownerOf = options.ownerOf ?? sessionOwner;
    this.workerLeaseMs = options.workerLeaseMs;
  }

  /**
   * Creates the task durably (`CreateTask`). Its id is a random UUID; its idempotency key is
   * the JSON-RPC request id, scoped by the owner, so a create retried after an unknown outcome
   * returns the first task. Without a session the owner `""` is shared by every client, whose
   * request ids collide (each client counts from 0): then the key also carries a random part,
   * and only this call's own retries are deduplicated.
   */
  async createTask(taskParams: CreateTaskOptions, requestId: RequestId, request: Request, sessionId?: string): Promise<Task> {
    const owner = this.ownerOf(sessionId);
    const requestKey = sessionId === undefined ? `${String(requestId)}#${randomUUID()}` : String(requestId);
    let kept: unknown = request;
    if (JSON.stringify(request).length > CONTEXT_REQUEST_MAX) kept = { method: request.method, truncated: true };
    const context = Buffer.from(JSON.stringify({ requestId, request: kept, context: taskParams.context }));
    const response = await this.client.call('CreateTask', {
      owner,
      taskId: randomUUID(),
      requestKey,
      // null (unlimited) is not expressible: cursorlog applies its default and its cap, and the task says what was granted.
      ...(taskParams.ttl != null ? { ttlMs: String(taskParams.ttl) } : {}),
      pollIntervalMs: String(taskParams.pollInterval ?? DEFAULT_POLL_INTERVAL_MS),
      ...(this.workerLeaseMs !== undefined ? { workerLeaseMs: String(this.workerLeaseMs) } : {}),
      context,
    });
    if (response.task === undefined) throw new CursorlogMcpError('cursorlog CreateTask answered without a task');
    return toSdkTask(response.task);
  }

  /** The task (`GetTask`, linearizable), or `null` when this owner has no such task (unknown, another owner's, expired or deleted). */
  async getTask(taskId: string, sessionId?: string): Promise<Task | null> {
    const response = await this.client.call('GetTask', { owner: this.ownerOf(sessionId), taskId });
    if (response.verdict !== 'TASK_FOUND' || response.view?.task === undefined) return null;
    return toSdkTask(response.view.task);
  }

  /**
   * Ends the task with `status` and `result` in ONE durable write (`FinishTask`): a reader
   * never sees a completed task without its result. Throws {@link TaskStoreError} when the task
   * ended before (a racing replica won) or is not found.
   */
  async storeTaskResult(taskId: string, status: 'completed' | 'failed', result: Result, sessionId?: string): Promise<void> {
    await this.finish(taskId, status, undefined, result, sessionId, 'store result for');
  }

  /** The stored result (`GetTask` with the outcome). Throws {@link TaskStoreError} when not found, not ended, or ended without a result. */
  async getTaskResult(taskId: string, sessionId?: string): Promise<Result> {
    const response = await this.client.call('GetTask', { owner: this.ownerOf(sessionId), taskId, includeOutcome: true });
    const task = response.view?.task;
    if (response.verdict !== 'TASK_FOUND' || task === undefined) throw new TaskStoreError(`Task with ID ${taskId} not found`, 'not-found');
    const outcome = response.view?.outcome;
    if (outcome?.json === undefined || outcome.json.length === 0 || outcome.kind !== 'RESULT') {
      const status = FROM_PB[task.status] ?? task.status;
      throw new TaskStoreError(`Task ${taskId} has no result stored (status '${status}')`, 'no-result');
    }
    return JSON.parse(outcome.json.toString('utf8')) as Result;
  }

  /**
   * Moves the task: `working` / `input_required` through `UpdateTask`, a terminal status
   * through `FinishTask` with no outcome (a `tasks/cancel`, or a failure without a result).
   * Throws {@link TaskStoreError} when the task has ended (as the SDK's store does) or is not found.
   */
  async updateTaskStatus(taskId: string, status: Task['status'], statusMessage?: string, sessionId?: string): Promise<void> {
    if (isTerminalStatus(status)) {
      await this.finish(taskId, status, statusMessage, undefined, sessionId, 'update');
      return;
    }
    const owner = this.ownerOf(sessionId);
    try {
      await this.client.call('UpdateTask', {
        owner,
        taskId,
        status: TO_PB[status],
        ...(statusMessage ? { statusMessage } : {}),
      });
    } catch (error) {
      throw this.refusal(error, taskId, `update task ${taskId} to '${status}'`);
    }
  }

  /** One page (10 tasks) of the owner's tasks in creation order; `nextCursor` is cursorlog's opaque cursor. An invalid cursor throws. */
  async listTasks(cursor?: string, sessionId?: string): Promise<{ tasks: Task[]; nextCursor?: string }> {
    const response = await this.client.call('ListTasks', { owner: this.ownerOf(sessionId), pageSize: 10, ...(cursor ? { cursor } : {}) });
    const tasks = (response.tasks ?? []).map(toSdkTask);
    return response.nextCursor ? { tasks, nextCursor: response.nextCursor } : { tasks };
  }

  private async finish(
    taskId: string,
    status: Task['status'],
    statusMessage: string | undefined,
    result: Result | undefined,
    sessionId: string | undefined,
    what: string,
  ): Promise<void> {
    try {
      await this.client.call('FinishTask', {
        owner: this.ownerOf(sessionId),
        taskId,
        status: TO_PB[status],
        ...(statusMessage ? { statusMessage } : {}),
        ...(result !== undefined ? { outcome: { kind: 'RESULT' as const, json: Buffer.from(JSON.stringify(result)) } } : {}),
      });
    } catch (error) {
      throw this.refusal(error, taskId, `${what} task ${taskId} ('${status}')`);
    }
  }

  /** NOT_FOUND and FAILED_PRECONDITION as the SDK's store words them; anything else unchanged. */
  private refusal(error: unknown, taskId: string, what: string): Error {
    if (error instanceof CursorlogError) {
      if (error.code === grpc.status.NOT_FOUND) return new TaskStoreError(`Task with ID ${taskId} not found`, 'not-found');
      if (error.code === grpc.status.FAILED_PRECONDITION) {
        return new TaskStoreError(`Cannot ${what}: the task is in a terminal status (${error.details}). Terminal states (completed, failed, cancelled) cannot transition to other states.`, 'terminal');
      }
    }
    return error as Error;
  }
}
