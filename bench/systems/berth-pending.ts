import type pg from 'pg';

/**
 * The tasks of `schema` whose completion is not recorded yet: exact for a drain's tasks, and one
 * cheap, prepared read. Every ready entry is pending until a settlement covers it or a tombstone
 * removes it, and a task that is not ready is in deferred. The public count (taskCounts, what
 * `berth stats` shows) is the same number but a ~25 ms statement planned on every call, and the
 * instrument's own latency lands in the measured drain (up to one read late): it made berth's
 * "last start → all recorded" 23 ms where graphile-worker's count(*) made its 3 ms.
 */
export async function berthPending(db: pg.ClientBase, schema: string): Promise<number> {
  const s = `"${schema}"`;
  const r = await db.query<{ n: string }>({
    name: `bench-berth-pending:${schema}`,
    text: `SELECT ((SELECT count(*) FROM ${s}.ready) + (SELECT count(*) FROM ${s}.deferred)
                   - (SELECT coalesce(sum(n), 0) FROM ${s}.range_settlements)
                   - (SELECT count(*) FROM ${s}.tombstones))::text AS n`,
  });
  return Number(r.rows[0]!.n);
}
