/**
 * cursorlog's gRPC contract, loaded at run time with `@grpc/proto-loader` (no code generation),
 * and typed views of the messages this adapter uses.
 *
 * The `.proto` file is copied into the package by `npm run build` (`proto/cursorlog.proto`,
 * see `scripts/copy-proto.mjs`), so an installed package finds it next to its code; a
 * checkout of the repository that was not built yet falls back to the repository's own file.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

/** Where the proto file is looked for, in order: the package's copy, then the repository's. */
export const PROTO_CANDIDATES: readonly string[] = [
  fileURLToPath(new URL('../../proto/cursorlog.proto', import.meta.url)),
  fileURLToPath(new URL('../../../../proto/proto/cursorlog/v1/cursorlog.proto', import.meta.url)),
];

/** Where `tasks.proto` (the `cursorlog.v1.Tasks` service) is looked for, in the same order. */
export const TASKS_PROTO_CANDIDATES: readonly string[] = [
  fileURLToPath(new URL('../../proto/tasks.proto', import.meta.url)),
  fileURLToPath(new URL('../../../../proto/proto/cursorlog/v1/tasks.proto', import.meta.url)),
];

/** The first existing `tasks.proto` of {@link TASKS_PROTO_CANDIDATES}; throws naming both when neither exists. */
export function tasksProtoPath(): string {
  for (const candidate of TASKS_PROTO_CANDIDATES) {
    if (existsSync(candidate)) return candidate;
  }
  throw new Error(`tasks.proto not found (looked in ${TASKS_PROTO_CANDIDATES.join(', ')}); run \`npm run build\``);
}

/** The first existing proto file of {@link PROTO_CANDIDATES}; throws naming both when neither exists. */
export function protoPath(): string {
  for (const candidate of PROTO_CANDIDATES) {
    if (existsSync(candidate)) return candidate;
  }
  throw new Error(`cursorlog.proto not found (looked in ${PROTO_CANDIDATES.join(', ')}); run \`npm run build\``);
}

/** u64 values arrive as decimal strings (`longs: String`), so no precision is lost. */
export type U64 = string;

export type StreamStateName =
  | 'STREAM_STATE_UNSPECIFIED'
  | 'STREAM_STATE_OPEN'
  | 'STREAM_STATE_COMPLETED'
  | 'STREAM_STATE_ABORTED'
  | 'STREAM_STATE_SUPERSEDED';

export type VerdictName =
  | 'VERDICT_UNSPECIFIED'
  | 'RESUMABLE'
  | 'MALFORMED_CURSOR'
  | 'UNKNOWN_SESSION'
  | 'EPOCH_MISMATCH'
  | 'UNKNOWN_CURSOR'
  | 'STREAM_MISMATCH'
  | 'STREAM_TERMINATED'
  | 'CURSOR_EVICTED'
  | 'CURSOR_AHEAD';

export interface NewEvent {
  kind: string;
  correlation?: string;
  payload: Buffer;
}

export interface PbEvent {
  id: string;
  stream: U64;
  seq: U64;
  kind?: string;
  correlation?: string;
  payload?: Buffer;
}

export interface PbCursor {
  epoch?: U64;
  stream?: U64;
  seq?: U64;
}

/** A verdict with its facts; absent optional fields were not revealed or do not apply. */
export interface Resolution {
  verdict: VerdictName;
  cursor?: PbCursor;
  currentEpoch?: U64;
  streamState?: StreamStateName;
  head?: U64;
  terminalSeq?: U64;
  watermark?: U64;
  sessionExpired?: boolean;
  detail?: string;
  missedTerminalFrame?: boolean;
  correlation?: string;
}

export interface StreamEnd {
  state: StreamStateName;
  terminalSeq?: U64;
  terminalEventId?: string;
  reason?: string;
}

export interface ReadResponse {
  item: 'resolution' | 'events' | 'end' | 'gap';
  resolution?: Resolution;
  events?: { events?: PbEvent[] };
  end?: StreamEnd;
  gap?: { firstSeq?: U64; lastSeq?: U64 };
}

export interface AppendRequest {
  session: string;
  stream: U64;
  expectedNextSeq?: U64;
  events: NewEvent[];
}

