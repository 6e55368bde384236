/**
 * At most one holder when a claim's snapshot is older than a competing range: A claims 3
 * entries of lane 1 in an open transaction; B's claim (5 entries) starts, takes its snapshot and
 * sleeps before locking the lane (a pg_sleep injected into this copy of the claim); A commits
 * during the sleep; B then locks the lane, reads the cursor from its old snapshot (A's lease
 * invisible), picks from the same first entry, and must lease NOTHING (PK conflict on
 * (lane_id, from_seq, slot)) rather than entries 1–5 or 4–5.
 *
 *   node --import tsx bench/prototypes/range-leases/stale-claim.ts
 */
import { connect, setupRange } from './drive.js';
import { claimSql } from './schema.js';

async function main(): Promise<void> {
  const admin = await connect();
  await setupRange(admin, 'stale_claim', 'gist', 16 * 20);
  const s = '"stale_claim"';
  const a = await connect();
  const b = await connect();
  const args = (k: number) => [[1], k, [], [], 60_000, 30_000, 'w', 20, [], 1];
  await a.query('BEGIN');
  const got = await a.query(claimSql(s), args(3));
  const slow = claimSql(s).replace('AND NOT l.paused', 'AND NOT l.paused AND pg_sleep(0.5) IS NOT NULL');
  if (slow === claimSql(s)) throw new Error('sleep not injected');
  const bClaim = b.query<{ lane_seq: string }>(slow, args(5));
  await new Promise((r) => setTimeout(r, 150));
  await a.query('COMMIT');
  const bGot = await bClaim;
  const leases = await admin.query(`SELECT from_seq, to_seq, worker FROM ${s}.leases ORDER BY from_seq`);
  // And B's next claim (fresh snapshot) continues after A's range.
  const next = await b.query<{ lane_seq: string }>(claimSql(s), args(5));
  const result = {
    aLeased: got.rows.map((r) => r.lane_seq),
    bLeasedWithStaleSnapshot: bGot.rows.map((r) => r.lane_seq),
    bNextClaim: next.rows.map((r) => r.lane_seq),
    leases: leases.rows,
  };
  console.log(JSON.stringify(result));
  await Promise.all([a.end(), b.end(), admin.end()]);
  if (bGot.rows.length !== 0 || next.rows[0]?.lane_seq !== '4') process.exit(1);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
