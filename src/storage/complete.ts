import { anchorRow } from '../util/shape-anchor.js';
import { BerthInputError, LeaseLostError, orNotMigrated } from '../errors.js';
import { taskId } from './ids.js';
import { quoteIdent, type Queryable, type Schema } from '../sql.js';
import { compile, p, type Sql, sql } from '../statement.js';
import { completionHistory, perTaskHistory, runMsValue } from './history.js';
import { entryKey, type AttemptRef, seqsToMultirange } from './attempt.js';
import { removeUnleased } from './remove.js';
import { type ResultJson, resultValues, storedResults } from './results.js';
import { storageFor, type Storage } from './storage.js';

/**
 * Completion: the settlement that ends a task. Like every write about a leased task it is
 * fenced on the lease token, and the fence's arbiter is the exclusion constraint on each
 * `range_settlements` partition: the first writer to insert a settlement covering an entry
 * (this worker's completion, a failure, a release, a cursor advance, or the rescue of a lapsed
 * lease) wins, and every later row that overlaps it writes nothing. Settlements never update
 * or delete a ready entry.
 */

/**
 * A lease to complete; its task's dedupe key (if any) is freed with it, and attempt history
 * records it with its handler's run time (the rest of the task is read back from `ready`).
 */
export type CompletableRef = AttemptRef & {
  /** Whether the task has a dedupe key to free (the statement reads the key itself). */
  dedupeKey?: string | null;
  /** The handler's run time, ms; null when not known. */
  runMs?: number | null;
};

/**
 * Completion, batched: settle attempts as completed. Returns the keys that were settled; a lease not
 * returned was refused (token no longer owns it, or another settlement took the entry first).
 * completeBatch's answer as a set of entry keys (`entryKey`), for callers that look leases up by
 * key.
 */
export async function completeLeases(
  write: Queryable,
  storage: Storage,
  refs: readonly CompletableRef[],
  runMs?: readonly (number | null)[],
  results?: readonly (ResultJson | null)[],
): Promise<Set<string>> {
  const won = await completeBatch(write, storage, refs, runMs, results);
  const settled = new Set<string>();
  for (let i = 0; i < refs.length; i++) if (won[i]) settled.add(entryKey(refs[i]!));
  return settled;
}

/**
 * Completion, batched: settle attempts as completed. Answers by position: `won[i]` says whether
 * `refs[i]` was settled; one not settled was refused (token no longer owns it, or another
 * settlement took the entry first). Also frees each completed task's dedupe key. `runMs[i]` is
 * the handler's run time of `refs[i]` for attempt history (a parallel array, so the batcher hands
 * in the refs it holds rather than a copy of each with its time).
 *
 * Answered per lease, by position, not as a set of entry keys: a `laneId:laneSeq` string per
 * task built here, another built by the caller to look it up, and the set's entries were ~0.3 KB
 * of a drain's allocation per task (docs/benchmarks-journal.md, issue 35).
 *
 * One row per range lease in the batch (the batch's entries of that lease as one multirange),
 * in one statement per ring segment (almost always one), naming the segment's partitions
 * directly: measured ~30 % cheaper per row than going through the partitioned parents (no tuple
 * routing, no run-time pruning per probe). A row that overlaps an existing settlement is dropped
 * whole by the constraint; only then does `completeRemainders` run, for those leases alone.
 */
export async function completeBatch(
  write: Queryable,
  storage: Storage,
  refs: readonly CompletableRef[],
  runMs?: readonly (number | null)[],
  results?: readonly (ResultJson | null)[],
): Promise<boolean[]> {
  const bySegment = new Map<number, LeaseGroup[]>();
  for (const g of groupByLease(refs, runMs)) {
    let inSegment = bySegment.get(g.segment);
    if (!inSegment) {
      inSegment = [];
      bySegment.set(g.segment, inSegment);
    }
    inSegment.push(g);
  }
  const withResults = results === undefined ? null : resultsBySegment(refs, results);
  const won = new Array<boolean>(refs.length).fill(false);
  for (const [segment, groups] of bySegment) {
    const kept = withResults?.get(segment) ?? NO_RESULTS;
    await completeInSegment(write, storage, segment, groups, kept, won);
  }
  return won;
}

