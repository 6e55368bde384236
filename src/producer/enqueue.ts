import { BerthInputError, notMigrated } from '../errors.js';
import { DEFAULT_SCHEMA, type Queryable, type Schema } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor, type Storage } from '../storage/storage.js';
import { isScheduleKey } from '../schedule.js';
import { validatePayload } from '../task.js';
import type { PayloadOf, TaskTypeLike, TaskTypeName } from '../task-type.js';
import { captureTraceContext } from '../tracing.js';
import { executorFor, explainPreparedStatementError, isPreparedStatementsOption } from '../db/prepared.js';
import {
  checkDependencyOptions,
  type DependencyRef,
  enqueueGraph,
  type GraphEntry,
  type ParentFailurePolicy,
} from './enqueue-graph.js';
import {
  checkInteger,
  checkKeys,
  checkMs,
  checkPayloadJson,
  checkText,
  MAX_ATTEMPTS_LIMIT,
  MAX_DEDUPE_KEY_BYTES,
  MAX_QUEUE_BYTES,
  MAX_RUN_AT_MS,
  MAX_TYPE_CHARS,
  MIN_RUN_AT_MS,
} from '../limits.js';

export interface EnqueueOptions {
  /** When the task becomes due (absolute). */
  runAt?: Date;
  /** Delay in ms, measured on the database clock. Ignored when `runAt` is set. */
  delay?: number;
  /** Lower runs first. smallint range; default 0. */
  priority?: number;
  /** Default: the definition's queue when a definition is passed, else `default`. This option wins over both. */
  queue?: string;
  /** At most one live (not dead, not finished) task per key. */
  dedupeKey?: string;
  /**
   * At most K tasks with the same concurrency key run at once across the fleet (K: the task
   * type's key limit, else its queue's, else 1; `setKeyLimit`). The others wait, holding no slot
   * and no attempt, and never hold up other keys of their lane. At most 1024 UTF-8 bytes.
   */
  concurrencyKey?: string;
  /** Default: the definition's (passed here, or the worker's at claim), else 20. */
  maxAttempts?: number;
  /**
   * Run only after these tasks have completed: ids of tasks enqueued earlier, or, in an
   * `enqueueMany` call, `{ ref }` naming another entry of the same call (its `ref`), so a whole
   * graph is written in one transaction. The task waits (state `waiting`) until the last of them
   * completes, and is refused if one is dead, cancelled or unknown.
   */
  dependsOn?: readonly DependencyRef[];
  /**
   * What happens to this task if a task it depends on dies (dead letter): `cancel` (the default)
   * cancels it; `wait` keeps it waiting until that task is retried from the dead letters and
   * completes. A parent that is cancelled or deleted cancels it either way.
   */
  onParentFailure?: ParentFailurePolicy;
  /** Pin a lane shard (0-63). Default: chosen per transaction among `shards`. */
  shard?: number;
  /** How many shards the default shard is chosen among (default 16). */
  shards?: number;
  /** Installation schema (default `berth`). */
  schema?: string;
  /**
   * false: this call sends its statements unnamed instead of prepared once per connection, for a
   * transaction-mode pooler without prepared-statement support (PgBouncer before 1.21).
   * Default true. `withoutPreparedStatements(pool)` does the same for every call on that pool.
   */
  preparedStatements?: boolean;
}

/**
 * What `enqueue` answers for one task, discriminated by `state`: a task written (`ready`: due
 * now, in its lane; `scheduled`: due later; `held`: due, waiting for its concurrency key) has
 * its new id; one suppressed by its `dedupeKey` has none, and names the live task that holds
 * the key.
 */
export type EnqueueResult = EnqueuedResult | DuplicateResult;

/** A task written: its id. */
export interface EnqueuedResult {
  /** The new task's id. */
  id: string;
  /** `waiting`: it depends on tasks that have not completed yet (`dependsOn`). */
  state: 'ready' | 'scheduled' | 'held' | 'waiting';
  duplicateOf?: undefined;
}

/** A task not written: a live task already holds its `dedupeKey`. */
export interface DuplicateResult {
  id: null;
  state: 'duplicate';
  /**
   * The id of the live task that holds the dedupe key; undefined when that task finished between
   * the refused insert and the lookup (the key is then free again).
   */
  duplicateOf?: string;
}

