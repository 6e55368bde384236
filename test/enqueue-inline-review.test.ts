/**
 * Review of migration 32 (enqueue()'s common path inline) and the one-task client statement.
 * The reference is the body enqueue() had before migration 32 (migration 20's, calling
 * check_queue/check_tasks of 21, provision_lane of 28, append_ready of 18), installed beside the
 * new one as `enqueue_ref` in the same schema, so every comparison runs against the same tables.
 * A test that fails here demonstrates a finding; a test that passes is an attack that held.
 *
 *   node --import tsx --import ./test/placeholder-guard.ts --test test/enqueue-inline-review.test.ts
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { enqueue, enqueueMany, grantRuntimeRole } from '../src/index.js';
import { renderPlaceholders } from '../src/schema/placeholders.js';
import { quoteIdent } from '../src/sql.js';
import { DATABASE_URL, freshSchema, urlAs } from './helpers.js';
import {
  assertLaneLockOrder,
  LANE_ARGUMENT_MUTATIONS,
  mutationSets,
  newLaneRace,
  wakesOf,
  withRotatingInserts,
} from './support/lane-append.js';
import { schemaAtVersion } from './support/legacy-schema.js';

const { schema, pool } = await freshSchema('enqrev');
const S = quoteIdent(schema);

/** Migration 20's enqueue() body, as enqueue_ref(): what every schema before 32 ran. */
function referenceBody(target: string): string {
  const text = readFileSync(new URL('../src/schema/migrations/0020_database_limits.sql', import.meta.url), 'utf8');
  const start = text.indexOf('CREATE OR REPLACE FUNCTION {{schema}}.enqueue(');
  const end = text.indexOf('END $fn$;', start) + 'END $fn$;'.length;
  assert.ok(start > 0 && end > start);
  const fn = text.slice(start, end).replace('{{schema}}.enqueue(', '{{schema}}.enqueue_ref(');
  return renderPlaceholders(fn, target);
}
await pool.query(referenceBody(schema));
// An existing lane, a paused queue, a limited queue, a lane opened before its queue's limit.
await pool.query(`SELECT ${S}.provision_lane('q', 0::smallint, 0::smallint)`);
await pool.query(`INSERT INTO ${S}.queue_pauses (queue, paused_by) VALUES ('pausedq', 'review')`);
await pool.query(`SELECT ${S}.provision_lane('limold', 0::smallint, 0::smallint)`);
await pool.query(`INSERT INTO ${S}.queue_limits (queue, max_running, updated_by) VALUES ('limitedq', 1, 'review')`);
// Through set_queue_limit, as every limit is set: it marks limold's existing lane limited, as
// every lane a limited queue opens later is. (A row written by hand left that lane unmarked, and
// a shard drawn from the transaction id put one of the two compared calls on it, 1 in 64.)
await pool.query(`SELECT ${S}.set_queue_limit('limold', 1, NULL, NULL, 'review', false, false)`);

type Args = {
  queue: string;
  priority: string;
  shard: string;
  shards: string;
  types: string;
  payloads: string;
  runAt: string;
  maxAttempts: string;
  dedupe: string;
  trace: string;
};

function callText(fn: string, a: Args): string {
  return `SELECT * FROM ${S}.${fn}(${a.queue}, ${a.priority}, ${a.shard}, ${a.shards}, ${a.types}, ${a.payloads},
            ${a.runAt}, ${a.maxAttempts}, ${a.dedupe}, ${a.trace}) ORDER BY ord`;
}

/** One element per task: `last` at the last position, `fill` elsewhere. */
function arr(n: number, last: string, fill: string, type: string): string {
  return `ARRAY[${[...Array.from({ length: n - 1 }, () => fill), last].join(', ')}]::${type}[]`;
}

function base(n: number): Args {
  return {
    queue: `'q'`,
    priority: '0::smallint',
    shard: 'NULL::smallint',
    shards: 'NULL::smallint',
    types: n === 0 ? `'{}'::text[]` : arr(n, `'t${n}'`, `'t'`, 'text'),
    payloads: n === 0 ? `'{}'::jsonb[]` : arr(n, `'{"n":${n}}'`, `'{"a":1}'`, 'jsonb'),
    runAt: 'NULL::timestamptz[]',
    maxAttempts: 'NULL::integer[]',
    dedupe: 'NULL::text[]',
    trace: 'NULL::text',
  };
}