/** An entry of a completion batch that carries its handler's result. */
interface ResultEntry {
  laneId: number;
  laneSeq: string;
  result: ResultJson;
}

const NO_RESULTS: readonly ResultEntry[] = Object.freeze([]);

/**
 * `results[i]` (the result of `refs[i]`, null: none) by ring segment; segments without one absent.
 * An entry named twice keeps its first result: the completion settles it once, and two rows for
 * one task id would make the result CTE's ON CONFLICT DO UPDATE touch a row twice, which fails
 * the whole statement (21000) and every batch-mate's completion with it.
 */
function resultsBySegment(
  refs: readonly CompletableRef[],
  results: readonly (ResultJson | null)[],
): Map<number, ResultEntry[]> {
  const out = new Map<number, ResultEntry[]>();
  const seen = new Set<string>();
  for (let i = 0; i < refs.length; i++) {
    const result = results[i];
    if (result == null) continue;
    const r = refs[i]!;
    const key = `${r.segment}:${entryKey(r)}`;
    if (seen.has(key)) continue;
    seen.add(key);
    let inSegment = out.get(r.segment);
    if (!inSegment) {
      inSegment = [];
      out.set(r.segment, inSegment);
    }
    inSegment.push({ laneId: r.laneId, laneSeq: r.laneSeq, result });
  }
  return out;
}

/** A batch's entries of one range lease, in lane order, with their run times and places in the batch. */
interface LeaseGroup {
  segment: number;
  laneId: number;
  leaseFrom: string;
  token: string;
  refs: CompletableRef[];
  runMs: (number | null)[];
  /** `at[j]`: the index of `refs[j]` in the batch (the caller's answer is by position). */
  at: number[];
}

/**
 * The batch by lease. Keyed by the token: one lease has one (random) token, and the tasks of a
 * claim share its string, whose hash V8 keeps (a composite key string per task was 4.6 % of a
 * drain's worker CPU). Exported for the shape test (test/shape-anchor.test.ts).
 */
export function groupByLease(
  refs: readonly CompletableRef[],
  runMs: readonly (number | null)[] | undefined,
): LeaseGroup[] {
  const groups = new Map<string, LeaseGroup>();
  for (let i = 0; i < refs.length; i++) {
    const r = refs[i]!;
    let g = groups.get(r.token);
    if (g === undefined || g.laneId !== r.laneId || g.leaseFrom !== r.leaseFrom || g.segment !== r.segment) {
      // A token names one lease; a ref that claims another lease under it (a caller's mistake)
      // gets a group of its own, which the fence refuses.
      const k = g === undefined ? r.token : `${r.token}:${r.segment}:${r.laneId}:${r.leaseFrom}`;
      g = groups.get(k);
      if (g === undefined) {
        g = {
          segment: r.segment,
          laneId: r.laneId,
          leaseFrom: r.leaseFrom,
          token: r.token,
          refs: [],
          runMs: [],
          at: [],
        };
        groups.set(k, g);
      }
    }
    g.refs.push(r);
    g.runMs.push(runMsValue(runMs === undefined ? r.runMs : runMs[i]));
    g.at.push(i);
  }
  // Rows in (lane, lease) order on every writer: two inserters whose rows overlap then meet in
  // the same order, which makes a deadlock between them (40P01, retried) rarer. Each group's
  // entries in lane order, the order the statement numbers them in (their run times).
  const sorted = [...groups.values()].sort((a, b) => a.laneId - b.laneId || compareSeq(a.leaseFrom, b.leaseFrom));
  for (const g of sorted) if (!inSeqOrder(g.refs)) sortBySeq(g);
  return sorted;
}