/**
 * A task type by name (typed by the TaskRegistry once it has entries), or its definition: a
 * TaskType or a TaskDefinition, whose schema then validates the payload.
 */
export type TaskTypeRef<P = unknown> = TaskTypeName | TaskTypeLike<P>;

export interface TaskSpec<P = unknown> extends Omit<EnqueueOptions, 'schema' | 'preparedStatements'> {
  type: TaskTypeRef<P>;
  payload: P;
  /** A name for this entry, unique in the call, that other entries' `dependsOn` can use: `{ ref }`. */
  ref?: string;
}

/**
 * One entry of an `enqueueMany` batch whose task type is T, as the compiler checks it: its
 * payload is T's (PayloadOf: a definition's payload type, or a registered name's), its options
 * those of `enqueue` but `schema`.
 */
export type CheckedTaskSpec<T> = Omit<EnqueueOptions, 'schema' | 'preparedStatements'> & {
  type: T;
  payload: NoInfer<PayloadOf<T>>;
  /** A name for this entry, unique in the call, that other entries' `dependsOn` can use: `{ ref }`. */
  ref?: string;
};

/**
 * A batch checked entry by entry: T is the tuple of the entries' task types, inferred from their
 * `type` fields, so each entry is checked against its own type (and an error points into it).
 */
export type CheckedTaskSpecs<T extends readonly unknown[]> = { readonly [K in keyof T]: CheckedTaskSpec<T[K]> };

/** Every enqueue default in one place (docs/configuration.md); `maxAttempts` is resolved at claim. */
export const ENQUEUE_DEFAULTS = Object.freeze({
  queue: 'default',
  priority: 0,
  shards: 16,
  schema: DEFAULT_SCHEMA,
});
export const DEFAULT_QUEUE = ENQUEUE_DEFAULTS.queue;
export const DEFAULT_SHARDS = ENQUEUE_DEFAULTS.shards;
/** Rows per enqueue call; bigger batches are split (each piece still one statement). */
const CHUNK = 5_000;
/** Payload JSON per enqueue call, in UTF-16 units (see `chunks`). */
export const CHUNK_JSON_CHARS = 16 * 1024 * 1024;

/**
 * Enqueue one task with the caller's executor. Pass a client inside your transaction and the
 * task commits or rolls back with your business write; the wake NOTIFY fires only on commit.
 *
 * One signature, not an overload per kind of `type` (docs/architecture.md, "Typed enqueue"):
 * the payload's type is computed from the first argument, so a wrong payload field or a
 * misspelt option is reported at that field by TypeScript 7 as by 5.x.
 */
export function enqueue<T extends TaskTypeName | TaskTypeLike<unknown>>(
  executor: Queryable,
  type: T,
  payload: NoInfer<PayloadOf<T>>,
  options?: EnqueueOptions,
): Promise<EnqueueResult> {
  return enqueueUnchecked(executor, type, payload, options);
}

/**
 * `enqueue` without the compile-time check of the name and payload (the CLI's: a name typed by
 * an operator, which no application's TaskRegistry covers). Checked at run time the same way.
 */
export async function enqueueUnchecked(
  executor: Queryable,
  type: string | TaskTypeLike<unknown>,
  payload: unknown,
  options: EnqueueOptions = {},
): Promise<EnqueueResult> {
  checkKeys(options, OPTION_KEYS, 'enqueue options');
  const { schema, preparedStatements, ...rest } = options;
  const [result] = await enqueueTasks(
    executor,
    [{ ...rest, type, payload }],
    preparedStatements === undefined ? { schema } : { schema, preparedStatements },
  );
  return result!;
}

/**
 * One task checked and resolved as `enqueue` checks it (its options, its payload against the
 * definition's schema, every limit), without a database: `enqueueSql` binds what this returns.
 * `what` names the caller in an unknown-option error.
 */
