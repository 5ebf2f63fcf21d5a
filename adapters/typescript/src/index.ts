/**
 * @cursorlog/mcp: resumable Streamable HTTP for the MCP TypeScript SDK (1.32.x), backed by
 * cursorlog. See README.md.
 */
export { Cursorlog, defaultLogger, type CursorlogOptions, type Logger } from './core.js';
export { CursorlogSessions, type SessionsOptions, type Connectable } from './sessions.js';
export { SessionEventStore, parseCursor } from './store.js';
export { CursorlogClient, CursorlogError, CursorlogMcpError, type ClientOptions, type AllRpcs } from './client.js';
export { Router, parseAddresses, isIdempotent, mayRetry, type RetryHint, type BackoffOptions } from './router.js';
export { Producer, type ProducerOptions, type ProducerStats } from './producer.js';
export {
  RESUME_DISCONTINUITY,
  PRODUCER_ABORTED,
  ANSWERED_SUFFIX,
  discontinuityError,
  gapMarker,
  plan,
  resolutionFacts,
  type Reason,
  type Facts,
  type Plan,
} from './resume.js';
export { SdkCompatibilityError, SUPPORTED_SDK_RANGE, installedSdkVersion, sdkVersionSupported } from './sdk-internals.js';

import { Cursorlog as CursorlogClass } from './core.js';
import { CursorlogSessions as Sessions, type SessionsOptions as Options } from './sessions.js';

/** Shorthand: the session-aware request handler of a {@link Cursorlog}. */
export function cursorlogSessions(cursorlog: CursorlogClass, options: Options): Sessions {
  return new Sessions(cursorlog, options);
}
export {
  CursorlogTaskStore,
  TaskStoreError,
  sessionOwner,
  toSdkTask,
  DEFAULT_POLL_INTERVAL_MS,
  type TaskStoreOptions,
} from './tasks.js';
export { CursorlogTaskMessageQueue, TaskQueueFullError, type TaskMessageQueueOptions } from './task-queue.js';
export { TASK_REQUEST_ID_PREFIX, type TaskAnswersStats } from './task-answers.js';