function inSeqOrder(refs: readonly CompletableRef[]): boolean {
  for (let i = 1; i < refs.length; i++) if (compareSeq(refs[i - 1]!.laneSeq, refs[i]!.laneSeq) > 0) return false;
  return true;
}

function sortBySeq(g: LeaseGroup): void {
  const n = g.refs.length;
  const order = new Array<number>(n);
  for (let i = 0; i < n; i++) order[i] = i;
  order.sort((a, b) => compareSeq(g.refs[a]!.laneSeq, g.refs[b]!.laneSeq));
  // Made here at their length, as groupValues's arrays (which read these), not by map().
  const refs = new Array<CompletableRef>(n);
  const runMs = new Array<number | null>(n);
  const at = new Array<number>(n);
  for (let k = 0; k < n; k++) {
    const i = order[k]!;
    refs[k] = g.refs[i]!;
    runMs[k] = g.runMs[i]!;
    at[k] = g.at[i]!;
  }
  g.refs = refs;
  g.runMs = runMs;
  g.at = at;
}

/**
 * The groups as the completion statements take them: per group its lane, lease, token, entries
 * (a multirange) and where its run times start in the one run-time array; then that array. No
 * count: the statement counts the entries it settles itself. Exported for the shape test.
 */
export function groupValues(groups: readonly LeaseGroup[]): { [K in GroupParams]: unknown } {
  // Every array here is made here, not by map(), and the run times are copied even for one
  // group: then each array that code compiled for these meets comes from one allocation site and
  // has one element kind. An array map() returns has the element kind of the tier that ran it
  // (the builtin's, or the optimized inline copy's), and code compiled for one was thrown away at
  // the other ("wrong map" in `node --trace-deopt`, in a new process's first drain: groupByLease,
  // the batcher's flush, and intArrayLiteral over one group's own array, each compiled again).
  // The per-task arrays are made at their length (pushed, they grew by copies: ~100 B a task).
  let total = 0;
  for (const g of groups) total += g.runMs.length;
  const runFrom: number[] = [];
  const runMs = new Array<number | null>(total);
  let k = 0;
  for (const g of groups) {
    runFrom.push(k + 1);
    for (const ms of g.runMs) runMs[k++] = ms;
  }
  const laneIds: number[] = [];
  const leaseFroms: string[] = [];
  const tokens: string[] = [];
  const seqs: string[] = [];
  for (const g of groups) {
    laneIds.push(g.laneId);
    leaseFroms.push(g.leaseFrom);
    tokens.push(g.token);
    const laneSeqs = new Array<string>(g.refs.length);
    for (let i = 0; i < g.refs.length; i++) laneSeqs[i] = g.refs[i]!.laneSeq;
    seqs.push(seqsToMultirange(laneSeqs, true));
  }
  return { laneIds, leaseFroms, tokens, seqs, runFrom, runMs: intArrayLiteral(runMs) };
}

/**
 * Integers or nulls (runMsValue's) as an `integer[]` literal, written here in one string: pg's own
 * array encoding quotes and escapes each element, a few strings per task of a completion batch
 * (~0.25 KB a task of a drain's allocation, docs/benchmarks-journal.md). Nothing in these values
 * needs quoting; the server reads the same array either way.
 */
function intArrayLiteral(xs: readonly (number | null)[]): string {
  // A loop, not map() and join(): map()'s array of strings and numbers threw the compiled
  // groupValues away once in a new process's first drain (see groupValues).
  let text = '{';
  for (let i = 0; i < xs.length; i++) {
    const x = xs[i];
    text += i === 0 ? '' : ',';
    text += x === null ? 'NULL' : `${x}`;
  }
  return `${text}}`;
}

type GroupParams = 'laneIds' | 'leaseFroms' | 'tokens' | 'seqs' | 'runFrom' | 'runMs';