type Mutation = readonly [field: keyof Args, expr: string];

/** Every doubt of the brief about malformed (and well-formed) direct calls, for a call of n tasks. */
function mutations(n: number): Mutation[] {
  const m: Mutation[] = [
    ...LANE_ARGUMENT_MUTATIONS,
    ['queue', `'limold'`],
    ['types', 'NULL::text[]'],
    ['types', `'{}'::text[]`],
    ['types', `ARRAY[['t']]::text[]`],
    ['payloads', 'NULL::jsonb[]'],
    ['payloads', `'{}'::jsonb[]`],
    ['payloads', `ARRAY[['{}']]::jsonb[]`],
    ['runAt', `'{}'::timestamptz[]`],
    ['runAt', `ARRAY[[now()]]::timestamptz[]`],
    ['maxAttempts', `'{}'::integer[]`],
    ['maxAttempts', `ARRAY[[1]]::integer[]`],
    ['dedupe', `'{}'::text[]`],
    ['dedupe', `ARRAY[['k']]::text[]`],
  ];
  if (n === 0) return m;
  const ts = (e: string) => arr(n, e, 'NULL', 'timestamptz');
  m.push(
    ['types', arr(n, 'NULL', `'t'`, 'text')],
    ['types', arr(n, `''`, `'t'`, 'text')],
    ['types', arr(n, `repeat('t', 201)`, `'t'`, 'text')],
    ['types', arr(n, `repeat('t', 200)`, `'t'`, 'text')],
    ['types', arr(n + 1, `'t'`, `'t'`, 'text')],
    ['types', `'[0:${n - 1}]={${Array(n).fill('t').join(',')}}'::text[]`],
    [
      'types',
      `'[2:${n + 1}]={${Array(n - 1)
        .fill('t')
        .concat('""')
        .join(',')}}'::text[]`,
    ],
    ['payloads', arr(n, 'NULL', `'{}'`, 'jsonb')],
    ['payloads', arr(n + 1, `'{}'`, `'{}'`, 'jsonb')],
    ['payloads', `'[0:${n - 1}]={${Array(n).fill('"{}"').join(',')}}'::jsonb[]`],
    [
      'payloads',
      `'[0:${n - 1}]={${Array(n - 1)
        .fill('"{}"')
        .concat('NULL')
        .join(',')}}'::jsonb[]`,
    ],
    ['runAt', ts('NULL')],
    ['runAt', ts(`'infinity'`)],
    ['runAt', ts(`'-infinity'`)],
    ['runAt', ts(`'0001-01-01 00:00:00+00'::timestamptz - interval '1 day'`)],
    ['runAt', ts(`'0001-01-01 00:00:00+00'::timestamptz - interval '1 day 1 microsecond'`)],
    ['runAt', ts(`'9999-12-31 23:59:59.999999+00'`)],
    ['runAt', ts(`'10000-01-01 00:00:00+00'`)],
    ['runAt', ts(`now() - interval '1 hour'`)],
    ['runAt', ts(`now() + interval '1 hour'`)],
    ['runAt', ts('now()')],
    ['runAt', arr(n + 1, 'NULL', 'NULL', 'timestamptz')],
    [
      'runAt',
      `'[0:${n - 1}]={${Array(n - 1)
        .fill('NULL')
        .concat('infinity')
        .join(',')}}'::timestamptz[]`,
    ],
    ['maxAttempts', arr(n, 'NULL', 'NULL', 'integer')],
    ['maxAttempts', arr(n, '0', 'NULL', 'integer')],
    ['maxAttempts', arr(n, '-7', 'NULL', 'integer')],
    ['maxAttempts', arr(n, '1', 'NULL', 'integer')],
    ['maxAttempts', arr(n, '1000000', 'NULL', 'integer')],
    ['maxAttempts', arr(n, '1000001', 'NULL', 'integer')],
    ['maxAttempts', arr(n + 1, '1', '1', 'integer')],
    [
      'maxAttempts',
      `'[2:${n + 1}]={${Array(n - 1)
        .fill('NULL')
        .concat('0')
        .join(',')}}'::integer[]`,
    ],
    ['dedupe', arr(n, 'NULL', 'NULL', 'text')],
    ['dedupe', arr(n, `''`, 'NULL', 'text')],
    ['dedupe', arr(n, `repeat('k', 1025)`, 'NULL', 'text')],
    ['dedupe', arr(n, `repeat('é', 513)`, 'NULL', 'text')],
    ['dedupe', arr(n, `repeat('k', 1024)`, 'NULL', 'text')],
    ['dedupe', arr(n, `'k'`, `'k'`, 'text')],
    ['dedupe', arr(n, `'held'`, 'NULL', 'text')],
    ['dedupe', arr(n + 1, `'k'`, 'NULL', 'text')],
    [
      'dedupe',
      `'[0:${n - 1}]={${Array(n - 1)
        .fill('NULL')
        .concat('""')
        .join(',')}}'::text[]`,
    ],
  );
  return m;
}

