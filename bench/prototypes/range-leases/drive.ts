/**
 * Drain driver for the range-lease prototype and for the current per-task design, with the same
 * clients: each client loops claim(k) → complete-all (one flush per claim) until every entry is
 * completed. No handlers run: this measures the storage shape, not the worker.
 *
 *   node --import tsx bench/prototypes/range-leases/drive.ts --mode base|lock|gist \
 *     --clients 10 --n 200000 --k 100 --url postgres://postgres@127.0.0.1:55617/bench
 *
 * base: berth's own schema (migrate()) and its own claim() / completeLeases().
 * Prints one JSON line: tasks/s, WAL bytes/task (pg_current_wal_lsn difference around the
 * drain, cluster-wide), load average at start and end.
 */
import { storageFor } from '../../../src/storage/storage.js';
import os from 'node:os';
import pg from 'pg';
import { migrate } from '../../../src/schema/migrate.js';
import { claim, LANE_SHARE } from '../../../src/processor/claim.js';
import { completeLeases } from '../../../src/storage/complete.js';
import { quoteIdent } from '../../../src/sql.js';
import { claimParams } from '../../../test/claim-params.js';
import { claimSql, completeGistSql, loadSql, rangeSchemaSql, type Variant } from './schema.js';

const LANES = 16;

function arg(name: string, def: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : def;
}

export const URL = arg('url', 'postgres://postgres@127.0.0.1:55617/bench');

export async function connect(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: URL });
  c.on('error', () => {});
  await c.connect();
  // As berth's worker sessions (docs/architecture.md, Performance notes).
  await c.query(`SET jit = off; SET plan_cache_mode = force_generic_plan`);
  return c;
}

/** Collapse sorted seqs into a multirange literal: [a, b+1) per run of consecutive numbers. */
export function multirange(seqs: bigint[]): string {
  seqs.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const runs: string[] = [];
  let start = seqs[0]!;
  let prev = start;
  for (const s of seqs.slice(1)) {
    if (s === prev + 1n) {
      prev = s;
      continue;
    }
    runs.push(`[${start},${prev + 1n})`);
    start = prev = s;
  }
  runs.push(`[${start},${prev + 1n})`);
  return `{${runs.join(',')}}`;
}

export async function setupRange(admin: pg.Client, schema: string, variant: Variant, n: number): Promise<void> {
  const s = quoteIdent(schema);
  await admin.query(rangeSchemaSql(schema, variant));
  await admin.query(
    `INSERT INTO ${s}.lanes (lane_id, queue, priority, shard) SELECT l, 'default', 0, l - 1 FROM generate_series(1, ${LANES}) l`,
  );
  await admin.query(loadSql(s, LANES, Math.ceil(n / LANES)));
  await admin.query(`ANALYZE ${s}.ready; ANALYZE ${s}.lanes`);
}