/** CTE `u`: the batch's groups, numbered `o` in batch order. */
const GROUPS = sql`u AS (
       SELECT * FROM unnest(${p('laneIds')}::integer[], ${p('leaseFroms')}::bigint[], ${p('tokens')}::uuid[],
                            ${p('seqs')}::int8multirange[], ${p('runFrom')}::integer[])
         WITH ORDINALITY AS u(lane_id, lease_from, token, seqs, run_from, o)
     )`;

function compareSeq(a: string, b: string): number {
  return a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);
}

/**
 * One lease looked up by its key, as a LATERAL subquery the planner cannot flatten into a join
 * (the LIMIT keeps it a parameterised index probe per batch row). As a plain join, the plan the
 * session caches (generic, named statement) was made while the segment's partition was nearly empty:
 * a hash join over a seq scan of every lease in the segment, or a merge join reading the primary key
 * from its start, both growing with the segment's leases (1,848 rows read per completion at 50k
 * tasks, 0.4 ms of its 1.2 ms; auto_explain during bench/drain-profile.ts, 2026-12-01).
 */
function leaseProbe(leases: string, laneId: string, from: string, extra = ''): string {
  return `SELECT l.slot, l.lane_id, l.from_seq, l.to_seq, l.token, l.worker, l.claimed_at FROM ${leases} l
           WHERE l.lane_id = ${laneId} AND l.from_seq = ${from} ${extra} LIMIT 1`;
}

/**
 * The checks a completion group must pass besides its token (alias `u`: its entries `seqs`; `l`:
 * its lease): every entry it names lies within the lease's range, and none of them is
 * tombstoned (a range may span a tombstoned entry it never leased). A group that fails is
 * refused whole: only a caller's mistake names such entries, and counted as settled they would
 * make a lease look done while an entry of it is not.
 */
function groupWithinLease(tombstones: string): string {
  return `u.seqs <@ int8multirange(int8range(l.from_seq, l.to_seq, '[]'))
          AND NOT EXISTS (SELECT 1 FROM ${tombstones} t
                           WHERE t.lane_id = l.lane_id AND t.lane_seq >= lower(u.seqs) AND t.lane_seq < upper(u.seqs)
                             AND u.seqs @> t.lane_seq)`;
}

/**
 * CTE `e`: the entries each fenced group (CTE `g`: o, lane_id, from_seq, worker, claimed_at,
 * seqs, run_from) names, read from the segment's `ready` partition, one index range scan per
 * group, with their task fields and run times (`$runMs`, each group's in lane order from its
 * `run_from`). Their count per group is the settlement's `n`: computed here from the entries that
 * exist, never taken from the caller, so a lease's settlements add up to its `n` only when every
 * entry of it is settled (rescue and prune rely on that sum). The same rows feed attempt history
 * and free the dedupe keys, so they are read once.
 *
 * Sending every entry's id, type, attempt and creation time as arrays cost the worker ~3 µs a
 * task to build and send and the server as much to parse (docs/benchmarks-journal.md, "The completion's
 * shape"): the worker sends ranges and run times only.
 */
function groupEntries(ready: string): Sql<'runMs'> {
  return sql`e AS MATERIALIZED (
       SELECT g.o, g.lane_id, g.from_seq, g.worker, g.claimed_at, x.lane_seq, x.id, x.type,
              x.attempts + 1 AS attempt, x.created_at, x.dedupe_key, (${p('runMs')}::integer[])[g.run_from + x.k - 1] AS run_ms
         FROM g CROSS JOIN LATERAL (
           SELECT r.lane_seq, r.id, r.type, r.attempts, r.created_at, r.dedupe_key,
                  row_number() OVER (ORDER BY r.lane_seq ROWS UNBOUNDED PRECEDING) AS k
             FROM ${ready} r
            WHERE r.lane_id = g.lane_id AND r.lane_seq >= lower(g.seqs) AND r.lane_seq < upper(g.seqs)
              AND g.seqs @> r.lane_seq) x
     )`;
}

/**
 * CTEs `done` (the entries of `e` whose settlement row `won`, with `settled` an extra condition
 * on them) and `freed` (their dedupe keys, deleted), for attempt history (completionHistory).
 */