export async function resolveEnqueue(
  type: string | TaskTypeLike<unknown>,
  payload: unknown,
  options: Omit<EnqueueOptions, 'preparedStatements'>,
  what: string,
): Promise<{ spec: ResolvedTaskSpec; schema: string }> {
  // The SQL door sends nothing itself: a statement name would mean nothing there.
  checkKeys(options, SQL_OPTION_KEYS, what);
  const { schema, ...rest } = options;
  const [spec] = await resolveTaskSpecs([{ ...rest, type, payload }]);
  return { spec: spec!, schema: schema ?? ENQUEUE_DEFAULTS.schema };
}

/**
 * Enqueue a batch: one statement per lane (and per 5 000 rows or 16 M characters of payload
 * JSON), results in input order.
 */
export function enqueueMany<T extends readonly (TaskTypeName | TaskTypeLike<unknown>)[] | []>(
  executor: Queryable,
  tasks: CheckedTaskSpecs<T>,
  options: EnqueueManyOptions = {},
): Promise<EnqueueResult[]> {
  return enqueueTasks(executor, tasks, options);
}

/** `enqueueMany`'s options (each task's own are in its entry). */
export interface EnqueueManyOptions {
  /** Installation schema (default `berth`). */
  schema?: string;
  /** false: statements sent unnamed, for a transaction-mode pooler (see EnqueueOptions). */
  preparedStatements?: boolean;
}

/** A task spec as the run-time checks take it: a name is any string here. */
type AnyTaskSpec = Omit<TaskSpec, 'type'> & { type: string | TaskTypeLike<unknown> };

// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const enqueueTasks = (async function (
  executor: Queryable,
  tasks: readonly AnyTaskSpec[],
  options: EnqueueManyOptions,
): Promise<EnqueueResult[]> {
  checkKeys(options, BATCH_OPTION_KEYS, 'enqueueMany options');
  const schema = options.schema ?? ENQUEUE_DEFAULTS.schema;
  if (!isPreparedStatementsOption(options.preparedStatements))
    throw new BerthInputError(
      `preparedStatements must be true or false, got ${JSON.stringify(options.preparedStatements)}`,
    );
  try {
    return await enqueueInSchema(executorFor(executor, options.preparedStatements), tasks, schema);
  } catch (err) {
    throw explainPreparedStatementError(notMigrated(err, schema));
  }
});

// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const enqueueInSchema = (async function (
  executor: Queryable,
  tasks: readonly AnyTaskSpec[],
  schema: string,
): Promise<EnqueueResult[]> {
  const storage = storageFor(schema);
  // The caller's active trace context, taken now (before any await), once for the whole call:
  // null unless a span is active, so an untraced producer stores nothing (src/tracing.ts).
  const trace = captureTraceContext();
  const prepared = await resolveTaskSpecs(tasks);
  // A call with dependencies is one statement (enqueue-graph.ts); every other call keeps its path.
  if (prepared.some((p) => p.dependsOn !== null)) {
    const answers = await enqueueGraph(executor, storage, prepared, trace);
    return answers.map((a) =>
      a.state === 'duplicate'
        ? { id: null, state: 'duplicate', duplicateOf: a.id ?? undefined }
        : { id: a.id!, state: a.state },
    );
  }
  // One group per lane, visited in one global order (queue, priority, shard) so two
  // transactions never take lane locks in opposite orders. A default shard is chosen from the
  // transaction id; when a batch spans several lanes, resolve it here first (one extra round
  // trip, only then), or the order would depend on each transaction's id and could deadlock.
  // Not `laneKey` (src/lane.ts): before the shard is resolved a group is a lane-to-be (its shard
  // count stands in for the shard), and the sorted keys are the lock order, which every berth
  // version must share or two producers of different versions could deadlock.
  const groupKey = (p: ResolvedTaskSpec) =>
    JSON.stringify([p.queue, p.priority, p.shard, p.shard === null ? p.shards : 0]);
  const groups = new Map<string, ResolvedTaskSpec[]>();
  const first = prepared[0];
  if (first && prepared.every((p) => sameLane(p, first))) {
    // A batch on one lane (the usual bulk call) is one group: no key per task.
    groups.set(groupKey(first), prepared);
  } else {
    if (prepared.some((p) => p.shard === null) && new Set(prepared.map(groupKey)).size > 1) {
      const x = BigInt((await executor.query<{ x: string }>('SELECT txid_current()::text AS x')).rows[0]!.x);
      for (const p of prepared) if (p.shard === null) p.shard = Number(x % BigInt(p.shards));
    }
    for (const p of prepared) {
      const key = groupKey(p);
      let g = groups.get(key);
      if (!g) {
        g = [];
        groups.set(key, g);
      }
      g.push(p);
    }
  }
  const results: EnqueueResult[] = new Array(tasks.length);
  for (const key of [...groups.keys()].sort()) {
    for (const chunk of chunks(groups.get(key)!)) await enqueueChunk(executor, storage, chunk, trace, results);
  }
  return results;
});

