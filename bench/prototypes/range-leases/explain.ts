/**
 * EXPLAIN (ANALYZE, BUFFERS) of the hot statements on a large table, per design:
 * 1.2M ready entries in 16 lanes (slot 0), the first 1M of them leased and completed with
 * leases claimed 2 minutes ago (so every history lease has lapsed: rescue's worst case inside
 * one unpruned slot), plus one lapsed, unsettled lease per lane for rescue to find.
 * base: 1M lease rows + 1M settlement rows; range: one lease and one settlement row per 100.
 * Writes the full plans to explain-out.md next to this file and prints a summary line per plan.
 *
 *   node --import tsx bench/prototypes/range-leases/explain.ts [--url URL]
 */
import { storageFor } from '../../../src/storage/storage.js';
import { writeFileSync } from 'node:fs';
import type pg from 'pg';
import { claim, discover } from '../../../src/processor/claim.js';
import { completeLeases } from '../../../src/storage/complete.js';
import { rescueLapsedLeases } from '../../../src/storage/rescue.js';
import type { Queryable } from '../../../src/sql.js';
import { quoteIdent } from '../../../src/sql.js';
import { claimParams } from '../../../test/claim-params.js';
import { connect, multirange, setupBase, setupRange } from './drive.js';
import { claimSql, completeGistSql, discoverSql, rescueGistSql } from './schema.js';

const N = 1_200_000;
const HIST = 62_500; // per lane: 1M in all
const out: string[] = [];
const summary: string[] = [];

/** Captures the statement a berth function would send, instead of running it. */
function capture(): Queryable & { last: { text: string; values: unknown[] } } {
  const q = {
    last: { text: '', values: [] as unknown[] },
    async query(textOrCfg: string | { text: string; values?: unknown[] }, values?: unknown[]) {
      if (typeof textOrCfg === 'string') q.last = { text: textOrCfg, values: values ?? [] };
      else q.last = { text: textOrCfg.text, values: textOrCfg.values ?? [] };
      return { rows: [{ retried: '0', dead: '0', held: '0' }], rowCount: 0 } as unknown as pg.QueryResult;
    },
  };
  return q as unknown as Queryable & { last: { text: string; values: unknown[] } };
}

async function explain(c: pg.Client, label: string, text: string, values: unknown[]): Promise<void> {
  await c.query('BEGIN');
  try {
    const r = await c.query<{ 'QUERY PLAN': string }>(
      `EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING ON) ${text}`,
      values,
    );
    const lines = r.rows.map((x) => x['QUERY PLAN']);
    out.push(`## ${label}\n\n\`\`\`\n${lines.join('\n')}\n\`\`\`\n`);
    const exec = lines.find((l) => l.startsWith('Execution Time'));
    const plan = lines.find((l) => l.startsWith('Planning Time'));
    const buf = lines.find((l) => l.trim().startsWith('Buffers'));
    summary.push(`${label}: ${exec}; ${plan}; top ${buf?.trim()}`);
  } finally {
    await c.query('ROLLBACK');
  }
}

