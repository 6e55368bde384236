/**
 * Exactly one winner per entry-attempt, under a race: a lease of `size` entries is claimed
 * already lapsed; then, at the same moment, its holder completes a random subset of its entries
 * in 1–3 flushes on one connection, while two rescuers (an old and a new leader) run rescue on
 * two others. Afterwards a final rescue sweeps what is left. Checks, every round:
 *   - the settlements of the lease cover every entry exactly once (sum of counts = size and the
 *     union covers all of them): nothing settled twice, nothing lost;
 *   - what the holder was told it settled and what rescue wrote never intersect;
 *   - deferred holds exactly the rescued entries (a losing write moved nothing).
 *
 *   node --import tsx bench/prototypes/range-leases/race.ts --mode lock|gist --rounds 300 --size 64
 */
import type pg from 'pg';
import { quoteIdent } from '../../../src/sql.js';
import { connect, multirange, setupRange } from './drive.js';
import { claimSql, completeGistSql, rescueGistSql, type Variant } from './schema.js';

function arg(name: string, def: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : def;
}

function expand(mr: string): bigint[] {
  const out: bigint[] = [];
  for (const m of mr.matchAll(/\[(\d+),(\d+)\)/g)) for (let x = BigInt(m[1]!); x < BigInt(m[2]!); x++) out.push(x);
  return out;
}