/**
 * A lane's tasks in statements of at most CHUNK tasks and CHUNK_JSON_CHARS of payload JSON (a
 * task larger than that goes alone). The payloads of a statement travel as one jsonb array,
 * and PostgreSQL refuses a jsonb value over 256 MB; its binary form can be several times the
 * JSON text (a small number takes 2 characters and about 14 bytes), so the text is capped far
 * below that.
 */
function* chunks(group: ResolvedTaskSpec[]): Generator<ResolvedTaskSpec[]> {
  let start = 0;
  while (start < group.length) {
    let end = start + 1;
    let chars = group[start]!.json.length;
    while (end < group.length && end - start < CHUNK && chars + group[end]!.json.length <= CHUNK_JSON_CHARS) {
      chars += group[end]!.json.length;
      end++;
    }
    yield start === 0 && end === group.length ? group : group.slice(start, end);
    start = end;
  }
}

/** Same queue, priority, shard (or default shard among as many): one lane, one group. */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const sameLane = (function (a: ResolvedTaskSpec, b: ResolvedTaskSpec): boolean {
  return (
    a.queue === b.queue &&
    a.priority === b.priority &&
    a.shard === b.shard &&
    (a.shard !== null || a.shards === b.shards)
  );
});

/**
 * One lane's chunk: one statement. What it binds and returns is shaped for the bulk path
 * (docs/benchmarks-journal.md, "Bulk enqueue"): types and payloads travel as one JSON array each
 * (`jsonb_array_elements` splits them on the server) instead of PostgreSQL array literals that
 * pg escapes element by element and the server parses element by element; a column with no
 * value in the whole chunk (runAt, delay, maxAttempts, dedupe key: the common case) is sent as
 * NULL, which `enqueue()`'s multi-argument unnest pads like an array of NULLs; and the results
 * come back as one row of arrays instead of a row per task. Measured on 1,000-task calls.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const enqueueChunk = (async function (
  executor: Queryable,
  storage: Storage,
  chunk: readonly ResolvedTaskSpec[],
  trace: string | null,
  results: EnqueueResult[],
  keyed = false,
): Promise<void> {
  // Tasks with a concurrency key go through enqueue_keyed (held in deferred storage until their
  // key admits them); a chunk without one sends the statement it always did.
  if (!keyed && chunk.some((c) => c.concurrencyKey !== null)) {
    const plain = chunk.filter((c) => c.concurrencyKey === null);
    if (plain.length > 0) await enqueueChunk(executor, storage, plain, trace, results);
    const withKeys = chunk.filter((c) => c.concurrencyKey !== null);
    return enqueueChunk(executor, storage, withKeys, trace, results, true);
  }
  const first = chunk[0]!;
  const n = chunk.length;
  if (n === 1 && !keyed && isPlain(first)) {
    // One plain task (the usual single enqueue): enqueue_one() takes it as scalars and returns
    // its id (docs/benchmarks-journal.md, "Issue 35's twelfth round"). It is always accepted
    // and ready: nothing in it can make it a duplicate, scheduled or held.
    const query = storage.statement('enqueue-one', enqueueOneStatement).query({
      queue: first.queue,
      priority: first.priority,
      shard: first.shard,
      shards: first.shards,
      type: first.type,
      payload: first.json,
      trace,
    });
    const res = await executor.query<{ id: string }>(query);
    results[first.index] = { id: res.rows[0]!.id, state: 'ready' };
    return;
  }
  const types = new Array<string>(n);
  const payloads = new Array<string>(n);
  for (let i = 0; i < n; i++) {
    types[i] = chunk[i]!.type;
    payloads[i] = chunk[i]!.json;
  }
  const args = {
    queue: first.queue,
    priority: first.priority,
    shard: first.shard,
    shards: first.shards,
    types: JSON.stringify(types),
    payloads: `[${payloads.join(',')}]`,
    runAt: column(chunk, (c) => c.runAt),
    delayMs: column(chunk, (c) => c.delay),
    maxAttempts: column(chunk, (c) => c.maxAttempts),
    dedupeKeys: column(chunk, (c) => c.dedupeKey),
    trace,
  };
  // The keyed call (enqueue_keyed): the same arguments and answers, and the tasks' keys.
  const query = keyed
    ? storage
        .statement('enqueue-keyed', enqueueKeyedStatement)
        .query({ ...args, keys: chunk.map((c) => c.concurrencyKey!) })
    : storage.statement('enqueue', enqueueStatement).query(args);
  const res = await executor.query<{ ids: string[]; states: string }>(query);
  readResults(chunk, res.rows[0]!, results);
});

/** A chunk's answers (one id and one state letter per task, in order) into `results`. */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const readResults = (function (
  chunk: readonly ResolvedTaskSpec[],
  row: { ids: string[]; states: string },
  results: EnqueueResult[],
): void {
  const { ids, states } = row;
  const n = chunk.length;
  for (let i = 0; i < n; i++) {
    // A written task's id is its own; a duplicate's is the live task's that holds the key
    // (duplicate_of), null when that task finished in between.
    const id = ids[i] ?? null;
    const state = states[i];
    results[chunk[i]!.index] =
      state === 'd'
        ? { id: null, state: 'duplicate', duplicateOf: id ?? undefined }
        : { id: id!, state: state === 'r' ? 'ready' : state === 'h' ? 'held' : 'scheduled' };
  }
});

