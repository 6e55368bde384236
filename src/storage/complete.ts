import { LeaseLostError } from '../errors.js';
import { bindSchema, quoteIdent, type Queryable, type Schema, type SchemaRef } from '../sql.js';
import { type CompletedEntry, completionHistory, completionHistoryValues, perTaskHistory } from './history.js';
import { leaseKey, type LeaseRef, seqsToMultirange } from './lease.js';
import { removeUnleased } from './remove.js';

/**
 * Completion: the settlement that ends a task. Like every write about a leased task it is
 * fenced on the lease token, and the fence's arbiter is the exclusion constraint on each
 * `range_settlements` partition: the first writer to insert a settlement covering an entry
 * (this worker's completion, a failure, a release, a cursor advance, or the rescue of a lapsed
 * lease) wins, and every later row that overlaps it writes nothing. Settlements never update
 * or delete a ready entry.
 */

/**
 * A lease to complete; its task's dedupe key (if any) is freed with it, and the task's identity
 * (id, type, attempt, created) goes to attempt history with it.
 */
export type CompletableRef = LeaseRef & CompletedEntry & { dedupeKey?: string | null };

/**
 * Dequeue, batched: settle leases as completed. Returns the keys that were settled; a lease not
 * returned was refused (token no longer owns it, or another settlement took the entry first).
 * Also frees each completed task's dedupe key.
 *
 * One row per range lease in the batch (the batch's entries of that lease as one multirange),
 * in one statement per ring segment (almost always one), naming the segment's partitions
 * directly: measured ~30 % cheaper per row than going through the partitioned parents (no tuple
 * routing, no run-time pruning per probe). A row that overlaps an existing settlement is dropped
 * whole by the constraint; only then does `completeRemainders` run, for those leases alone.
 */
export async function completeLeases(
  write: Queryable,
  schema: SchemaRef,
  refs: readonly CompletableRef[],
): Promise<Set<string>> {
  const bound = bindSchema(schema);
  const bySlot = new Map<number, CompletableRef[]>();
  for (const r of refs) {
    let g = bySlot.get(r.slot);
    if (!g) {
      g = [];
      bySlot.set(r.slot, g);
    }
    g.push(r);
  }
  const settled = new Set<string>();
  for (const [slot, group] of bySlot) {
    for (const key of await completeInSlot(write, bound, slot, group)) settled.add(key);
  }
  return settled;
}

/** A batch's entries of one range lease. */
interface LeaseGroup {
  laneId: number;
  leaseFrom: string;
  token: string;
  refs: CompletableRef[];
}

function groupByLease(refs: readonly CompletableRef[]): LeaseGroup[] {
  const groups = new Map<string, LeaseGroup>();
  for (const r of refs) {
    const k = `${r.laneId}:${r.leaseFrom}:${r.token}`;
    let g = groups.get(k);
    if (!g) {
      g = { laneId: r.laneId, leaseFrom: r.leaseFrom, token: r.token, refs: [] };
      groups.set(k, g);
    }
    g.refs.push(r);
  }
  // Rows in (lane, lease) order on every writer: two inserters whose rows overlap then meet in
  // the same order, which makes a deadlock between them (40P01, retried) rarer.
  return [...groups.values()].sort((a, b) => a.laneId - b.laneId || compareSeq(a.leaseFrom, b.leaseFrom));
}

function compareSeq(a: string, b: string): number {
  return a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);
}

/**
 * The batch's dedupe keys, each with its task id and lane, and `at(ref)`: the lease the hot
 * statement needs to have won (`leaseFrom`), or the entry the remainder step checks (`laneSeq`).
 */
function keyedRefs(
  groups: readonly LeaseGroup[],
  at: (r: CompletableRef) => string,
): [string[], string[], number[], string[]] {
  const keyed = groups.flatMap((g) => g.refs.filter((r) => r.dedupeKey));
  return [keyed.map((r) => r.dedupeKey ?? ''), keyed.map((r) => r.id), keyed.map((r) => r.laneId), keyed.map(at)];
}

/**
 * One lease looked up by its key, as a LATERAL subquery the planner cannot flatten into a join
 * (the LIMIT keeps it a parameterised index probe per batch row). As a plain join, the plan the
 * session caches (generic, named statement) was made while the slot's partition was nearly empty:
 * a hash join over a seq scan of every lease in the slot, or a merge join reading the primary key
 * from its start, both growing with the slot's leases (1,848 rows read per completion at 50k
 * tasks, 0.4 ms of its 1.2 ms; auto_explain during bench/drain-profile.ts, 2026-12-01).
 */
function leaseProbe(leases: string, laneId: string, from: string, extra = ''): string {
  return `SELECT l.slot, l.lane_id, l.from_seq, l.token FROM ${leases} l
           WHERE l.lane_id = ${laneId} AND l.from_seq = ${from} ${extra} LIMIT 1`;
}