function wonEntries(s: string, settled = 'true'): string {
  return `done AS MATERIALIZED (
       SELECT e.* FROM e JOIN won w ON w.lane_id = e.lane_id AND w.lease_from = e.from_seq WHERE ${settled}
     ), freed AS (
       DELETE FROM ${s}.dedupe d USING done e
        WHERE e.dedupe_key IS NOT NULL AND d.dedupe_key = e.dedupe_key AND d.id = e.id
     )`;
}

/** The partitions of ring segment `segment`, named directly (see completeLeases). */
function segmentTables(s: string, segment: number) {
  const table = (name: string) => `${s}.${quoteIdent(`${name}_${segment}`)}`;
  return {
    leases: table('range_leases'),
    settlements: table('range_settlements'),
    ready: table('ready'),
    tombstones: table('tombstones'),
  };
}

/**
 * The completion of one segment's groups; `extra`: further CTEs after attempt history's (the
 * results', for a batch that carries results). Without them the text is the completion's as it
 * always was: a batch with no result sends the same statement, under the same name and plan.
 */
function completeSql<N extends string>(schema: Schema, segment: number, extra: Sql<N>) {
  const s = schema.q;
  const { leases, settlements, ready, tombstones } = segmentTables(s, segment);
  return sql`WITH ${GROUPS}, g AS MATERIALIZED (
       SELECT u.o, u.seqs, u.run_from, u.token, l.slot, l.lane_id, l.from_seq, l.worker, l.claimed_at
         FROM u CROSS JOIN LATERAL (${leaseProbe(leases, 'u.lane_id', 'u.lease_from', 'AND l.token = u.token')}) l
        WHERE ${groupWithinLease(tombstones)}
     ), ${groupEntries(ready)}, won AS (
       INSERT INTO ${settlements} (slot, lane_id, lease_from, seqs, n, outcome)
       SELECT g.slot, g.lane_id, g.from_seq, g.seqs, c.n, 'completed'
         FROM g JOIN (SELECT e.o, count(*)::integer AS n FROM e GROUP BY e.o) c ON c.o = g.o
        ORDER BY g.o
       ON CONFLICT DO NOTHING
       RETURNING lane_id, lease_from
     ), ${wonEntries(s)}, ${completionHistory(s)}${extra}
     -- The token too: a batch may hold a wrong-token group for the same range as a right one.
     SELECT g.lane_id, g.from_seq::text AS lease_from, g.token::text AS token
       FROM won w JOIN g ON g.lane_id = w.lane_id AND g.from_seq = w.lease_from`;
}

const NO_EXTRA = sql``;

function completeStatement(schema: Schema, segment: number) {
  return compile(completeSql(schema, segment, NO_EXTRA), `berth-complete:${schema.name}:${segment}`);
}

/** The completion that also stores results (results.ts): only a batch carrying one sends it. */
function completeWithResultsStatement(schema: Schema, segment: number) {
  return compile(
    completeSql(schema, segment, sql`, ${storedResults(schema.q)}`),
    `berth-complete-results:${schema.name}:${segment}`,
  );
}

async function completeInSegment(
  write: Queryable,
  storage: Storage,
  segment: number,
  groups: readonly LeaseGroup[],
  results: readonly ResultEntry[],
  /** Set true at the batch index of each entry settled. */
  won: boolean[],
): Promise<void> {
  const query =
    results.length === 0
      ? storage
          .statement(`complete:${segment}`, (schema) => completeStatement(schema, segment))
          .query(groupValues(groups))
      : storage
          .statement(`complete-results:${segment}`, (schema) => completeWithResultsStatement(schema, segment))
          .query({ ...groupValues(groups), ...resultValues(results) });
  const res = await write.query<{ lane_id: number; lease_from: string; token: string }>(query);
  // Keys per lease, not per task (a claim's tasks share one lease).
  const rows = new Set(res.rows.map((r) => `${r.lane_id}:${r.lease_from}:${r.token}`));
  anchorRow('complete', write, res.rows[0]);
  const lost: LeaseGroup[] = [];
  for (const g of groups) {
    if (rows.has(`${g.laneId}:${g.leaseFrom}:${g.token}`)) for (const i of g.at) won[i] = true;
    else lost.push(g);
  }
  if (lost.length > 0) await completeRemainders(write, storage, segment, lost, results, won);
}

