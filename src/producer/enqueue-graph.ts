import { BerthInputError } from '../errors.js';
import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import { isTaskId } from '../storage/ids.js';
import type { Storage } from '../storage/storage.js';

/**
 * An enqueue with dependencies (`dependsOn`): the whole call as one statement,
 * `enqueue_graph(jsonb)`, so nothing of it is written when any part is refused, in autocommit as
 * inside the caller's transaction. A call without dependencies never comes here: it sends the
 * statements it always did. docs/architecture.md, "Task dependencies".
 */

/** A parent: a task id enqueued earlier, or `{ ref }`, another entry of the same enqueueMany call. */
export type DependencyRef = string | { ref: string };

/** What to do with a dependent when a parent dies or is cancelled. */
export type ParentFailurePolicy = 'cancel' | 'wait';

/** One entry of an enqueue call, every default filled in and every value checked (enqueue.ts's ResolvedTaskSpec). */
export interface GraphEntry {
  index: number;
  type: string;
  json: string;
  queue: string;
  priority: number;
  shard: number | null;
  shards: number;
  runAt: Date | null;
  delay: number | null;
  maxAttempts: number | null;
  dedupeKey: string | null;
  concurrencyKey: string | null;
  ref: string | null;
  dependsOn: readonly DependencyRef[] | null;
  onParentFailure: ParentFailurePolicy | null;
}

/** What the statement answers for one entry, in input order. */
export interface GraphAnswer {
  id: string | null;
  state: 'ready' | 'scheduled' | 'held' | 'waiting' | 'duplicate';
}

/** Most tasks of one call with dependencies (the function refuses more too). */
export const MAX_GRAPH_TASKS = 100_000;
/** Most dependencies of one task. */
export const MAX_PARENTS = 10_000;
/**
 * Most payload JSON of one call with dependencies, in UTF-16 units: it is one statement (one
 * jsonb value, which PostgreSQL caps at 256 MB of binary form; see CHUNK_JSON_CHARS in enqueue.ts).
 */
export const MAX_GRAPH_JSON_CHARS = 32 * 1024 * 1024;

/** How errors name an entry: "task", or "task #3" in a batch. */
function nameOf(index: number, count: number): string {
  return count === 1 ? 'task' : `task #${index}`;
}

/**
 * The entries in an order where every parent of the call comes before its children (Kahn's
 * algorithm, ready entries taken in input order, so independent entries keep theirs), with each
 * in-call edge as positions in that order. Throws naming the entries on an unknown or repeated
 * ref, a dependency on itself, or a cycle.
 */
export function orderGraph(entries: readonly GraphEntry[]): {
  order: number[];
  parents: { calls: number[]; ids: string[] }[];
} {
  const n = entries.length;
  const byRef = new Map<string, number>();
  for (const e of entries) {
    if (e.ref === null) continue;
    const seen = byRef.get(e.ref);
    if (seen !== undefined)
      throw new BerthInputError(`${nameOf(e.index, n)}: ref "${e.ref}" is already the ref of task #${seen}`);
    byRef.set(e.ref, e.index);
  }
  const parents: { calls: number[]; ids: string[] }[] = entries.map(() => ({ calls: [], ids: [] }));
  const children: number[][] = entries.map(() => []);
  const indegree = new Array<number>(n).fill(0);
  for (const e of entries) {
    const deps = e.dependsOn ?? [];
    const calls = new Set<number>();
    const ids = new Set<string>();
    for (const d of deps) {
      if (typeof d === 'string') {
        ids.add(d);
        continue;
      }
      const at = byRef.get(d.ref);
      if (at === undefined)
        throw new BerthInputError(
          `${nameOf(e.index, n)}: dependsOn names ref "${d.ref}", which no entry of this call has`,
        );
      if (at === e.index) throw new BerthInputError(`${nameOf(e.index, n)}: a task cannot depend on itself`);
      calls.add(at);
    }
    const p = parents[e.index]!;
    p.calls = [...calls];
    p.ids = [...ids];
    for (const c of calls) {
      children[c]!.push(e.index);
      indegree[e.index]!++;
    }
  }
  const order: number[] = [];
  const queue: number[] = [];
  for (let i = 0; i < n; i++) if (indegree[i] === 0) queue.push(i);
  for (let head = 0; head < queue.length; head++) {
    const i = queue[head]!;
    order.push(i);
    for (const c of children[i]!) if (--indegree[c]! === 0) queue.push(c);
  }
  if (order.length < n) throw new BerthInputError(describeCycle(parents, indegree));
  return { order, parents };
}

