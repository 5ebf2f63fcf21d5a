/**
 * The benchmark's baseline: an `EventStore` on Redis Streams of the kind MCP users write
 * today, made faithful (and session-isolated, as it must be):
 *
 * - one Redis stream per (session, SDK stream): `mcp:{session}:{streamId}`;
 * - `storeEvent` = one `XADD key MAXLEN ~ 10000 * m <json>` (priming `{}` included, as the SDK
 *   hands it in), event id `{streamId}|{redis id}`;
 * - `getStreamIdForEventId` parses the id and checks the key exists (unknown → 400);
 * - `replayEventsAfter` = `XRANGE key (id +`, skipping priming rows.
 *
 * Durability comes from the Redis server (`appendonly yes`, `appendfsync always`): an
 * `XADD` is answered after its AOF write is fsynced. One connection carries every session's
 * commands (ioredis pipelines concurrent commands on it).
 */
import type { EventStore, EventId, StreamId } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js';
import { Redis } from 'ioredis';

/** A connected ioredis client (rejects when Redis is unreachable). */
export async function connectRedis(port: number): Promise<Redis> {
  const redis = new Redis({ host: '127.0.0.1', port, lazyConnect: true, maxRetriesPerRequest: 2 });
  await redis.connect();
  return redis;
}

export class RedisEventStore implements EventStore {
  constructor(
    private readonly redis: Redis,
    private readonly session: string,
  ) {}

  private key(streamId: string): string {
    return `mcp:${this.session}:${streamId}`;
  }

  async storeEvent(streamId: StreamId, message: JSONRPCMessage): Promise<EventId> {
    const id = await this.redis.xadd(this.key(streamId), 'MAXLEN', '~', '10000', '*', 'm', JSON.stringify(message));
    if (id === null) throw new Error(`XADD to ${this.key(streamId)} returned no id`);
    return `${streamId}|${id}`;
  }

  async getStreamIdForEventId(eventId: EventId): Promise<StreamId | undefined> {
    const bar = eventId.lastIndexOf('|');
    if (bar <= 0) return undefined;
    const streamId = eventId.slice(0, bar);
    return (await this.redis.exists(this.key(streamId))) === 1 ? streamId : undefined;
  }

  async replayEventsAfter(
    lastEventId: EventId,
    { send }: { send: (eventId: EventId, message: JSONRPCMessage) => Promise<void> },
  ): Promise<StreamId> {
    const bar = lastEventId.lastIndexOf('|');
    if (bar <= 0) throw new Error(`malformed event id ${lastEventId}`);
    const streamId = lastEventId.slice(0, bar);
    const after = lastEventId.slice(bar + 1);
    const rows = await this.redis.xrange(this.key(streamId), `(${after}`, '+');
    for (const [id, fields] of rows) {
      const json = fields[1];
      if (json === undefined || json === '{}') continue;
      await send(`${streamId}|${id}`, JSON.parse(json) as JSONRPCMessage);
    }
    return streamId;
  }
}
