/**
 * Shared by the deps-review-*.test.ts repros (a review of task dependencies, migration 31): the
 * production doors (claim, completion, release, the leader's tick) driven by hand on sessions the
 * test holds, so each interleaving is staged statement by statement. No node:test import.
 */
import pg from 'pg';
import { enqueueMany, getTask } from '../src/index.js';
import { claimBatch, type ClaimedTask } from '../src/processor/claim.js';
import type { Queryable } from '../src/sql.js';
import { entryKey } from '../src/storage/attempt.js';
import { completeLeases } from '../src/storage/complete.js';
import { depsTick, releaseCompleted } from '../src/storage/deps.js';
import { storageFor } from '../src/storage/storage.js';
import { claimParams } from './claim-params.js';
import { DATABASE_URL, waitFor } from './helpers.js';
import { bury as buryIn } from './keys-review-support.js';

/** A session of its own (a transaction the test holds open, a role's login). */
export async function session(
  url = DATABASE_URL,
  options = '-c jit=off -c statement_timeout=120000',
): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url, options });
  c.on('error', () => undefined);
  await c.connect();
  return c;
}

/** The pg backend pid of a connected client. */
export function pidOf(c: pg.Client): number {
  return (c as unknown as { processID: number }).processID;
}

/** Wait until backend `pid` waits for a heavyweight lock (a row, a transaction, an advisory lock). */
export async function blockedOnLock(db: pg.Pool, pid: number, what = 'a lock'): Promise<void> {
  await waitFor(
    async () =>
      (await db.query(`SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`, [pid])).rows[0]
        ?.wait_event_type === 'Lock',
    30_000,
    `backend ${pid} waiting on ${what}`,
  );
}

export interface Spec {
  name: string;
  queue?: string;
  ref?: string;
  dependsOn?: (string | { ref: string })[];
  onParentFailure?: 'cancel' | 'wait';
  delay?: number;
  dedupeKey?: string;
  concurrencyKey?: string;
  priority?: number;
  shard?: number;
}

/** enqueueMany of string-typed tasks (type `dr`, payload `{ name }`), answering the ids in order. */
export async function graph(db: Queryable, schema: string, specs: readonly Spec[]): Promise<string[]> {
  const res = await enqueueMany(
    db,
    specs.map((s) => {
      const { name, queue, ...rest } = s;
      return { type: 'dr', payload: { name }, queue: queue ?? 'dq', ...rest };
    }),
    { schema },
  );
  return res.map((r) => (r.id ?? r.duplicateOf)!);
}

/** What a worker of `queue` claims now (up to `limit` tasks). */
export async function claimQueue(
  db: Queryable,
  schema: string,
  queue = 'dq',
  limit = 10,
  ceilingMs = 600_000,
): Promise<ClaimedTask[]> {
  const lanes = (
    await db.query<{ lane_id: number }>(`SELECT lane_id FROM "${schema}".lanes WHERE queue = $1`, [queue])
  ).rows.map((r) => r.lane_id);
  if (lanes.length === 0) return [];
  const { tasks } = await claimBatch(
    db,
    claimParams(schema, lanes, limit, { workerId: 'deps-review', defaultCeilingMs: ceilingMs }),
  );
  return tasks;
}

/** Tasks a claim took beside the ones asked for, kept for the call that asks for them (by schema, id). */
const held = new Map<string, ClaimedTask>();

/**
 * Claim until `ids` are all held (a lane holds one lease at a time: claim more than once). A claim
 * takes whatever is claimable in the queue: the others are kept here for a later call.
 */
export async function claimIds(
  db: Queryable,
  schema: string,
  ids: readonly string[],
  queue = 'dq',
): Promise<ClaimedTask[]> {
  const key = (id: string) => `${schema}:${id}`;
  await waitFor(
    async () => {
      if (ids.every((id) => held.has(key(id)))) return true;
      for (const t of await claimQueue(db, schema, queue, 50)) held.set(key(t.id), t);
      return ids.every((id) => held.has(key(id)));
    },
    30_000,
    `tasks ${ids.join(', ')} claimed`,
  );
  return ids.map((id) => {
    const t = held.get(key(id))!;
    held.delete(key(id));
    return t;
  });
}

