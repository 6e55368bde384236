/**
 * Per-type deadlines and attempt limits inside one range, with nothing but the lease row for
 * rescue to go on: lane 1 alternates types `noop` (ceiling −60 s: lapsed at once; limit 1) and
 * `slow` (ceiling 60 s; limit 5), margin 0. One claim leases 10 entries as one range with two
 * expiries. Rescue (gist variant) must take exactly the 5 `noop` entries, and bury them (attempt
 * 1 of 1) rather than retry them; the holder's completion of all 10 then settles exactly the 5
 * `slow` ones.
 *
 *   node --import tsx bench/prototypes/range-leases/per-type.ts
 */
import { connect, multirange, setupRange } from './drive.js';
import { claimSql, completeGistSql, rescueGistSql } from './schema.js';

async function main(): Promise<void> {
  const c = await connect();
  await setupRange(c, 'per_type', 'gist', 16 * 20);
  const s = '"per_type"';
  await c.query(`UPDATE ${s}.ready SET type = 'slow' WHERE lane_seq % 2 = 0`); // setup only
  const got = await c.query<{
    lane_seq: string;
    type: string;
    lease_from: string;
    token: string;
    expires_ms: number;
    max_attempts: number;
  }>(claimSql(s), [[1], 10, ['noop', 'slow'], [-60_000, 60_000], 1_000, 0, 'w', 20, [1, 5], 1]);
  const lease = await c.query(
    `SELECT from_seq, to_seq, n, types, type_max_attempts, expires_at < now() AS min_lapsed FROM ${s}.leases`,
  );
  const now = Date.now();
  const lapsedByType = Object.fromEntries(
    ['noop', 'slow'].map((t) => [t, got.rows.filter((r) => r.type === t && r.expires_ms < now).length]),
  );
  const limits = Object.fromEntries(got.rows.map((r) => [r.type, r.max_attempts]));
  const rescued = await c.query(rescueGistSql(s), [1000]);
  const { lease_from: from, token } = got.rows[0]!;
  const done = await c.query<{ seqs: string }>(completeGistSql(s, 0), [
    [1],
    [from],
    [token],
    [multirange(got.rows.map((r) => BigInt(r.lane_seq)))],
  ]);
  // The whole-row conflict: the holder's row overlapped rescue's, so it wrote nothing; the
  // remainder step settles the rest.
  let settledByHolder = done.rows.length;
  if (done.rowCount === 0) {
    const rest = await c.query<{ seqs: string }>(
      `SELECT ($1::int8multirange - coalesce(range_agg(seqs), '{}'))::text AS seqs FROM ${s}.settlements WHERE lane_id = 1 AND lease_from = $2`,
      [multirange(got.rows.map((r) => BigInt(r.lane_seq))), from],
    );
    const again = await c.query<{ seqs: string }>(completeGistSql(s, 0), [[1], [from], [token], [rest.rows[0]!.seqs]]);
    settledByHolder = again.rows.length;
    console.log(JSON.stringify({ holderRemainder: again.rows.map((r) => r.seqs) }));
  }
  const st = await c.query(`SELECT outcome, seqs::text, n FROM ${s}.settlements ORDER BY outcome`);
  const moved = await c.query(
    `SELECT (SELECT count(*) FROM ${s}.dead_letters) AS dead, (SELECT count(*) FROM ${s}.deferred) AS deferred`,
  );
  console.log(
    JSON.stringify({
      claimed: got.rowCount,
      lease: lease.rows,
      lapsedByType,
      limits,
      rescue: rescued.rows,
      settledByHolder,
      settlements: st.rows,
      moved: moved.rows[0],
    }),
  );
  await c.end();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