async function completeInSlot(
  write: Queryable,
  schema: Schema,
  slot: number,
  refs: readonly CompletableRef[],
): Promise<string[]> {
  const s = schema.q;
  const leases = `${s}.${quoteIdent(`range_leases_${slot}`)}`;
  const settlements = `${s}.${quoteIdent(`range_settlements_${slot}`)}`;
  const groups = groupByLease(refs);
  const res = await write.query<{ lane_id: number; lease_from: string; token: string }>({
    name: `berth-complete:${schema.name}:${slot}`,
    text: `WITH u AS (
       SELECT * FROM unnest($1::integer[], $2::bigint[], $3::uuid[], $4::int8multirange[], $5::integer[])
         WITH ORDINALITY AS u(lane_id, lease_from, token, seqs, n, o)
     ), won AS (
       INSERT INTO ${settlements} (slot, lane_id, lease_from, seqs, n, outcome)
       SELECT l.slot, l.lane_id, l.from_seq, u.seqs, u.n, 'completed'
         FROM u CROSS JOIN LATERAL (${leaseProbe(leases, 'u.lane_id', 'u.lease_from', 'AND l.token = u.token')}) l
        ORDER BY u.o
       ON CONFLICT DO NOTHING
       RETURNING lane_id, lease_from
     ), freed AS (
       -- By key, and only for tasks that have one: most batches probe nothing here.
       DELETE FROM ${s}.dedupe d
        USING unnest($6::text[], $7::bigint[], $8::integer[], $9::bigint[]) AS k(key, id, lane_id, lease_from)
        WHERE d.dedupe_key = k.key AND d.id = k.id
          AND EXISTS (SELECT 1 FROM won w WHERE w.lane_id = k.lane_id AND w.lease_from = k.lease_from)
     ), ${completionHistory(s, leases, 10, false)}
     -- The token too: a batch may hold a wrong-token group for the same range as a right one.
     SELECT w.lane_id, w.lease_from::text AS lease_from, l.token::text AS token
       FROM won w CROSS JOIN LATERAL (${leaseProbe(leases, 'w.lane_id', 'w.lease_from')}) l`,
    values: [
      groups.map((g) => g.laneId),
      groups.map((g) => g.leaseFrom),
      groups.map((g) => g.token),
      groups.map((g) => seqsToMultirange(g.refs.map((r) => r.laneSeq))),
      groups.map((g) => g.refs.length),
      ...keyedRefs(groups, (r) => r.leaseFrom),
      ...completionHistoryValues(groups.map((g) => g.refs)),
    ],
  });
  const won = new Set(res.rows.map((r) => `${r.lane_id}:${r.lease_from}:${r.token}`));
  const out: string[] = [];
  const lost: LeaseGroup[] = [];
  for (const g of groups) {
    if (won.has(`${g.laneId}:${g.leaseFrom}:${g.token}`)) for (const r of g.refs) out.push(leaseKey(r));
    else lost.push(g);
  }
  if (lost.length > 0) out.push(...(await completeRemainders(write, schema, slot, lost)));
  return out;
}

/**
 * The rare path: a lease whose completion row was dropped because part of it was settled
 * already (rescue took some entries after the lease lapsed, a handler's own Dequeue settled
 * one, or a retried flush had committed unseen), or whose token is wrong. Insert what is left
 * of each: the requested entries minus every settlement of the lease, still fenced on the token
 * and by the constraint. Loops while a concurrent writer keeps taking entries (each pass settles
 * or excludes at least one entry of every lease it retries, so it ends).
 */
