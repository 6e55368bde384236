import { LeaseLostError } from '../errors.js';
import { bindSchema, quoteIdent, type Queryable, type Schema, type SchemaRef } from '../sql.js';
import { leaseKey, type LeaseRef } from './lease.js';
import { removeUnleased } from './remove.js';

/**
 * Completion: the settlement that ends a task. Like every write about a leased task it is
 * fenced on the lease token, and the fence's arbiter is the settlements primary key: the first
 * writer to insert a settlement for a lease (this worker's completion, a failure, a release, a
 * cursor advance, or the rescue of a lapsed lease) wins, and everyone after it matches nothing.
 * Settlements never update or delete a ready entry.
 */

/** A lease to complete; its task's dedupe key (if any) is freed with it. */
export type CompletableRef = LeaseRef & { dedupeKey?: string | null };

/**
 * Dequeue, batched: settle leases as completed. Returns the keys that were settled; a lease not
 * returned was refused (token no longer owns it). Also frees each completed task's dedupe key.
 *
 * One statement per ring slot in the batch (almost always one), naming the slot's partitions
 * directly: measured ~30 % cheaper per row than going through the partitioned parents (no tuple
 * routing, no run-time pruning per probe). The slot comes from the claim, so the partition
 * constraint holds by construction.
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

async function completeInSlot(
  write: Queryable,
  schema: Schema,
  slot: number,
  refs: readonly CompletableRef[],
): Promise<string[]> {
  const s = schema.q;
  const leases = `${s}.${quoteIdent(`leases_${slot}`)}`;
  const settlements = `${s}.${quoteIdent(`settlements_${slot}`)}`;
  const res = await write.query<{ lane_id: number; lane_seq: string }>({
    name: `berth-complete:${schema.name}:${slot}`,
    text: `WITH u AS (
       SELECT * FROM unnest($1::integer[], $2::bigint[], $3::uuid[]) AS u(lane_id, lane_seq, token)
     ), won AS (
       INSERT INTO ${settlements} (slot, lane_id, lane_seq, id, outcome)
       SELECT l.slot, l.lane_id, l.lane_seq, l.id, 'completed'
         FROM u JOIN ${leases} l
           ON l.lane_id = u.lane_id AND l.lane_seq = u.lane_seq AND l.token = u.token
       ON CONFLICT DO NOTHING
       RETURNING lane_id, lane_seq, id
     ), freed AS (
       -- By key, and only for tasks that have one: most batches probe nothing here.
       DELETE FROM ${s}.dedupe d
        WHERE d.dedupe_key = ANY ($4::text[]) AND d.id IN (SELECT won.id FROM won)
     )
     SELECT lane_id, lane_seq::text AS lane_seq FROM won`,
    values: [
      refs.map((r) => r.laneId),
      refs.map((r) => r.laneSeq),
      refs.map((r) => r.token),
      refs.flatMap((r) => (r.dedupeKey ? [r.dedupeKey] : [])),
    ],
  });
  return res.rows.map((r) => leaseKey({ laneId: r.lane_id, laneSeq: r.lane_seq }));
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
         INSERT INTO ${s}.settlements (slot, lane_id, lane_seq, id, outcome)
         SELECT l.slot, l.lane_id, l.lane_seq, l.id, 'completed'
           FROM ${s}.ready r
           JOIN ${s}.leases l ON l.lane_id = r.lane_id AND l.lane_seq = r.lane_seq AND l.slot = r.slot
          WHERE r.id = $1 AND l.token = $2::uuid
         ON CONFLICT DO NOTHING
         RETURNING id
       ), freed AS (DELETE FROM ${s}.dedupe d USING won WHERE d.id = won.id)
       SELECT 1 FROM won`,
      [id, token],
    );
    if (res.rowCount === 0) throw new LeaseLostError(id, 'Dequeue');
    return;
  }
  const outcome = await removeUnleased(executor, bound, id, 'dequeued');
  if (outcome !== 'removed') throw new LeaseLostError(id, `Dequeue with an empty token (task is ${outcome})`);
}