// A key held by a committed task, so a dedupe mutation can also answer 'duplicate'.
await pool.query(`SELECT * FROM ${S}.enqueue('q', 0::smallint, 0::smallint, NULL, ARRAY['t'], ARRAY['{}'::jsonb],
                  NULL, NULL, ARRAY['held'], NULL)`);

/** What one call did, in a transaction rolled back: its error, or its answers and every row it wrote, without ids. */
async function outcome(c: pg.ClientBase, fn: string, a: Args): Promise<unknown> {
  await c.query('BEGIN');
  try {
    const before = (await c.query<{ v: string }>(`SELECT last_value::text AS v FROM ${S}.task_id_seq`)).rows[0]!.v;
    let rows: { ord: number; id: string | null; state: string; duplicate_of: string | null }[];
    try {
      rows = (await c.query(callText(fn, a))).rows;
    } catch (err) {
      const e = err as { code?: string; message: string; hint?: string; detail?: string };
      return { error: e.code, message: e.message, hint: e.hint, detail: e.detail };
    }
    const ids = rows.map((r) => r.id).filter((x) => x !== null);
    const written = await c.query(
      `SELECT 'ready' AS t, r.id::text, r.type, r.payload, r.queue, r.priority, r.attempts, r.max_attempts, r.dedupe_key,
              r.last_error, r.created_at = now() AS created_now, r.run_at = now() AS run_now, CASE WHEN r.run_at BETWEEN now() - interval '1 day' AND now() + interval '1 day' THEN (r.run_at - now())::text ELSE r.run_at::text END AS run_at,
              r.trace_context, r.has_dependents,
              r.shard = coalesce(${a.shard}, (txid_current() % greatest(coalesce(${a.shards}, 1), 1))::smallint) AS shard_ok,
              r.lane_seq - min(r.lane_seq) OVER () AS seq, r.slot = (SELECT (e.last_value % rs.slot_count)::smallint
                FROM ${S}.ring_epoch e, ${S}.ring_state rs) AS slot_now,
              l.queue = r.queue AND l.priority = r.priority AND l.shard = r.shard AS lane_matches, l.paused, l.limited,
              -- Lanes of the queue, unless the shard came from the transaction id (differs between the two calls).
              CASE WHEN ${a.shard} IS NULL AND coalesce(${a.shards}, 1) > 1 THEN NULL
                   ELSE (SELECT count(*) FROM ${S}.lanes x WHERE x.queue = r.queue) END AS lanes_of_queue
         FROM ${S}.ready r LEFT JOIN ${S}.lanes l ON l.lane_id = r.lane_id WHERE r.id::text = ANY ($1)
       UNION ALL
       SELECT 'deferred', d.id::text, d.type, d.payload, d.queue, d.priority, d.attempts, d.max_attempts, d.dedupe_key,
              d.last_error, d.created_at = now(), d.run_at = now(), CASE WHEN d.run_at BETWEEN now() - interval '1 day' AND now() + interval '1 day' THEN (d.run_at - now())::text ELSE d.run_at::text END, d.trace_context, NULL,
              d.shard = coalesce(${a.shard}, (txid_current() % greatest(coalesce(${a.shards}, 1), 1))::smallint),
              NULL, NULL, NULL, NULL, NULL, NULL
         FROM ${S}.deferred d WHERE d.id::text = ANY ($1)
       ORDER BY 2`,
      [ids],
    );
    const ord = new Map(rows.map((r) => [r.id, r.ord]));
    const dedupe = await c.query(`SELECT dedupe_key, id::text FROM ${S}.dedupe WHERE id > $1::bigint ORDER BY 1`, [
      before,
    ]);
    return {
      answers: rows.map((r) => ({
        ord: r.ord,
        id: r.id === null ? null : 'new',
        state: r.state,
        duplicate_of:
          r.duplicate_of !== null && ord.has(r.duplicate_of) ? `ord ${ord.get(r.duplicate_of)}` : r.duplicate_of,
      })),
      rows: written.rows.map((r) => ({ ...r, id: ord.get(r.id) })),
      dedupe: dedupe.rows.map((r) => ({ key: r.dedupe_key, ord: ord.get(r.id) })),
    };
  } finally {
    await c.query('ROLLBACK');
  }
}