async function main(): Promise<void> {
  const c = await connect();
  // berth today.
  {
    const schema = 'ex_base';
    const s = quoteIdent(schema);
    const lanes = await setupBase(c, schema, N);
    await c.query(`INSERT INTO ${s}.leases (slot, lane_id, lane_seq, id, type, attempt, max_attempts, token, claimed_at, expires_at, worker)
      SELECT 0, r.lane_id, r.lane_seq, r.id, r.type, 1, 20, gen_random_uuid(), now() - interval '2 min', now() - interval '30 s', 'w'
        FROM ${s}.ready r WHERE r.lane_seq <= ${HIST + 1}`);
    await c.query(`INSERT INTO ${s}.settlements (slot, lane_id, lane_seq, id, outcome)
      SELECT slot, lane_id, lane_seq, id, 'completed' FROM ${s}.leases WHERE lane_seq <= ${HIST}`);
    for (const t of ['ready', 'leases', 'settlements']) await c.query(`VACUUM ANALYZE ${s}.${t}`);
    const q = capture();
    await discover(q, storageFor(schema), null, 20, 1);
    await explain(c, 'base: discovery', q.last.text, q.last.values);
    await claim(
      q,
      claimParams(schema, lanes, 100, { marginMs: 30_000, workerId: 'w', wakeChannel: 'ex', maxLanes: 7 }),
    );
    await explain(c, 'base: claim (k=100, 7 lanes)', q.last.text, q.last.values);
    // A completion of 100 real leases (the next 100 entries of lane 1, leased here and kept).
    const got = await claim(
      c,
      claimParams(schema, [lanes[0]!], 100, { marginMs: 30_000, workerId: 'w', wakeChannel: 'ex', maxLanes: 1 }),
    );
    await completeLeases(q, storageFor(schema), got);
    await explain(c, 'base: complete (100 tasks, one flush)', q.last.text, q.last.values);
    await rescueLapsedLeases(q, schema, 1000);
    await explain(c, 'base: rescue (1M lapsed settled leases, 16 unsettled)', q.last.text, q.last.values);
  }
  for (const variant of ['lock', 'gist'] as const) {
    const schema = `ex_${variant}`;
    const s = quoteIdent(schema);
    await setupRange(c, schema, variant, N);
    await c.query(`INSERT INTO ${s}.leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, worker, types, type_expires, type_max_attempts, expires_at)
      SELECT 0, l, i * 100 + 1, i * 100 + 100, 100, gen_random_uuid(), now() - interval '2 min', 'w',
             '{noop}', ARRAY[now() - interval '30 s'], '{20}', now() - interval '30 s'
        FROM generate_series(1, 16) l, generate_series(0, ${HIST / 100 - 1}) i`);
    await c.query(`INSERT INTO ${s}.settlements (slot, lane_id, lease_from, seqs, n, outcome)
      SELECT 0, lane_id, from_seq, int8multirange(int8range(from_seq, to_seq + 1)), 100, 'completed' FROM ${s}.leases`);
    // One lapsed, unsettled lease per lane (one entry) for rescue to find.
    await c.query(`INSERT INTO ${s}.leases (slot, lane_id, from_seq, to_seq, n, token, claimed_at, worker, types, type_expires, type_max_attempts, expires_at)
      SELECT 0, l, ${HIST + 1}, ${HIST + 1}, 1, gen_random_uuid(), now() - interval '2 min', 'w',
             '{noop}', ARRAY[now() - interval '30 s'], '{20}', now() - interval '30 s' FROM generate_series(1, 16) l`);
    for (const t of ['ready', 'leases', 'settlements']) await c.query(`VACUUM ANALYZE ${s}.${t}`);
    await explain(c, `${variant}: discovery`, discoverSql(s), [null, 20, 1]);
    const claimValues = [Array.from({ length: 16 }, (_, i) => i + 1), 100, [], [], 60_000, 30_000, 'w', 20, [], 7];
    await explain(c, `${variant}: claim (k=100, 7 lanes)`, claimSql(s), claimValues);
    const got = await c.query<{ lane_id: number; lane_seq: string; lease_from: string; token: string }>(claimSql(s), [
      [1],
      100,
      [],
      [],
      60_000,
      30_000,
      'w',
      20,
      [],
      1,
    ]);
    const seqs = got.rows.map((r) => BigInt(r.lane_seq));
    const v = [[1], [got.rows[0]!.lease_from], [got.rows[0]!.token], [multirange(seqs)]];
    if (variant === 'lock') {
      await explain(
        c,
        'lock: complete (100 tasks, one flush) — the function call',
        `SELECT * FROM ${s}.complete_ranges_0($1, $2, $3, $4::int8multirange[])`,
        v,
      );
      // The function's second statement, as plpgsql runs it (auto_explain is not loaded here).
      await explain(
        c,
        'lock: complete — its insert statement',
        `WITH u AS (SELECT * FROM unnest($1::integer[], $2::bigint[], $3::uuid[], $4::int8multirange[]) AS u(lane_id, from_seq, token, seqs)),
  todo AS (SELECT l.slot, l.lane_id, l.from_seq, u.seqs - coalesce((SELECT range_agg(st.seqs) FROM ${s}.settlements_0 st
                               WHERE st.lane_id = l.lane_id AND st.lease_from = l.from_seq), '{}'::int8multirange) AS seqs
      FROM u JOIN ${s}.leases_0 l ON l.lane_id = u.lane_id AND l.from_seq = u.from_seq AND l.token = u.token)
  INSERT INTO ${s}.settlements_0 (slot, lane_id, lease_from, seqs, n, outcome)
    SELECT t.slot, t.lane_id, t.from_seq, t.seqs, ${s}.mr_count(t.seqs), 'completed' FROM todo t WHERE NOT isempty(t.seqs)
    RETURNING lane_id, lease_from, seqs`,
        v,
      );
      await explain(
        c,
        'lock: rescue (10k lapsed settled range leases, 16 unsettled)',
        `SELECT * FROM ${s}.rescue(1000)`,
        [],
      );
    } else {
      await explain(c, 'gist: complete (100 tasks, one flush)', completeGistSql(s, 0), v);
      await explain(c, 'gist: rescue (10k lapsed settled range leases, 16 unsettled)', rescueGistSql(s), [1000]);
    }
    const sizes = await c.query(`SELECT relname, pg_size_pretty(pg_total_relation_size(oid)) AS size FROM pg_class
       WHERE relnamespace = '${schema}'::regnamespace AND relname IN ('leases_0', 'settlements_0') ORDER BY 1`);
    summary.push(`${variant}: sizes ${JSON.stringify(sizes.rows)}`);
  }
  const sizes = await c.query(`SELECT relname, pg_size_pretty(pg_total_relation_size(oid)) AS size FROM pg_class
     WHERE relnamespace = 'ex_base'::regnamespace AND relname IN ('leases_0', 'settlements_0') ORDER BY 1`);
  summary.push(`base: sizes ${JSON.stringify(sizes.rows)}`);
  writeFileSync(
    new URL('./explain-out.md', import.meta.url),
    `# EXPLAIN output (generated by explain.ts)\n\n${summary.map((l) => `- ${l}`).join('\n')}\n\n${out.join('\n')}`,
  );
  console.log(summary.join('\n'));
  await c.end();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