export interface CompleteRequest {
  session: string;
  stream: U64;
  expectedNextSeq?: U64;
  terminal: NewEvent;
}

export interface AppendResponse {
  epoch?: U64;
  stream?: U64;
  firstSeq?: U64;
  lastSeq?: U64;
  duplicate?: boolean;
  eventIds?: string[];
}

export interface TerminateResponse {
  stream?: U64;
  state?: StreamStateName;
  terminalSeq?: U64;
  terminalEventId?: string;
  duplicate?: boolean;
}

export interface OpenStreamRequest {
  session: string;
  epoch: U64;
  correlation?: string;
  leaseMs?: U64;
}

export interface OpenStreamResponse {
  stream: U64;
  epoch: U64;
  startEventId: string;
}

export interface BatchItem {
  append?: AppendRequest;
  complete?: CompleteRequest;
  open?: OpenStreamRequest;
}

export interface BatchResult {
  result: 'appended' | 'completed' | 'opened' | 'failure';
  appended?: AppendResponse;
  completed?: TerminateResponse;
  opened?: OpenStreamResponse;
  failure?: { code?: number; message?: string };
}

export interface Outcome {
  stream?: U64;
  epoch?: U64;
  state?: StreamStateName;
  terminalSeq?: U64;
  terminalEventId?: string;
  frame?: PbEvent;
  reason?: string;
}

/** The typed unary RPCs this adapter calls (requests and responses as plain objects). */
export interface Rpcs {
  OpenSession: [{ session: string; state?: Buffer }, { session: string; epoch: U64; created?: boolean; state?: Buffer }];
  GetSession: [
    { session: string },
    { session: string; epoch: U64; state?: Buffer; expired?: boolean; idleTtlMs?: U64 },
  ];
  ExpireSession: [{ session: string }, { abortedStreams?: U64[] }];
  OpenStream: [OpenStreamRequest, OpenStreamResponse];
  AppendBatch: [{ items: BatchItem[] }, { results?: BatchResult[] }];
  Abort: [{ session: string; stream: U64; reason: string }, TerminateResponse];
  KeepAlive: [{ session: string; stream?: U64 }, Record<string, never>];
  Resolve: [{ session: string; lastEventId: string; declaredStream?: U64 }, Resolution];
  GetOutcome: [{ session: string; correlation?: string; stream?: U64 }, { found?: boolean; outcome?: Outcome }];
  Trim: [{ session: string; stream: U64; upToSeq: U64 }, { watermark?: U64 }];
  Stats: [Record<string, never>, Record<string, unknown>];
}

/** The typed unary RPCs of `cursorlog.v1.Tasks` (see `tasks.proto`). */
export interface TaskRpcs {
  CreateTask: [PbCreateTaskRequest, { task?: PbTask; created?: boolean }];
  GetTask: [{ owner: string; taskId: string; includeOutcome?: boolean }, PbGetTaskResponse];
  ListTasks: [{ owner: string; cursor?: string; pageSize?: number }, { tasks?: PbTask[]; nextCursor?: string }];
  UpdateTask: [PbUpdateTaskRequest, { task?: PbTask; duplicate?: boolean }];
  FinishTask: [PbFinishTaskRequest, { task?: PbTask; duplicate?: boolean }];
  CancelTask: [
    { owner: string; taskId: string; mode: 'REQUEST' | 'TERMINAL'; statusMessage?: string },
    { task?: PbTask; alreadyTerminal?: boolean },
  ];
  DeleteTask: [{ owner: string; taskId: string }, { task?: PbTask }];
  KeepAliveTask: [{ owner: string; taskId: string }, Record<string, never>];
  EnqueueTaskMessage: [
    { owner: string; taskId: string; channel: number; message: Buffer; maxLen?: number; dedupeKey?: string; correlation?: string },
    { qseq?: U64; duplicate?: boolean },
  ];
  DequeueTaskMessages: [
    { owner: string; taskId: string; channel: number; maxMessages?: number; token: string },
    { messages?: { qseq?: U64; message?: Buffer; atMs?: U64; correlation?: string }[]; duplicate?: boolean },
  ];
  RouteTaskMessage: [
    { owner: string; correlation: string; message: Buffer },
    { routed?: boolean; taskId?: string; qseq?: U64; duplicate?: boolean },
  ];
}