test('every direct call, one or two things wrong at once: same error (SQLSTATE, message) or same answers and rows as before migration 32', async () => {
  const c = await pool.connect();
  let cases = 0;
  let errors = 0;
  let successes = 0;
  const diffs: string[] = [];
  try {
    for (const n of [0, 1, 2, 3]) {
      const ms = mutations(n);
      // Pairs for one and two tasks.
      for (const set of mutationSets(ms, n === 1 || n === 2)) {
        const a = base(n);
        for (const [f, e] of set) a[f] = e;
        const got = await outcome(c, 'enqueue', a);
        const want = await outcome(c, 'enqueue_ref', a);
        cases++;
        if ((got as { error?: string }).error) errors++;
        else successes++;
        try {
          assert.deepEqual(got, want);
        } catch {
          if (diffs.length < 20)
            diffs.push(
              `n=${n} ${JSON.stringify(set)}:\n  new ${JSON.stringify(got).slice(0, 400)}\n  ref ${JSON.stringify(want).slice(0, 400)}`,
            );
          else diffs.push('');
        }
      }
    }
  } finally {
    c.release();
  }
  // A batch of 1,000 (one EXISTS, then check_tasks names the first bad task), fine and with two bad tasks.
  const big = base(0);
  big.types = `array_fill('t'::text, ARRAY[1000])`;
  big.payloads = `array_fill('{}'::jsonb, ARRAY[1000])`;
  const bigCases: Partial<Args>[] = [
    {},
    { trace: `'tc'` },
    {
      types: `(SELECT array_agg(CASE WHEN i = 500 THEN NULL ELSE 't' END ORDER BY i) FROM generate_series(1, 1000) i)`,
    },
    {
      types: `(SELECT array_agg(CASE WHEN i = 700 THEN '' ELSE 't' END ORDER BY i) FROM generate_series(1, 1000) i)`,
      maxAttempts: `(SELECT array_agg(CASE WHEN i = 500 THEN 0 END ORDER BY i) FROM generate_series(1, 1000) i)`,
    },
    {
      runAt: `(SELECT array_agg(CASE WHEN i = 999 THEN 'infinity'::timestamptz END ORDER BY i) FROM generate_series(1, 1000) i)`,
    },
  ];
  for (const extra of bigCases) {
    const a = { ...big, ...extra };
    const got = await (async () => {
      const c2 = await pool.connect();
      try {
        return [await outcome(c2, 'enqueue', a), await outcome(c2, 'enqueue_ref', a)];
      } finally {
        c2.release();
      }
    })();
    cases++;
    const [x, y] = got as [{ error?: string; rows?: unknown[] }, unknown];
    if (x.error) errors++;
    else successes++;
    try {
      assert.deepEqual(x, y);
    } catch {
      diffs.push(
        `n=1000 ${JSON.stringify(extra)}: ${JSON.stringify(x).slice(0, 300)} / ${JSON.stringify(y).slice(0, 300)}`,
      );
    }
  }
  assert.ok(
    cases > 1000 && errors > 300 && successes > 300,
    `${cases} cases, ${errors} refused, ${successes} accepted`,
  );
  assert.deepEqual(diffs.slice(0, 20), [], `${diffs.length} of ${cases} calls differ`);
});