/** Name one cycle among the entries left with parents (each has one in the cycle's set). */
function describeCycle(parents: readonly { calls: number[] }[], indegree: readonly number[]): string {
  const start = indegree.findIndex((d) => d > 0);
  const path: number[] = [];
  const at = new Map<number, number>();
  let i = start;
  while (!at.has(i)) {
    at.set(i, path.length);
    path.push(i);
    i = parents[i]!.calls.find((c) => indegree[c]! > 0)!;
  }
  const cycle = path.slice(at.get(i)!);
  cycle.push(i);
  return `tasks ${cycle
    .reverse()
    .map((c) => `#${c}`)
    .join(' → ')} form a cycle of dependencies`;
}

/** Checks of the dependency options themselves, for entry `index` of `count`. */
export function checkDependencyOptions(
  t: { dependsOn?: unknown; ref?: unknown; onParentFailure?: unknown },
  index: number,
  count: number,
  single: boolean,
): { ref: string | null; dependsOn: DependencyRef[] | null; onParentFailure: ParentFailurePolicy | null } {
  const where = nameOf(index, count);
  let ref: string | null = null;
  if (t.ref !== undefined) {
    if (single) throw new BerthInputError(`${where}: ref names an entry of an enqueueMany call; enqueue takes none`);
    if (typeof t.ref !== 'string' || t.ref.length === 0 || t.ref.length > 200)
      throw new BerthInputError(`${where}: ref must be a non-empty string of at most 200 characters`);
    ref = t.ref;
  }
  let dependsOn: DependencyRef[] | null = null;
  if (t.dependsOn !== undefined) {
    if (!Array.isArray(t.dependsOn))
      throw new BerthInputError(`${where}: dependsOn must be an array of task ids and { ref } objects`);
    if (t.dependsOn.length > MAX_PARENTS)
      throw new BerthInputError(`${where}: at most ${MAX_PARENTS} dependencies a task (got ${t.dependsOn.length})`);
    dependsOn = [];
    for (const d of t.dependsOn as unknown[]) {
      if (typeof d === 'string') {
        if (!isTaskId(d))
          throw new BerthInputError(
            `${where}: dependsOn entry "${String(d).slice(0, 40)}" is not a task id (a positive integer, as a string)`,
          );
        dependsOn.push(d);
      } else if (
        typeof d === 'object' &&
        d !== null &&
        Object.keys(d).length === 1 &&
        typeof (d as { ref?: unknown }).ref === 'string'
      ) {
        if (single) throw new BerthInputError(`${where}: a { ref } dependency names an entry of an enqueueMany call`);
        dependsOn.push({ ref: (d as { ref: string }).ref });
      } else {
        throw new BerthInputError(`${where}: each dependsOn entry is a task id (string) or { ref: string }`);
      }
    }
    if (dependsOn.length === 0) dependsOn = null;
  }
  let onParentFailure: ParentFailurePolicy | null = null;
  if (t.onParentFailure !== undefined) {
    if (t.onParentFailure !== 'cancel' && t.onParentFailure !== 'wait')
      throw new BerthInputError(`${where}: onParentFailure must be 'cancel' or 'wait'`);
    onParentFailure = t.onParentFailure;
  }
  return { ref, dependsOn, onParentFailure };
}

/**
 * Enqueue `entries` (a whole call, any of them with dependencies) in one statement. Answers in
 * input order.
 */
export async function enqueueGraph(
  executor: Queryable,
  storage: Storage,
  entries: readonly GraphEntry[],
  trace: string | null,
): Promise<GraphAnswer[]> {
  const n = entries.length;
  if (n > MAX_GRAPH_TASKS)
    throw new BerthInputError(
      `enqueueMany: at most ${MAX_GRAPH_TASKS} tasks a call with dependencies (got ${n}); enqueue a larger graph in several calls, later ones naming earlier ids`,
    );
  const { order, parents } = orderGraph(entries);
  const position = new Array<number>(n);
  for (let k = 0; k < n; k++) position[order[k]!] = k;
  let chars = 0;
  const tasks: string[] = new Array<string>(n);
  const edges: (number | string | null)[][] = [];
  for (let k = 0; k < n; k++) {
    const e = entries[order[k]!]!;
    chars += e.json.length;
    const fields = {
      name: nameOf(e.index, n),
      type: e.type,
      queue: e.queue,
      priority: e.priority,
      shard: e.shard,
      shards: e.shards,
      runAt: e.runAt?.toISOString() ?? null,
      delayMs: e.delay,
      maxAttempts: e.maxAttempts,
      dedupeKey: e.dedupeKey,
      key: e.concurrencyKey,
      policy: e.onParentFailure ?? 'cancel',
    };
    // The payload is already JSON text (checked): spliced in, not parsed and serialised again.
    tasks[k] = `${JSON.stringify(fields).slice(0, -1)},"payload":${e.json}}`;
    const p = parents[e.index]!;
    for (const c of p.calls) edges.push([k, position[c]!, null]);
    for (const id of p.ids) edges.push([k, null, id]);
  }
  if (chars > MAX_GRAPH_JSON_CHARS)
    throw new BerthInputError(
      `enqueueMany: a call with dependencies is one statement and holds at most ${MAX_GRAPH_JSON_CHARS} characters of payload JSON (got ${chars}); enqueue the graph in several calls, later ones naming earlier ids`,
    );
  const graph = `{"tasks":[${tasks.join(',')}],"edges":${JSON.stringify(edges)},"trace":${JSON.stringify(trace)}}`;
  const statement = storage.statement('enqueue-graph', ({ name, q: s }) =>
    positional(
      `SELECT array_agg(coalesce(e.id, e.duplicate_of)::text ORDER BY e.ord) AS ids,
              array_agg(e.state ORDER BY e.ord) AS states
         FROM ${s}.enqueue_graph($1::jsonb) e`,
      ['graph'],
      `berth-enqueue-graph:${name}`,
    ),
  );
  let row: { ids: (string | null)[]; states: GraphAnswer['state'][] };
  try {
    const res = await executor.query<typeof row>(statement.query({ graph }));
    row = res.rows[0]!;
  } catch (err) {
    const e = err as { code?: string; message?: string };
    if (e.code === '22023' && e.message?.startsWith('berth: ')) throw new BerthInputError(e.message.slice(7));
    throw err;
  }
  const out = new Array<GraphAnswer>(n);
  for (let k = 0; k < n; k++) {
    const state = row.states[k]!;
    out[order[k]!] = { id: row.ids[k] ?? null, state };
  }
  return out;
}