function enqueueStatement(schema: Schema) {
  return enqueueCall(schema, 'enqueue', '');
}

/** A task with nothing but a type, a payload and its lane: no run time, delay, attempts, dedupe or concurrency key. */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const isPlain = (function (t: ResolvedTaskSpec): boolean {
  return (
    t.runAt === null && t.delay === null && t.maxAttempts === null && t.dedupeKey === null && t.concurrencyKey === null
  );
});

/**
 * `enqueue_one()`: one plain task as scalars, its id as text (text whatever type parser the
 * caller's pg has for bigint). A new session resolves and plans it, and the function's few
 * checks, in less server time than enqueue()'s array form (migration 33's header).
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const enqueueOneStatement = (function ({ name, q: s }: Schema) {
  return positional(
    `SELECT ${s}.enqueue_one($1, $2, $3, $4, $5, $6, $7)::text AS id`,
    ['queue', 'priority', 'shard', 'shards', 'type', 'payload', 'trace'],
    // Named, so each connection parses and plans it once, as the bulk statement.
    `berth-enqueue-one:${name}`,
  );
});

function enqueueKeyedStatement(schema: Schema) {
  return enqueueCall(schema, 'enqueue_keyed', ', $12::text[]');
}

/** The call of `fn` (enqueue, or enqueue_keyed with its keys as a 12th argument), its answers as one row. */
function enqueueCall({ name, q: s }: Schema, fn: 'enqueue' | 'enqueue_keyed', keys: string) {
  return positional(
    `SELECT array_agg(coalesce(e.id, e.duplicate_of)::text ORDER BY e.ord) AS ids,
                  string_agg(left(e.state, 1), '' ORDER BY e.ord) AS states
             FROM ${s}.${fn}($1, $2::smallint, $3::smallint, $4::smallint,
               ARRAY(SELECT t FROM jsonb_array_elements_text($5::jsonb) WITH ORDINALITY AS a(t, o) ORDER BY o),
               ARRAY(SELECT p FROM jsonb_array_elements($6::jsonb) WITH ORDINALITY AS a(p, o) ORDER BY o),
               (SELECT array_agg(CASE WHEN d IS NULL THEN r ELSE now() + make_interval(secs => d / 1000.0) END ORDER BY o)
                  FROM unnest($7::timestamptz[], $8::float8[]) WITH ORDINALITY AS u(r, d, o)),
               $9::integer[], $10::text[], $11::text${keys}) AS e`,
    [
      'queue',
      'priority',
      'shard',
      'shards',
      'types',
      'payloads',
      'runAt',
      'delayMs',
      'maxAttempts',
      'dedupeKeys',
      'trace',
      ...(keys ? ['keys'] : []),
    ],
    // Named, so each connection parses and plans it once (it is the producer's hot path).
    `berth-${fn === 'enqueue' ? 'enqueue' : 'enqueue-keyed'}:${name}`,
  );
}