const plainOne = (fn: string, queue: string, shard = 0) =>
  `SELECT id::text, state FROM ${S}.${fn}('${queue}', 0::smallint, ${shard}::smallint, NULL, ARRAY['t'],
     ARRAY['{}'::jsonb], NULL, NULL, NULL, NULL)`;

for (const level of ['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']) {
  for (const [first, second] of [
    ['enqueue', 'enqueue'],
    ['enqueue', 'enqueue_ref'],
    ['enqueue_ref', 'enqueue'],
  ] as const) {
    test(`invariant 1 at ${level}: ${first} holds the lane lock to commit; ${second} on the same lane waits and lands behind it`, async () => {
      const lane = `lock_${level.replace(' ', '_')}_${first}_${second}`.toLowerCase();
      await pool.query(`SELECT ${S}.provision_lane($1, 0::smallint, 0::smallint)`, [lane]);
      await assertLaneLockOrder(pool, schema, level, plainOne(first, lane), plainOne(second, lane));
    });
  }
}

for (const level of ['READ COMMITTED', 'REPEATABLE READ']) {
  test(`a new lane provisioned by two producers at once (${level}): enqueue answers as enqueue_ref did`, async () => {
    const results: Record<string, unknown> = {};
    for (const fn of ['enqueue', 'enqueue_ref']) {
      const lane = `race_${fn}_${level.replace(' ', '_')}`.toLowerCase();
      results[fn] = await newLaneRace(pool, schema, level, lane, plainOne(fn, lane, 5));
    }
    assert.deepEqual(results.enqueue, results.enqueue_ref);
  });
}

test('invariant 2: the ring rotates between the INSERT and the second read: the inline append moves its rows as append_ready does', async () => {
  await withRotatingInserts(pool, schema, async () => {
    const seen: Record<string, unknown> = {};
    for (const fn of ['enqueue', 'enqueue_ref']) {
      for (const n of [1, 3]) {
        const c = await pool.connect();
        try {
          await c.query('BEGIN');
          await c.query(`SELECT set_config('berth_test.rotations', '1', true)`);
          const before = (
            await c.query(`SELECT (e.last_value % rs.slot_count)::int AS s FROM ${S}.ring_epoch e, ${S}.ring_state rs`)
          ).rows[0]!.s as number;
          const ids = (
            await c.query(`SELECT id::text FROM ${S}.${fn}('rot', 0::smallint, 0::smallint, NULL,
                             array_fill('t'::text, ARRAY[${n}]), array_fill('{}'::jsonb, ARRAY[${n}]), NULL, NULL, NULL, 'tc')`)
          ).rows.map((r) => r.id as string);
          const rows = (
            await c.query(
              `SELECT r.slot::int, r.lane_seq::text, r.trace_context FROM ${S}.ready r WHERE r.id::text = ANY ($1) ORDER BY r.id`,
              [ids],
            )
          ).rows;
          const now = (
            await c.query(`SELECT (e.last_value % rs.slot_count)::int AS s FROM ${S}.ring_epoch e, ${S}.ring_state rs`)
          ).rows[0]!.s as number;
          await c.query('COMMIT');
          assert.notEqual(now, before, 'the trigger advanced the epoch');
          assert.equal(rows.length, n);
          assert.ok(
            rows.every((r) => r.slot === now && r.trace_context === 'tc'),
            `${fn}: ${JSON.stringify(rows)} in ${now}`,
          );
          const seqs = rows.map((r) => BigInt(r.lane_seq));
          assert.ok(
            seqs.every((s, i) => i === 0 || s === seqs[i - 1]! + 1n),
            'consecutive positions, in input order',
          );
          seen[`${fn}/${n}`] = rows.length;
        } finally {
          await c.query('ROLLBACK').catch(() => undefined);
          c.release();
        }
      }
    }
    assert.deepEqual(Object.keys(seen).length, 4);
  });
});