async function completeRemainders(
  write: Queryable,
  schema: Schema,
  slot: number,
  groups: readonly LeaseGroup[],
): Promise<string[]> {
  const s = schema.q;
  const leases = `${s}.${quoteIdent(`range_leases_${slot}`)}`;
  const settlements = `${s}.${quoteIdent(`range_settlements_${slot}`)}`;
  const out: string[] = [];
  let pending = [...groups];
  for (let pass = 0; pending.length > 0 && pass < 8; pass++) {
    const res = await write.query<{
      lane_id: number;
      lease_from: string;
      token: string;
      won: string[] | null;
      rest: boolean;
    }>(
      `WITH u AS (
         SELECT * FROM unnest($1::integer[], $2::bigint[], $3::uuid[], $4::int8multirange[])
           WITH ORDINALITY AS u(lane_id, lease_from, token, seqs, o)
       ), want AS MATERIALIZED (
         SELECT l.slot, l.lane_id, l.from_seq, l.token, u.o,
                u.seqs - coalesce((SELECT range_agg(x.seqs) FROM ${settlements} x
                                    WHERE x.lane_id = l.lane_id AND x.lease_from = l.from_seq), '{}') AS seqs
           FROM u JOIN ${leases} l ON l.lane_id = u.lane_id AND l.from_seq = u.lease_from AND l.token = u.token
       ), won AS (
         INSERT INTO ${settlements} (slot, lane_id, lease_from, seqs, n, outcome)
         SELECT w.slot, w.lane_id, w.from_seq, w.seqs,
                (SELECT sum(upper(x) - lower(x))::integer FROM unnest(w.seqs) x), 'completed'
           FROM want w WHERE NOT isempty(w.seqs)
          ORDER BY w.o
         ON CONFLICT DO NOTHING
         RETURNING lane_id, lease_from, seqs
       ), freed AS (
         DELETE FROM ${s}.dedupe d
          USING unnest($5::text[], $6::bigint[], $7::integer[], $8::bigint[]) AS k(key, id, lane_id, lane_seq)
          WHERE d.dedupe_key = k.key AND d.id = k.id
            AND EXISTS (SELECT 1 FROM won w WHERE w.lane_id = k.lane_id AND w.seqs @> k.lane_seq)
       ), ${completionHistory(s, leases, 9, true)}
       SELECT w.lane_id, w.from_seq::text AS lease_from, w.token::text AS token,
              (SELECT array_agg(g::text) FROM won x, unnest(x.seqs) m, generate_series(lower(m), upper(m) - 1) g
                WHERE x.lane_id = w.lane_id AND x.lease_from = w.from_seq) AS won,
              NOT isempty(w.seqs) AND NOT EXISTS (SELECT 1 FROM won x
                                                   WHERE x.lane_id = w.lane_id AND x.lease_from = w.from_seq) AS rest
         FROM want w`,
      [
        pending.map((g) => g.laneId),
        pending.map((g) => g.leaseFrom),
        pending.map((g) => g.token),
        pending.map((g) => seqsToMultirange(g.refs.map((r) => r.laneSeq))),
        ...keyedRefs(pending, (r) => r.laneSeq),
        ...completionHistoryValues(pending.map((g) => g.refs)),
      ],
    );
    const retry: LeaseGroup[] = [];
    for (const row of res.rows) {
      const g = pending.find(
        (x) => x.laneId === row.lane_id && x.leaseFrom === row.lease_from && x.token === row.token,
      );
      if (!g) continue;
      const won = new Set(row.won ?? []);
      for (const r of g.refs) if (won.has(r.laneSeq)) out.push(leaseKey(r));
      // Dropped again by a writer that took part of the remainder meanwhile: go round.
      if (row.rest) retry.push(g);
    }
    pending = retry;
  }
  return out;
}

/**
 * Dequeue one task by id. With a lease token: complete that lease, raising LeaseLostError when
 * the token no longer owns it (so the caller's transaction rolls back). With an empty token:
 * remove the task only while it is unleased (the inline-cleanup path: a producer that enqueued
 * and then did the work itself). Runs on the caller's executor.
 */
export async function dequeue(executor: Queryable, schema: SchemaRef, id: string, token: string): Promise<void> {
  const bound = bindSchema(schema);
  const s = bound.q;
  if (token !== '') {
    const res = await executor.query(
      `WITH won AS (
         INSERT INTO ${s}.range_settlements (slot, lane_id, lease_from, seqs, n, outcome)
         SELECT le.slot, le.lane_id, le.lease_from, int8multirange(int8range(le.lane_seq, le.lane_seq + 1)), 1,
                'completed'
           FROM ${s}.leased_entries le
          WHERE le.id = $1 AND le.token = $2::uuid AND le.outcome IS NULL
         ON CONFLICT DO NOTHING
         RETURNING slot, lane_id, lease_from, lower(seqs) AS lane_seq
       ), freed AS (DELETE FROM ${s}.dedupe d WHERE d.id = $1 AND EXISTS (SELECT 1 FROM won))
       , hist AS (${perTaskHistory(
         s,
         `SELECT r.id, 'success' AS outcome, r.lane_id, r.type, l.worker, l.claimed_at, r.attempts + 1 AS attempt,
                 r.created_at, NULL::integer AS run_ms, NULL::jsonb AS error, NULL::jsonb AS cursor, false AS dead
            FROM won w
            JOIN ${s}.range_leases l ON l.slot = w.slot AND l.lane_id = w.lane_id AND l.from_seq = w.lease_from
            JOIN ${s}.ready r ON r.slot = w.slot AND r.lane_id = w.lane_id AND r.lane_seq = w.lane_seq`,
       )})
       SELECT 1 FROM won`,
      [id, token],
    );
    if (res.rowCount === 0) throw new LeaseLostError(id, 'Dequeue');
    return;
  }
  const outcome = await removeUnleased(executor, bound, id, 'dequeued');
  if (outcome !== 'removed') throw new LeaseLostError(id, `Dequeue with an empty token (task is ${outcome})`);
}