/**
 * The rare path: a lease whose completion row was dropped because part of it was settled
 * already (rescue took some entries after the lease lapsed, a handler's own Dequeue settled
 * one, or a retried flush had committed unseen), or whose token is wrong. Insert what is left
 * of each: the requested entries minus every settlement of the lease, still fenced on the token
 * and by the constraint. Loops while a concurrent writer keeps taking entries (each pass settles
 * or excludes at least one entry of every lease it retries, so it ends).
 */
function completeRemaindersSql<N extends string>(schema: Schema, segment: number, extra: Sql<N>) {
  const s = schema.q;
  const { leases, settlements, ready, tombstones } = segmentTables(s, segment);
  return (
    // `g.seqs` is what the group asked for (its entries, numbered for their run times), `g.want`
    // what is left of it once the lease's settlements are taken out; `e.wanted` marks its entries.
    sql`WITH ${GROUPS}, g AS MATERIALIZED (
         SELECT u.o, u.seqs, u.run_from, u.token, l.slot, l.lane_id, l.from_seq, l.worker, l.claimed_at,
                u.seqs - coalesce((SELECT range_agg(x.seqs) FROM ${settlements} x
                                    WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq), '{}') AS want
           FROM u JOIN ${leases} l ON l.lane_id = u.lane_id AND l.from_seq = u.lease_from AND l.token = u.token
          WHERE ${groupWithinLease(tombstones)}
       ), ${groupEntries(ready)}, c AS (
         SELECT e.o, count(*)::integer AS n FROM e JOIN g ON g.o = e.o WHERE g.want @> e.lane_seq GROUP BY e.o
       ), won AS (
         INSERT INTO ${settlements} (slot, lane_id, lease_from, seqs, n, outcome)
         SELECT g.slot, g.lane_id, g.from_seq, g.want, c.n, 'completed'
           FROM g JOIN c ON c.o = g.o
          ORDER BY g.o
         ON CONFLICT DO NOTHING
         RETURNING lane_id, lease_from
       ), ${wonEntries(s, 'EXISTS (SELECT 1 FROM g WHERE g.o = e.o AND g.want @> e.lane_seq)')}, ${completionHistory(s)}${extra}
       SELECT g.lane_id, g.from_seq::text AS lease_from, g.token::text AS token,
              (SELECT array_agg(d.lane_seq::text) FROM done d WHERE d.o = g.o) AS won,
              EXISTS (SELECT 1 FROM c WHERE c.o = g.o)
                AND NOT EXISTS (SELECT 1 FROM won x WHERE x.lane_id = g.lane_id AND x.lease_from = g.from_seq) AS rest
         FROM g`
  );
}

function completeRemaindersStatement(schema: Schema, segment: number) {
  return compile(completeRemaindersSql(schema, segment, NO_EXTRA));
}

function completeRemaindersWithResultsStatement(schema: Schema, segment: number) {
  return compile(completeRemaindersSql(schema, segment, sql`, ${storedResults(schema.q)}`));
}

/**
 * `results`: the segment's entries that carry a result (all of them: the result CTE joins only
 * the entries a pass settles, so an entry of a group not retried here stores nothing twice).
 */