export async function setupBase(admin: pg.Client, schema: string, n: number): Promise<number[]> {
  const s = quoteIdent(schema);
  await admin.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`);
  await migrate({ connectionString: URL, schema });
  const lanes: number[] = [];
  for (let shard = 0; shard < LANES; shard++) {
    const r = await admin.query<{ id: number }>(
      `SELECT ${s}.provision_lane('default', 0::smallint, $1::smallint) AS id`,
      [shard],
    );
    lanes.push(r.rows[0]!.id);
  }
  const per = Math.ceil(n / LANES);
  await admin.query(`INSERT INTO ${s}.ready (slot, lane_id, lane_seq, id, type, payload, queue, priority, shard, attempts,
                                 max_attempts, created_at, run_at)
    SELECT 0, l.lane_id, g, (l.shard) * ${per} + g, 'noop', '{}'::jsonb, 'default', 0, l.shard, 0, NULL, now(), now() - interval '1 s'
      FROM ${s}.lanes l, generate_series(1, ${per}) g`);
  await admin.query(`ANALYZE ${s}.ready; ANALYZE ${s}.lanes`);
  return lanes;
}

interface Row {
  slot: number;
  lane_id: number;
  lane_seq: string;
  lease_from: string;
  token: string;
}

async function main(): Promise<void> {
  const mode = arg('mode', 'lock') as 'base' | Variant;
  const clients = Number(arg('clients', '10'));
  const n = Number(arg('n', '200000'));
  const k = Number(arg('k', '100'));
  const schema = `proto_${mode}`;
  const s = quoteIdent(schema);
  const admin = await connect();
  const total = Math.ceil(n / LANES) * LANES;
  let laneIds = Array.from({ length: LANES }, (_, i) => i + 1);
  if (mode === 'base') laneIds = await setupBase(admin, schema, n);
  else await setupRange(admin, schema, mode, n);
  await admin.query('CHECKPOINT');

  const cs = await Promise.all(Array.from({ length: clients }, () => connect()));
  let done = 0;
  let claims = 0;
  let flushes = 0;
  const load0 = os.loadavg()[0]!;
  const lsn0 = (await admin.query<{ l: string }>('SELECT pg_current_wal_lsn()::text AS l')).rows[0]!.l;
  const t0 = performance.now();
  await Promise.all(
    cs.map(async (c, ci) => {
      // Each client starts its candidate list at a different lane, as discovery's spread would.
      const order = laneIds.map((_, i) => laneIds[(i + ci * 3) % laneIds.length]!);
      let empty = 0;
      while (done < total) {
        if (mode === 'base') {
          const got = await claim(
            c,
            claimParams(schema, order, k, {
              marginMs: 30_000,
              workerId: `w${ci}`,
              wakeChannel: `proto_${ci}`,
              maxLanes: Math.max(1, Math.ceil(k / LANE_SHARE)),
            }),
          );
          claims++;
          if (got.length === 0) {
            if (++empty > 2) await new Promise((r) => setTimeout(r, 1));
            continue;
          }
          empty = 0;
          const settled = await completeLeases(c, storageFor(schema), got);
          flushes++;
          done += settled.size;
        } else {
          const got = await c.query<Row>({
            name: `claim-${mode}`,
            text: claimSql(s),
            values: [order, k, [], [], 60_000, 30_000, `w${ci}`, 20, [], Math.max(1, Math.ceil(k / 16))],
          });
          claims++;
          if (got.rows.length === 0) {
            if (++empty > 2) await new Promise((r) => setTimeout(r, 1));
            continue;
          }
          empty = 0;
          const byLease = new Map<
            string,
            { lane: number; from: string; token: string; seqs: bigint[]; slot: number }
          >();
          for (const r of got.rows) {
            const key = `${r.lane_id}:${r.lease_from}`;
            let g = byLease.get(key);
            if (!g) {
              g = { lane: r.lane_id, from: r.lease_from, token: r.token, seqs: [], slot: r.slot };
              byLease.set(key, g);
            }
            g.seqs.push(BigInt(r.lane_seq));
          }
          const gs = [...byLease.values()];
          const values = [
            gs.map((g) => g.lane),
            gs.map((g) => g.from),
            gs.map((g) => g.token),
            gs.map((g) => multirange(g.seqs)),
          ];
          const slot = gs[0]!.slot; // one slot in this drain (all entries in slot 0)
          const res =
            mode === 'lock'
              ? await c.query<{ seqs: string }>({
                  name: `complete-lock-${slot}`,
                  text: `SELECT seqs::text FROM ${s}.${quoteIdent(`complete_ranges_${slot}`)}($1, $2, $3, $4::int8multirange[])`,
                  values,
                })
              : await c.query<{ seqs: string }>({
                  name: `complete-gist-${slot}`,
                  text: completeGistSql(s, slot),
                  values,
                });
          flushes++;
          if (res.rows.length !== gs.length) throw new Error(`settled ${res.rows.length} of ${gs.length} leases`);
          done += got.rows.length;
        }
      }
    }),
  );
  const secs = (performance.now() - t0) / 1000;
  const wal = (
    await admin.query<{ b: string }>('SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::text AS b', [lsn0])
  ).rows[0]!.b;
  const counts =
    mode === 'base'
      ? await admin.query(
          `SELECT (SELECT count(*) FROM ${s}.leases) AS leases, (SELECT count(*) FROM ${s}.settlements) AS settlements`,
        )
      : await admin.query(`SELECT (SELECT count(*) FROM ${s}.leases) AS leases, (SELECT count(*) FROM ${s}.settlements) AS settlements,
                                (SELECT sum(n) FROM ${s}.settlements) AS settled_entries,
                                -- At most one holder, no gap: every entry under exactly one lease.
                                (SELECT count(*) FROM ${s}.ready r
                                  WHERE (SELECT count(*) FROM ${s}.leases l WHERE l.lane_id = r.lane_id AND l.slot = r.slot
                                            AND r.lane_seq BETWEEN l.from_seq AND l.to_seq) <> 1) AS entries_not_leased_once`);
  console.log(
    JSON.stringify({
      mode,
      clients,
      n: total,
      k,
      secs: +secs.toFixed(2),
      tasksPerSec: Math.round(total / secs),
      walBytesPerTask: Math.round(Number(wal) / total),
      claims,
      flushes,
      ...counts.rows[0],
      load: [+load0.toFixed(2), +os.loadavg()[0]!.toFixed(2)],
    }),
  );
  await Promise.all(cs.map((c) => c.end()));
  await admin.end();
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