/** The names of {@link TaskRpcs}: these go to the `Tasks` service, every other RPC to `CursorLog`. */
export const TASK_RPCS: ReadonlySet<string> = new Set([
  'CreateTask',
  'GetTask',
  'ListTasks',
  'UpdateTask',
  'RequestInput',
  'AnswerInput',
  'CancelTask',
  'FinishTask',
  'DeleteTask',
  'WatchTask',
  'KeepAliveTask',
  'EnqueueTaskMessage',
  'DequeueTaskMessages',
  'RouteTaskMessage',
]);

export type PbTaskStatus = 'TASK_STATUS_UNSPECIFIED' | 'WORKING' | 'INPUT_REQUIRED' | 'COMPLETED' | 'FAILED' | 'CANCELLED';
export type PbTaskVerdict = 'TASK_VERDICT_UNSPECIFIED' | 'TASK_FOUND' | 'TASK_EXPIRED' | 'TASK_DELETED' | 'TASK_UNKNOWN';

/** `cursorlog.v1.Task` (absent optional fields: not set). */
export interface PbTask {
  taskId: string;
  status: PbTaskStatus;
  statusMessage?: string;
  createdAtMs?: U64;
  lastUpdatedAtMs?: U64;
  ttlMs?: U64;
  pollIntervalMs?: U64;
  version?: U64;
  cancelRequested?: boolean;
  context?: Buffer;
  requestKey?: string;
  endedAtMs?: U64;
}

export interface PbTaskOutcome {
  kind?: 'KIND_UNSPECIFIED' | 'RESULT' | 'ERROR';
  json?: Buffer;
}

export interface PbGetTaskResponse {
  verdict: PbTaskVerdict;
  view?: { task?: PbTask; outcome?: PbTaskOutcome; outboundQueued?: U64; inboundQueued?: U64 };
  deletedAtMs?: U64;
  finalStatus?: PbTaskStatus;
}

export interface PbCreateTaskRequest {
  owner: string;
  taskId: string;
  requestKey: string;
  ttlMs?: U64;
  pollIntervalMs?: U64;
  workerLeaseMs?: U64;
  statusMessage?: string;
  context?: Buffer;
}

export interface PbUpdateTaskRequest {
  owner: string;
  taskId: string;
  expectedVersion?: U64;
  status: PbTaskStatus;
  statusMessage?: string;
  ttlMs?: U64;
  pollIntervalMs?: U64;
}

export interface PbFinishTaskRequest {
  owner: string;
  taskId: string;
  expectedVersion?: U64;
  status: PbTaskStatus;
  statusMessage?: string;
  outcome?: PbTaskOutcome;
}

export interface ReadRequest {
  session: string;
  lastEventId: string;
  follow?: boolean;
  resumeOwnStream?: boolean;
  batchEventsMax?: number;
}

/** The generated grpc-js client constructor for `cursorlog.v1.Tasks`. */
export function loadTasksConstructor(): grpc.ServiceClientConstructor {
  const definition = protoLoader.loadSync(tasksProtoPath(), {
    keepCase: false,
    longs: String,
    enums: String,
    defaults: false,
    oneofs: true,
  });
  const loaded = grpc.loadPackageDefinition(definition) as unknown as {
    cursorlog?: { v1?: { Tasks?: grpc.ServiceClientConstructor } };
  };
  const ctor = loaded.cursorlog?.v1?.Tasks;
  if (ctor === undefined) throw new Error(`${tasksProtoPath()} does not define cursorlog.v1.Tasks`);
  return ctor;
}

/** The generated grpc-js client constructor for `cursorlog.v1.CursorLog`. */
export function loadClientConstructor(): grpc.ServiceClientConstructor {
  const definition = protoLoader.loadSync(protoPath(), {
    keepCase: false,
    longs: String,
    enums: String,
    defaults: false,
    oneofs: true,
  });
  const loaded = grpc.loadPackageDefinition(definition) as unknown as {
    cursorlog?: { v1?: { CursorLog?: grpc.ServiceClientConstructor } };
  };
  const ctor = loaded.cursorlog?.v1?.CursorLog;
  if (ctor === undefined) throw new Error(`${protoPath()} does not define cursorlog.v1.CursorLog`);
  return ctor;
}
