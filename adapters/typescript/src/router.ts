/**
 * Leader routing for a replicated cursorlog (`cursorlog serve --node-id … --peers …`): which
 * member to call next after an `UNAVAILABLE`, how long to wait first, and whether the failed
 * call may be sent again. Pure logic (no network), so it is unit-tested on its own.
 *
 * A member that is not the leader answers `UNAVAILABLE` with the headers
 * `cursorlog-leader: HOST:PORT` (when it knows the leader) and `cursorlog-retry: safe`
 * (nothing was proposed) or `outcome-unknown` (the call may have taken effect). Without a
 * leader header (an election is under way, the member is down or cut off) the client backs
 * off (bounded exponential) and tries the next address of its list.
 */

/** The `cursorlog-retry` header of an `UNAVAILABLE` answer (absent on transport failures). */
export type RetryHint = 'safe' | 'outcome-unknown' | undefined;

/**
 * Tasks RPCs always safe to resend (tasks.proto "Retry classes"): the reads, `CreateTask` (by
 * its `request_key`), `FinishTask` (a restated end is `duplicate`), `AnswerInput` (answered keys
 * are ignored), `CancelTask` (an ended task is acknowledged), `KeepAliveTask` and
 * `RouteTaskMessage` (a resent route of an answer is `duplicate`). Not
 * `UpdateTask` without `expected_version`, `RequestInput` or `DeleteTask` (a second delete is
 * NOT_FOUND).
 */
const TASK_ALWAYS = ['GetTask', 'ListTasks', 'WatchTask', 'CreateTask', 'FinishTask', 'AnswerInput', 'CancelTask', 'KeepAliveTask', 'RouteTaskMessage'];

/**
 * Calls always safe to resend: the reads that give verdicts (served by the leader only),
 * `Stats`, `KeepAlive` (a renewal twice is one renewal) and `OpenSession` (keyed by the
 * session id the caller chose).
 */
const ALWAYS = new Set(['Resolve', 'Read', 'GetOutcome', 'GetSession', 'Stats', 'KeepAlive', 'OpenSession', ...TASK_ALWAYS]);

/**
 * Splits an address option into the member list: a comma-separated string
 * (`"h1:7001,h2:7002"`; a single address is a list of one) or an array. Rejects an empty list.
 */
export function parseAddresses(address: string | readonly string[]): string[] {
  const list = (typeof address === 'string' ? address.split(',') : [...address]).map((a) => a.trim()).filter((a) => a.length > 0);
  if (list.length === 0) throw new RangeError('cursorlog address list is empty');
  return [...new Set(list)];
}

/** An item of an `AppendBatch` request, as far as retry safety is concerned. */
interface BatchItemShape {
  open?: unknown;
  append?: { expectedNextSeq?: unknown };
  complete?: { expectedNextSeq?: unknown };
}

const hasSeq = (x: { expectedNextSeq?: unknown } | undefined): boolean => x?.expectedNextSeq !== undefined && x.expectedNextSeq !== null;

/**
 * True when resending `request` to `rpc` cannot apply it twice: reads, `KeepAlive`,
 * `OpenSession` (the server dedups by session id), and appends / completions that carry
 * `expected_next_seq` (a retry of one that was applied is answered `duplicate`). An
 * `OpenStream` (or an `AppendBatch` with an `open` item) is not: a resend opens another stream.
 */
export function isIdempotent(rpc: string, request: unknown): boolean {
  if (ALWAYS.has(rpc)) return true;
  const r = (request ?? {}) as { expectedNextSeq?: unknown; items?: BatchItemShape[] };
  if (rpc === 'Append' || rpc === 'Complete') return hasSeq(r);
  // A compare-and-set update applied before is refused (ABORTED) on a resend, never applied twice.
  if (rpc === 'UpdateTask') return (r as { expectedVersion?: unknown }).expectedVersion != null;
  // A resent enqueue with its dedupe key is `duplicate`; a resent dequeue with its token answers the same messages.
  if (rpc === 'EnqueueTaskMessage') return (r as { dedupeKey?: unknown }).dedupeKey != null;
  if (rpc === 'DequeueTaskMessages') return (r as { token?: unknown }).token != null;
  if (rpc === 'AppendBatch') {
    return (r.items ?? []).every((item) => item.open === undefined && (item.append !== undefined ? hasSeq(item.append) : hasSeq(item.complete)));
  }
  return false;
}

/** Whether a call that failed with UNAVAILABLE and `hint` may be sent again. */
export function mayRetry(rpc: string, request: unknown, hint: RetryHint): boolean {
  return hint === 'safe' || isIdempotent(rpc, request);
}

/** Backoff bounds of a {@link Router}. */
export interface BackoffOptions {
  /** First wait when no member names a leader, ms (default 50). */
  minBackoffMs?: number;
  /** Longest wait, ms (default 400). */
  maxBackoffMs?: number;
}

/**
 * Which member to call. `current` is the member believed to lead; after a failure,
 * {@link Router.failed} moves it (to the named leader, else to the next address) and says
 * how long to wait before the next attempt. Shared by every call of a client.
 */
export class Router {
  private readonly list: string[];
  private index = 0;
  private streak = 0;
  private readonly minMs: number;
  private readonly maxMs: number;

  constructor(addresses: string | readonly string[], options: BackoffOptions = {}) {
    this.list = parseAddresses(addresses);
    this.minMs = options.minBackoffMs ?? 50;
    this.maxMs = options.maxBackoffMs ?? 400;
  }

  /** The members known (the configured list, plus leaders named by hints). */
  get addresses(): readonly string[] {
    return this.list;
  }

  /** The member to call now. */
  get current(): string {
    return this.list[this.index]!;
  }

  /** A call to `address` succeeded: it leads; the backoff starts over. */
  succeeded(address: string): void {
    this.streak = 0;
    const i = this.list.indexOf(address);
    if (i >= 0) this.index = i;
  }

  /**
   * A call to `address` failed with UNAVAILABLE and leader hint `leader` (if any). Returns
   * the wait (ms) before the next attempt, which goes to {@link Router.current}: the named
   * leader at once (the first time in a row), else the next address after a backoff of
   * min·2^n capped at max.
   */
  failed(address: string, leader: string | undefined): number {
    const streak = this.streak;
    this.streak += 1;
    if (leader !== undefined && leader.length > 0 && leader !== address) {
      let i = this.list.indexOf(leader);
      if (i < 0) {
        this.list.push(leader);
        i = this.list.length - 1;
      }
      this.index = i;
      return streak === 0 ? 0 : this.backoff(streak);
    }
    const at = this.list.indexOf(address);
    // Another call may have moved on already; only advance from the member that failed.
    if (at === this.index) this.index = (at + 1) % this.list.length;
    return this.backoff(streak);
  }

  private backoff(streak: number): number {
    return Math.min(this.maxMs, this.minMs * 2 ** Math.min(streak, 16));
  }
}
