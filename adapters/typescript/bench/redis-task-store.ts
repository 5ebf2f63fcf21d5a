/**
 * The tasks benchmark's baseline: a Redis-backed `TaskStore` of `@modelcontextprotocol/sdk`
 * 1.32.x written the way users write one (docs/TASKS-DESIGN.md §5.3):
 *
 * - one JSON string per task, `task:{id}` = `{task, sessionId, result?}`, written with
 *   `SET … PX ttl` (no TTL: a plain `SET`);
 * - a sorted set per owner, `tasks:{owner}`, scored by creation time, for `listTasks`;
 * - every update is a read-modify-write (`GET`, change, `SET`) with no `WATCH`: two replicas
 *   racing to end a task can both "win" (this store has no compare-and-set; the table says so).
 *
 * Durability is the Redis server's (`appendonly yes` with `appendfsync always` or `everysec`).
 */
import { randomUUID } from 'node:crypto';
import type { CreateTaskOptions, TaskStore } from '@modelcontextprotocol/sdk/experimental/tasks';
import type { Request, RequestId, Result, Task } from '@modelcontextprotocol/sdk/types.js';
import type { Redis } from 'ioredis';

interface Stored {
  task: Task;
  sessionId?: string;
  result?: Result;
}

const terminal = (s: Task['status']): boolean => s === 'completed' || s === 'failed' || s === 'cancelled';

export class RedisTaskStore implements TaskStore {
  constructor(private readonly redis: Redis) {}

  private async load(taskId: string, sessionId?: string): Promise<Stored | undefined> {
    const raw = await this.redis.get(`task:${taskId}`);
    if (raw === null) return undefined;
    const stored = JSON.parse(raw) as Stored;
    if (stored.sessionId !== sessionId) return undefined;
    return stored;
  }

  private async save(stored: Stored): Promise<void> {
    const key = `task:${stored.task.taskId}`;
    if (stored.task.ttl) await this.redis.set(key, JSON.stringify(stored), 'PX', stored.task.ttl);
    else await this.redis.set(key, JSON.stringify(stored));
  }

  async createTask(taskParams: CreateTaskOptions, _requestId: RequestId, _request: Request, sessionId?: string): Promise<Task> {
    const now = new Date().toISOString();
    const task: Task = {
      taskId: randomUUID(),
      status: 'working',
      ttl: taskParams.ttl ?? null,
      createdAt: now,
      lastUpdatedAt: now,
      pollInterval: taskParams.pollInterval ?? 1000,
    };
    await this.save({ task, ...(sessionId !== undefined ? { sessionId } : {}) });
    await this.redis.zadd(`tasks:${sessionId ?? ''}`, Date.now(), task.taskId);
    return task;
  }

  async getTask(taskId: string, sessionId?: string): Promise<Task | null> {
    return (await this.load(taskId, sessionId))?.task ?? null;
  }

  async storeTaskResult(taskId: string, status: 'completed' | 'failed', result: Result, sessionId?: string): Promise<void> {
    const stored = await this.load(taskId, sessionId);
    if (stored === undefined) throw new Error(`Task with ID ${taskId} not found`);
    if (terminal(stored.task.status)) throw new Error(`Cannot store result for task ${taskId} in terminal status '${stored.task.status}'`);
    stored.task.status = status;
    stored.task.lastUpdatedAt = new Date().toISOString();
    stored.result = result;
    await this.save(stored);
  }

  async getTaskResult(taskId: string, sessionId?: string): Promise<Result> {
    const stored = await this.load(taskId, sessionId);
    if (stored === undefined) throw new Error(`Task with ID ${taskId} not found`);
    if (stored.result === undefined) throw new Error(`Task ${taskId} has no result stored`);
    return stored.result;
  }

  async updateTaskStatus(taskId: string, status: Task['status'], statusMessage?: string, sessionId?: string): Promise<void> {
    const stored = await this.load(taskId, sessionId);
    if (stored === undefined) throw new Error(`Task with ID ${taskId} not found`);
    if (terminal(stored.task.status)) throw new Error(`Cannot update task ${taskId} from terminal status '${stored.task.status}'`);
    stored.task.status = status;
    if (statusMessage) stored.task.statusMessage = statusMessage;
    stored.task.lastUpdatedAt = new Date().toISOString();
    await this.save(stored);
  }

  async listTasks(cursor?: string, sessionId?: string): Promise<{ tasks: Task[]; nextCursor?: string }> {
    const key = `tasks:${sessionId ?? ''}`;
    let start = 0;
    if (cursor) {
      const rank = await this.redis.zrank(key, cursor);
      if (rank === null) throw new Error(`Invalid cursor: ${cursor}`);
      start = rank + 1;
    }
    const ids = await this.redis.zrange(key, start, start + 10);
    const page = ids.slice(0, 10);
    const tasks: Task[] = [];
    for (const id of page) {
      const t = await this.getTask(id, sessionId);
      if (t !== null) tasks.push(t);
    }
    return ids.length > 10 ? { tasks, nextCursor: page[page.length - 1]! } : { tasks };
  }
}