/** One optional column of a chunk, or null when no task of it has a value (sent as NULL). */
function column<T>(chunk: readonly ResolvedTaskSpec[], pick: (c: ResolvedTaskSpec) => T | null): (T | null)[] | null {
  let values: (T | null)[] | null = null;
  for (let i = 0; i < chunk.length; i++) {
    const v = pick(chunk[i]!);
    if (v === null) continue;
    values ??= new Array<T | null>(chunk.length).fill(null);
    values[i] = v;
  }
  return values;
}

/**
 * A TaskSpec with every default filled in and every value checked: what the statement binds
 * (a call with dependencies binds the same, enqueue-graph.ts's GraphEntry).
 */
export type ResolvedTaskSpec = GraphEntry;

const SPEC_KEYS: ReadonlySet<string> = new Set([
  'type',
  'payload',
  'runAt',
  'delay',
  'priority',
  'queue',
  'dedupeKey',
  'concurrencyKey',
  'maxAttempts',
  'shard',
  'shards',
  'dependsOn',
  'onParentFailure',
  'ref',
]);
const OPTION_KEYS: ReadonlySet<string> = new Set(
  [...SPEC_KEYS, 'schema', 'preparedStatements'].filter((k) => k !== 'type' && k !== 'payload' && k !== 'ref'),
);
const SQL_OPTION_KEYS: ReadonlySet<string> = new Set([...OPTION_KEYS].filter((k) => k !== 'preparedStatements'));
const BATCH_OPTION_KEYS: ReadonlySet<string> = new Set(['schema', 'preparedStatements']);
/** Why delay is bounded: the run time it gives must be a storable runAt. */
const DELAY_WHY = ' (the run time must fall before year 10000)';

/**
 * Every task of a batch checked and resolved, in input order, before the first statement: one
 * bad task writes nothing. A task whose type is a definition with a schema is validated first
 * (asynchronously, all of them at once); every other task is resolved synchronously, so a bulk
 * call of plain tasks makes no promise per task.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const resolveTaskSpecs = (async function (tasks: readonly AnyTaskSpec[]): Promise<ResolvedTaskSpec[]> {
  const n = tasks.length;
  const resolved = new Array<ResolvedTaskSpec>(n);
  const validations: Promise<void>[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const t = tasks[i]!;
      const def = typeof t.type === 'string' ? undefined : t.type;
      if (def?.schema) {
        const where = whereOf(i, n);
        checkKeys(t, SPEC_KEYS, where);
        validations.push(
          validatePayload(def, t.payload).then((v) => {
            if (!v.ok) throw new BerthInputError(`${where}: ${v.message}`);
            resolved[i] = resolveTaskSpec(t, i, n, v.value);
          }),
        );
      } else resolved[i] = resolveTaskSpec(t, i, n, t.payload);
    }
  } catch (err) {
    // The batch is refused on this task; validations still running must not reject unheard.
    for (const v of validations) v.catch(() => {});
    throw err;
  }
  await Promise.all(validations);
  return resolved;
});

/** How errors name a task: "task", or "task #3" in a batch. */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const whereOf = (function (index: number, count: number): string {
  return count === 1 ? 'task' : `task #${index}`;
});

/**
 * One task checked and resolved (its payload already validated against its definition's
 * schema, if any). The checks are what PostgreSQL would otherwise refuse mid-statement
 * (src/limits.ts).
 */
/** What a task enqueued without `dependsOn`, `ref` or `onParentFailure` carries. */
const NO_DEPENDENCIES = { ref: null, dependsOn: null, onParentFailure: null } as const;

// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const resolveTaskSpec = (function (t: AnyTaskSpec, index: number, count: number, payload: unknown): ResolvedTaskSpec {
  const where = whereOf(index, count);
  checkKeys(t, SPEC_KEYS, where);
  const def = typeof t.type === 'string' ? undefined : t.type;
  const type = checkText(def ? def.type : t.type, 'type', where, { maxChars: MAX_TYPE_CHARS, nonEmpty: true });
  let json: string | undefined;
  try {
    json = JSON.stringify(payload === undefined ? null : payload);
  } catch (err) {
    throw new BerthInputError(`${where} (${type}): payload is not JSON-serialisable: ${(err as Error).message}`);
  }
  if (json === undefined) throw new BerthInputError(`${where} (${type}): payload is not JSON-serialisable`);
  checkPayloadJson(json, where, type);
  // Any name is a queue, the empty one included (seed 003: storage rejects only NULL). The
  // option wins over the definition's queue (checked by defineTask), as River's per-insert
  // options win over a job's own (docs/architecture.md, "Routing").
  const named = t.queue === undefined ? def?.queue : t.queue;
  const queue =
    named === undefined ? ENQUEUE_DEFAULTS.queue : checkText(named, 'queue', where, { maxBytes: MAX_QUEUE_BYTES });
  const priority =
    t.priority === undefined ? ENQUEUE_DEFAULTS.priority : checkInteger(t.priority, 'priority', where, -32768, 32767);
  const shards = t.shards === undefined ? ENQUEUE_DEFAULTS.shards : checkInteger(t.shards, 'shards', where, 1, 64);
  const shard = t.shard === undefined ? null : checkInteger(t.shard, 'shard', where, 0, 63);
  if (t.runAt !== undefined) {
    const ms = t.runAt instanceof Date ? t.runAt.getTime() : NaN;
    if (!(ms >= MIN_RUN_AT_MS && ms <= MAX_RUN_AT_MS)) {
      throw new BerthInputError(
        `${where}: runAt must be a valid Date from year 1 to 9999 (got ${t.runAt instanceof Date ? t.runAt.toString() : typeof t.runAt})`,
      );
    }
  }
  // Measured on the database clock; bounded with this one (the bound is millennia away).
  if (t.delay !== undefined) checkMs(t.delay, 'delay', where, 0, MAX_RUN_AT_MS - Date.now(), DELAY_WHY);
  // Unset: resolved at claim from the worker's definition of the type (else 20).
  const maxAttempts = t.maxAttempts ?? def?.maxAttempts ?? null;
  if (maxAttempts !== null) checkInteger(maxAttempts, 'maxAttempts', where, 1, MAX_ATTEMPTS_LIMIT);
  const dedupeKey =
    t.dedupeKey === undefined
      ? null
      : checkText(t.dedupeKey, 'dedupeKey', where, { maxBytes: MAX_DEDUPE_KEY_BYTES, nonEmpty: true });
  const concurrencyKey =
    t.concurrencyKey === undefined
      ? null
      : checkText(t.concurrencyKey, 'concurrencyKey', where, { maxBytes: MAX_DEDUPE_KEY_BYTES, nonEmpty: true });
  if (dedupeKey !== null && isScheduleKey(dedupeKey))
    throw new BerthInputError(
      `${where}: dedupeKey "${dedupeKey.slice(0, 60)}" starts with "berth-schedule", reserved for schedules' fires`,
    );
  // Explicit fields, not a spread: `{ ...deps, index, … }` built each spec through V8's slow
  // path (17 µs a task, bulk enqueue at 0.42× of the build before dependencies, measured with
  // bench/enqueue-bulk.ts), and a plain task skips the dependency check altogether.
  const deps =
    t.dependsOn === undefined && t.ref === undefined && t.onParentFailure === undefined
      ? NO_DEPENDENCIES
      : checkDependencyOptions(t, index, count, false);
  return {
    ref: deps.ref,
    dependsOn: deps.dependsOn,
    onParentFailure: deps.onParentFailure,
    index,
    type,
    json,
    queue,
    priority,
    shard,
    shards,
    runAt: t.runAt ?? null,
    delay: t.runAt === undefined ? (t.delay ?? null) : null,
    maxAttempts,
    dedupeKey,
    concurrencyKey,
  };
});