test('one wake per lane per transaction: three inline appends and one through append_ready on one lane, one on another', async () => {
  const lanes = (
    await pool.query(
      `SELECT ${S}.provision_lane('wake1', 0::smallint, 0::smallint)::text AS a,
              ${S}.provision_lane('wake2', 0::smallint, 0::smallint)::text AS b`,
    )
  ).rows[0] as { a: string; b: string };
  const got = await wakesOf(pool, schema, async (c) => {
    await c.query('BEGIN');
    for (let i = 0; i < 3; i++) await c.query(plainOne('enqueue', 'wake1'));
    await c.query(`SELECT * FROM ${S}.enqueue('wake1', 0::smallint, 0::smallint, NULL, ARRAY['t'], ARRAY['{}'::jsonb],
                     ARRAY[now() - interval '1 minute'], NULL, NULL, NULL)`);
    await c.query(plainOne('enqueue', 'wake2'));
    await c.query('COMMIT');
  });
  assert.deepEqual(got.sort(), [lanes.a, lanes.b].sort());
});

test('mixed versions: the one-task statement against a schema at migration 31, and the previous bulk statement for one task against 32', async () => {
  const old = `${schema}_m31`;
  const c = await pool.connect();
  try {
    await schemaAtVersion(c, old, 31);
  } finally {
    c.release();
  }
  after(async () => {
    await pool.query(`DROP SCHEMA IF EXISTS ${quoteIdent(old)} CASCADE`).catch(() => undefined);
  });
  // The one-task statement this change brought (the client's until migration 33 gave it enqueue_one()).
  const oneTask = (target: string) =>
    `SELECT ARRAY[e.id::text] AS ids, left(e.state, 1) AS states
       FROM ${quoteIdent(target)}.enqueue($1, $2::smallint, $3::smallint, $4::smallint, ARRAY[$5::text], ARRAY[$6::jsonb],
         NULL, NULL, NULL, $7::text) AS e`;
  for (const target of [old, schema]) {
    const one = (
      await pool.query(oneTask(target), ['mixedq', 0, null, 16, 'mixed', JSON.stringify({ v: target }), null])
    ).rows[0] as { ids: string[]; states: string };
    assert.equal(one.states, 'r');
    const row = (
      await pool.query(
        `SELECT type, payload, queue, attempts, max_attempts, dedupe_key, run_at = created_at AS due, trace_context
           FROM ${quoteIdent(target)}.ready WHERE id = $1`,
        [one.ids[0]],
      )
    ).rows;
    assert.deepEqual(row, [
      {
        type: 'mixed',
        payload: { v: target },
        queue: 'mixedq',
        attempts: 0,
        max_attempts: null,
        dedupe_key: null,
        due: true,
        trace_context: null,
      },
    ]);
  }
  // The statement every client before this change sent for one plain task (enqueueCall, as on main).
  const previous = `SELECT array_agg(coalesce(e.id, e.duplicate_of)::text ORDER BY e.ord) AS ids,
                  string_agg(left(e.state, 1), '' ORDER BY e.ord) AS states
             FROM ${S}.enqueue($1, $2::smallint, $3::smallint, $4::smallint,
               ARRAY(SELECT t FROM jsonb_array_elements_text($5::jsonb) WITH ORDINALITY AS a(t, o) ORDER BY o),
               ARRAY(SELECT p FROM jsonb_array_elements($6::jsonb) WITH ORDINALITY AS a(p, o) ORDER BY o),
               (SELECT array_agg(CASE WHEN d IS NULL THEN r ELSE now() + make_interval(secs => d / 1000.0) END ORDER BY o)
                  FROM unnest($7::timestamptz[], $8::float8[]) WITH ORDINALITY AS u(r, d, o)),
               $9::integer[], $10::text[], $11::text) AS e`;
  const r = await pool.query(previous, ['mixedq', 0, null, 16, '["prev"]', '[{"p":1}]', null, null, null, null, null]);
  assert.equal(r.rows[0].states, 'r');
  const row = await pool.query(`SELECT type, payload FROM ${S}.ready WHERE id = $1`, [r.rows[0].ids[0]]);
  assert.deepEqual(row.rows, [{ type: 'prev', payload: { p: 1 } }]);
});