async function countDeferred(c: pg.Client, s: string): Promise<number> {
  return Number((await c.query<{ n: string }>(`SELECT count(*) AS n FROM ${s}.deferred`)).rows[0]!.n);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function complete(
  c: pg.Client,
  s: string,
  mode: Variant,
  lane: number,
  from: string,
  token: string,
  seqs: bigint[],
): Promise<bigint[]> {
  if (seqs.length === 0) return [];
  const values = [[lane], [from], [token], [multirange([...seqs])]];
  if (mode === 'lock') {
    const r = await c.query<{ seqs: string }>(
      `SELECT seqs::text FROM ${s}.complete_ranges_0($1, $2, $3, $4::int8multirange[])`,
      values,
    );
    return r.rows.flatMap((x) => expand(x.seqs));
  }
  // gist: a flush that overlaps a rescue writes nothing; the holder then settles the remainder
  // (what is not yet settled, read fresh) once more, as the batcher's reconcile would.
  for (let attempt = 0; attempt < 3; attempt++) {
    const r = await c.query<{ seqs: string }>(completeGistSql(s, 0), values);
    if (r.rows.length > 0) return r.rows.flatMap((x) => expand(x.seqs));
    const left = await c.query<{ seqs: string | null }>(
      `SELECT ($1::int8multirange - coalesce(range_agg(seqs), '{}'))::text AS seqs FROM ${s}.settlements
        WHERE lane_id = $2 AND lease_from = $3 AND slot = 0`,
      [values[3]![0], lane, from],
    );
    const rest = left.rows[0]!.seqs;
    if (!rest || rest === '{}') return [];
    values[3] = [rest];
  }
  return [];
}

async function rescue(c: pg.Client, s: string, mode: Variant): Promise<void> {
  for (;;) {
    try {
      if (mode === 'lock') await c.query(`SELECT * FROM ${s}.rescue(1000)`);
      else await c.query(rescueGistSql(s), [1000]);
      return;
    } catch (e) {
      // An exclusion wait can deadlock with a settler taking partitions in another order;
      // PostgreSQL aborts one side and rescue simply runs again (as its loop would).
      if ((e as { code?: string }).code === '40P01') continue;
      throw e;
    }
  }
}

async function main(): Promise<void> {
  const mode = arg('mode', 'lock') as Variant;
  const rounds = Number(arg('rounds', '300'));
  const size = Number(arg('size', '64'));
  // Rescue is one slower statement (its write comes last); the holder starts within this many
  // ms, so both orders and overlaps happen.
  const holderDelay = Number(arg('holder-delay-ms', mode === 'gist' ? '60' : '3'));
  // Up to this many ms between the holder's flushes, so a rescue can land between two of them.
  const flushGap = Number(arg('flush-gap-ms', '0'));
  const schema = `race_${mode}`;
  const s = quoteIdent(schema);
  const admin = await connect();
  await setupRange(admin, schema, mode, rounds * size * 16); // 16 lanes; only lane 1 is used
  const [holder, r1, r2] = await Promise.all([connect(), connect(), connect()]);
  let bad = 0;
  let raced = 0;
  let holderWins = 0;
  let rescueWins = 0;
  for (let round = 0; round < rounds; round++) {
    // Ceiling −60 s, margin 0: the lease is lapsed from the start, so rescue may take it at once.
    const got = await holder.query<{ lane_seq: string; lease_from: string; token: string; id: string }>(claimSql(s), [
      [1],
      size,
      [],
      [],
      -60_000,
      0,
      'holder',
      20,
      [],
      1,
    ]);
    if (got.rows.length !== size) throw new Error(`claimed ${got.rows.length}`);
    const { lease_from: from, token } = got.rows[0]!;
    const seqs = got.rows.map((r) => BigInt(r.lane_seq));
    const mine = seqs.filter(() => Math.random() < 0.8);
    const flushes = 1 + Math.floor(Math.random() * 3);
    const parts: bigint[][] = Array.from({ length: flushes }, () => []);
    for (const [i, x] of mine.entries()) parts[i % flushes]!.push(x);
    const deferredBefore = await countDeferred(admin, s);
    const holderGot: bigint[] = [];
    await Promise.all([
      (async () => {
        await sleep(Math.random() * holderDelay);
        for (const [i, p] of parts.entries()) {
          if (i > 0 && flushGap > 0) await sleep(Math.random() * flushGap);
          holderGot.push(...(await complete(holder, s, mode, 1, from, token, p)));
        }
      })(),
      (async () => {
        await sleep(Math.random() * 2);
        await rescue(r1, s, mode);
      })(),
      (async () => {
        await sleep(Math.random() * 2);
        await rescue(r2, s, mode);
      })(),
    ]);
    await rescue(r1, s, mode); // sweep
    const st = await admin.query<{ seqs: string; n: number; outcome: string }>(
      `SELECT seqs::text, n, outcome FROM ${s}.settlements WHERE lane_id = 1 AND lease_from = $1 AND slot = 0`,
      [from],
    );
    const all = st.rows.flatMap((r) => expand(r.seqs));
    const rescued = st.rows.filter((r) => r.outcome === 'rescued').flatMap((r) => expand(r.seqs));
    const union = new Set(all.map(String));
    const sumN = st.rows.reduce((a, r) => a + r.n, 0);
    const overlap = holderGot.filter((x) => rescued.includes(x));
    const deferredAfter = await countDeferred(admin, s);
    const ok =
      all.length === size &&
      union.size === size &&
      sumN === size &&
      overlap.length === 0 &&
      deferredAfter - deferredBefore === rescued.length &&
      seqs.every((x) => union.has(String(x)));
    if (!ok) {
      bad++;
      console.error(
        JSON.stringify({
          round,
          size,
          settledRows: all.length,
          union: union.size,
          sumN,
          overlap: overlap.length,
          deferred: deferredAfter - deferredBefore,
          rescued: rescued.length,
          holderGot: holderGot.length,
        }),
      );
    }
    if (holderGot.length < mine.length && holderGot.length > 0) raced++;
    if (holderGot.length === mine.length) holderWins++;
    if (holderGot.length === 0 && mine.length > 0) rescueWins++;
  }
  console.log(
    JSON.stringify({ mode, rounds, size, bad, holderWonAll: holderWins, rescueWonAll: rescueWins, splitRounds: raced }),
  );
  await Promise.all([holder.end(), r1.end(), r2.end(), admin.end()]);
  if (bad > 0) process.exit(1);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