/**
 * What the settlement batcher's flush does for a batch holding a task with dependents, without
 * its BEGIN/COMMIT (the caller holds the transaction): the fenced completion, then the release of
 * the marked tasks whose completion won.
 */
export async function completeAndRelease(
  db: Queryable,
  schema: string,
  tasks: readonly ClaimedTask[],
): Promise<{ won: Set<string>; freed: number }> {
  const storage = storageFor(schema);
  const won = await completeLeases(db, storage, tasks);
  const parents = tasks.filter((t) => t.hasDependents === true && won.has(entryKey(t))).map((t) => t.id);
  const freed = await releaseCompleted(db, storage, parents);
  return { won, freed };
}

/** The plain completion (an older worker's: no release), autocommit. */
export async function completePlain(
  db: Queryable,
  schema: string,
  tasks: readonly ClaimedTask[],
): Promise<Set<string>> {
  return completeLeases(db, storageFor(schema), tasks);
}

/** The leader's deps branch, one pass (watched edges; `all`: the sweep). */
export async function tick(db: Queryable, schema: string, all = false) {
  return depsTick(db, storageFor(schema), { all, after: null, limit: 2000 });
}

/** getTask's state, or `gone`. */
export async function stateOf(db: pg.Pool, schema: string, id: string): Promise<string> {
  return (await getTask(db, schema, id))?.state ?? 'gone';
}

/** How many ring entries task `id` has had (each append writes one). */
export async function entries(db: Queryable, schema: string, id: string): Promise<number> {
  return (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".ready WHERE id = $1`, [id]))
    .rows[0]!.n;
}

/** The edges into `child`: parent, satisfied, watched. */
export async function edgesOf(
  db: Queryable,
  schema: string,
  child: string,
): Promise<{ parent: string; satisfied: boolean; watched: boolean }[]> {
  return (
    await db.query<{ parent: string; satisfied: boolean; watched: boolean }>(
      `SELECT parent_id::text AS parent, satisfied_at IS NOT NULL AS satisfied, watched
         FROM "${schema}".task_deps WHERE child_id = $1 ORDER BY parent_id`,
      [child],
    )
  ).rows;
}

/** The waiting counter of `id` (null: no row). */
export async function pendingOf(db: Queryable, schema: string, id: string): Promise<number | null> {
  return (
    (await db.query<{ pending: number }>(`SELECT pending FROM "${schema}".task_waits WHERE id = $1`, [id])).rows[0]
      ?.pending ?? null
  );
}

/** Rows of every table an enqueue writes, summed: unchanged means nothing was written. */
export async function footprint(db: Queryable, schema: string): Promise<number> {
  const s = `"${schema}"`;
  return (
    await db.query<{ n: number }>(
      `SELECT ((SELECT count(*) FROM ${s}.deferred) + (SELECT count(*) FROM ${s}.ready)
             + (SELECT count(*) FROM ${s}.task_deps) + (SELECT count(*) FROM ${s}.task_waits)
             + (SELECT count(*) FROM ${s}.dedupe) + (SELECT count(*) FROM ${s}.task_keys))::int AS n`,
    )
  ).rows[0]!.n;
}

/** Move a deferred task to the dead letters, as a worker's final failure leaves it (keys-review-support's bury). */
export function bury(db: pg.ClientBase | pg.Pool, schema: string, id: string): Promise<void> {
  return buryIn(db, `"${schema}"`, id);
}

/** One task of a hand-built `enqueue_graph` JSON (every field the client sends), `over` replacing any. */
export function graphTask(name: string, queue: string, over: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    name,
    type: 'dr',
    payload: {},
    queue,
    priority: 0,
    shard: 0,
    shards: 16,
    runAt: null,
    delayMs: null,
    maxAttempts: null,
    dedupeKey: null,
    key: null,
    policy: 'cancel',
    ...over,
  };
}

/** `enqueue_graph(jsonb)` called directly with a hand-built graph, as any role allowed to may. */
export function enqueueGraphSql(
  db: Queryable,
  schema: string,
  tasks: readonly Record<string, unknown>[],
  edges: readonly unknown[],
): Promise<unknown> {
  return db.query(`SELECT * FROM "${schema}".enqueue_graph($1::jsonb)`, [JSON.stringify({ tasks, edges })]);
}