test('the producer role: the one-task statement on a new and an existing lane; still no direct append, check or provision', async () => {
  const role = `berth_enqrev_p_${process.pid}`;
  await pool.query(`DROP ROLE IF EXISTS ${quoteIdent(role)}`);
  await pool.query(`CREATE ROLE ${quoteIdent(role)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
  await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role, kind: 'producer' });
  const asProducer = new pg.Pool({ connectionString: urlAs(role), max: 2 });
  try {
    for (const queue of ['role_new', 'role_new', 'q']) {
      const r = await enqueue(asProducer, 'byrole', { queue }, { schema, queue });
      assert.equal(r.state, 'ready');
    }
    const many = await enqueueMany(
      asProducer,
      [
        { type: 'byrole', payload: {}, queue: 'role_new', maxAttempts: 3 },
        { type: 'byrole', payload: {}, queue: 'role_new', dedupeKey: 'rk' },
      ],
      { schema },
    );
    assert.deepEqual(
      many.map((m) => m.state),
      ['ready', 'ready'],
    );
    const privileges = await pool.query(
      `SELECT p.proname, has_function_privilege($1, p.oid, 'EXECUTE') AS x
         FROM pg_proc p WHERE p.pronamespace = $2::regnamespace
          AND p.proname IN ('enqueue', 'append_ready', 'check_tasks', 'check_queue', 'provision_lane', 'enqueue_ref')
        ORDER BY 1`,
      [role, schema],
    );
    assert.deepEqual(Object.fromEntries(privileges.rows.map((r) => [r.proname, r.x])), {
      append_ready: false,
      check_queue: false,
      check_tasks: false,
      enqueue: true,
      // Created by this test as the owner, without the REVOKE a migration makes: PUBLIC has it.
      enqueue_ref: true,
      provision_lane: false,
    });
    // The inline append writes ready and the lane's sequence as the definer: nothing granted for it.
    const direct = await asProducer.query(`SELECT nextval('${schema}.lane_seq_1')`).then(
      () => 'ok',
      (e: { code?: string }) => e.code,
    );
    assert.equal(direct, '42501');
  } finally {
    await asProducer.end();
    await pool.query(`DROP OWNED BY ${quoteIdent(role)}`).catch(() => undefined);
    await pool.query(`DROP ROLE IF EXISTS ${quoteIdent(role)}`).catch(() => undefined);
  }
});

test('the one-task statement binds the type as text where the bulk one sends JSON: the same type and payload stored for awkward text', async () => {
  const types = ['a"b', 'back\\slash', 'new\nline', 'tab\t', '\\u0000 as text', 'emoji 🚀', 'é', ' lead and trail '];
  const payload = { s: '\\u0000', q: '"', n: 1.5e300, u: '🚀', nested: [{ a: null }] };
  for (const type of types) {
    const one = await enqueue(pool, type, payload, { schema, queue: 'awkward' });
    const two = await enqueueMany(
      pool,
      [
        { type, payload, queue: 'awkward' },
        { type, payload, queue: 'awkward' },
      ],
      { schema },
    );
    const rows = await pool.query<{ id: string; type: string; payload: unknown }>(
      `SELECT id::text, type, payload FROM ${S}.ready WHERE id = ANY ($1::bigint[]) ORDER BY id`,
      [[one.id, two[0]!.id, two[1]!.id]],
    );
    assert.equal(rows.rows.length, 3);
    for (const r of rows.rows) {
      assert.equal(r.type, type);
      assert.deepEqual(r.payload, payload);
    }
  }
});