async function completeRemainders(
  write: Queryable,
  storage: Storage,
  segment: number,
  groups: readonly LeaseGroup[],
  results: readonly ResultEntry[],
  won: boolean[],
): Promise<void> {
  const kept = results.length === 0 ? null : resultValues(results);
  const query = (pending: readonly LeaseGroup[]) =>
    kept === null
      ? storage
          .statement(`complete-remainders:${segment}`, (schema) => completeRemaindersStatement(schema, segment))
          .query(groupValues(pending))
      : storage
          .statement(`complete-remainders-results:${segment}`, (schema) =>
            completeRemaindersWithResultsStatement(schema, segment),
          )
          .query({ ...groupValues(pending), ...kept });
  let pending = [...groups];
  for (let pass = 0; pending.length > 0 && pass < 8; pass++) {
    const res = await write.query<{
      lane_id: number;
      lease_from: string;
      token: string;
      won: string[] | null;
      rest: boolean;
    }>(query(pending));
    const retry: LeaseGroup[] = [];
    for (const row of res.rows) {
      const g = pending.find(
        (x) => x.laneId === row.lane_id && x.leaseFrom === row.lease_from && x.token === row.token,
      );
      if (!g) continue;
      const seqs = new Set(row.won ?? []);
      for (let j = 0; j < g.refs.length; j++) if (seqs.has(g.refs[j]!.laneSeq)) won[g.at[j]!] = true;
      // Dropped again by a writer that took part of the remainder meanwhile: go round.
      if (row.rest) retry.push(g);
    }
    pending = retry;
  }
}

/**
 * Complete one task by id (the handler's `ctx.dequeue`, seed 000's Dequeue). With a lease token: complete that lease, raising LeaseLostError when
 * the token no longer owns it (so the caller's transaction rolls back). With an empty token:
 * remove the task only while it is unleased (the inline-cleanup path: a producer that enqueued
 * and then did the work itself). Runs on the caller's executor.
 */
export async function dequeue(executor: Queryable, schema: string, id: string, token: string): Promise<void> {
  taskId(id);
  // A token is a lease's uuid (ctx.dequeue passes its own); anything else could own nothing.
  if (token !== '' && !UUID.test(token))
    throw new BerthInputError("bad lease token: expected a uuid, or '' for an unleased task");
  return orNotMigrated(schema, () => dequeueIn(executor, storageFor(schema), id, token));
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** dequeue on a bound storage (the handler's `ctx.dequeue`). */
export async function dequeueIn(executor: Queryable, storage: Storage, id: string, token: string): Promise<void> {
  if (token !== '') {
    const res = await executor.query(storage.statement('dequeue', dequeueStatement).query({ id, token }));
    if (res.rowCount === 0) throw new LeaseLostError(id, 'Dequeue');
    return;
  }
  const outcome = await removeUnleased(executor, storage, id, 'dequeued');
  if (outcome !== 'removed') throw new LeaseLostError(id, `Dequeue with an empty token (task is ${outcome})`);
}

function dequeueStatement({ q: s }: Schema) {
  const id = p('id');
  return compile(
    sql`WITH won AS (
         INSERT INTO ${s}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
         SELECT le.slot, le.lane_id, le.lease_from, int8multirange(int8range(le.lane_seq, le.lane_seq + 1)), 1,
                'completed'
           FROM ${s}.leased_entries le
          WHERE le.id = ${id} AND le.token = ${p('token')}::uuid AND le.outcome IS NULL
         ON CONFLICT DO NOTHING
         RETURNING slot, lane_id, lease_from, lower(seqs) AS lane_seq
       ), freed AS (DELETE FROM ${s}.dedupe d WHERE d.id = ${id} AND EXISTS (SELECT 1 FROM won))
       , hist AS (${perTaskHistory(
         s,
         sql`SELECT r.id, 'success' AS outcome, r.lane_id, r.type, l.worker, l.claimed_at, r.attempts + 1 AS attempt,
                 r.created_at, NULL::integer AS run_ms, NULL::jsonb AS error, NULL::jsonb AS cursor, false AS dead
            FROM won w
            JOIN ${s}.range_leases l ON l.slot = w.slot AND l.lane_id = w.lane_id AND l.from_seq = w.lease_from
            JOIN ${s}.ready r ON r.slot = w.slot AND r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq`,
       )})
       SELECT 1 FROM won`,
  );
}
