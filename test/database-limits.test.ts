/**
 * The database enforces what the client checks, and audits every cancel and removal with the
 * session's role (migration 20). Each function a producer or a worker may call is called here
 * directly in SQL, as a producer role and as a worker role, with each value the client refuses:
 * the call fails with SQLSTATE 22023 and a message naming the function and the field, and
 * nothing is written.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { enqueue, migrate } from '../src/index.js';
import { DATABASE_URL, urlAs } from './helpers.js';

// Roles are cluster-wide: every name carries the pid so parallel runs never share one.
const worker = `berth_lim_w_${process.pid}`;
const producer = `berth_lim_p_${process.pid}`;
const schema = `t_limits_${process.pid}`;
const S = `"${schema}"`;

const admin = new pg.Pool({ connectionString: DATABASE_URL });
await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
for (const r of [worker, producer]) {
  await admin.query(`DROP ROLE IF EXISTS "${r}"`);
  await admin.query(`CREATE ROLE "${r}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
}
await migrate({ connectionString: DATABASE_URL, schema, runtimeRoles: [worker], producerRoles: [producer] });
const asWorker = new pg.Pool({ connectionString: urlAs(worker), max: 2 });
const asProducer = new pg.Pool({ connectionString: urlAs(producer), max: 2 });

after(async () => {
  await Promise.all([asWorker.end(), asProducer.end()]);
  await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
  for (const r of [worker, producer]) {
    await admin.query(`DROP OWNED BY "${r}"`).catch(() => undefined);
    await admin.query(`DROP ROLE IF EXISTS "${r}"`);
  }
  await admin.end();
});

/** What the queue holds: nothing a refused call may change. */
async function footprint(): Promise<string> {
  const r = await admin.query(
    `SELECT (SELECT count(*) FROM ${S}.ready) || '/' || (SELECT count(*) FROM ${S}.deferred) || '/' ||
            (SELECT count(*) FROM ${S}.lanes) || '/' || (SELECT count(*) FROM ${S}.tombstones) || '/' ||
            (SELECT count(*) FROM ${S}.dedupe) AS f`,
  );
  return r.rows[0].f;
}

/** The 10-argument enqueue() with one argument replaced. */
function enqueueCall(over: Partial<Record<string, string>>): string {
  const arg = {
    queue: `'q'`,
    priority: '0::smallint',
    shard: 'NULL::smallint',
    shards: '16::smallint',
    types: `ARRAY['t']`,
    payloads: `ARRAY['{}'::jsonb]`,
    runAt: 'NULL::timestamptz[]',
    maxAttempts: 'NULL::integer[]',
    dedupe: 'NULL::text[]',
    trace: 'NULL::text',
    ...over,
  };
  return `SELECT * FROM ${S}.enqueue(${arg.queue}, ${arg.priority}, ${arg.shard}, ${arg.shards}, ${arg.types},
            ${arg.payloads}, ${arg.runAt}, ${arg.maxAttempts}, ${arg.dedupe}, ${arg.trace})`;
}

const ENQUEUE_REFUSALS: [string, Partial<Record<string, string>>, RegExp][] = [
  ['a queue of 256 bytes', { queue: `repeat('q', 256)` }, /enqueue: queue must be at most 255 UTF-8 bytes \(got 256\)/],
  ['a 50,000-character queue', { queue: `repeat('é', 50000)` }, /enqueue: queue must be at most 255 UTF-8 bytes/],
  [
    'an empty type',
    { types: `ARRAY['t', '']`, payloads: `ARRAY['{}'::jsonb, '{}']` },
    /enqueue: task #2: type must be a non-empty string of at most 200/,
  ],
  ['a 201-character type', { types: `ARRAY[repeat('t', 201)]` }, /task #1: type .* \(got 201 characters\)/],
  ['a null type', { types: `ARRAY[NULL::text]` }, /task #1: type .* \(got null\)/],
  ['a null payload', { payloads: `ARRAY[NULL::jsonb]` }, /task #1: payload must not be null/],
  [
    'max_attempts -7',
    { maxAttempts: 'ARRAY[-7]' },
    /task #1: max_attempts must be an integer from 1 to 1000000 \(got -7\)/,
  ],
  ['max_attempts 1,000,001', { maxAttempts: 'ARRAY[1000001]' }, /max_attempts must be an integer from 1 to 1000000/],
  ['an empty dedupe key', { dedupe: `ARRAY['']` }, /task #1: dedupe_key must be a non-empty string of at most 1024/],
  ['a dedupe key of 1,025 bytes', { dedupe: `ARRAY[repeat('k', 1025)]` }, /dedupe_key .* \(got 1025\)/],
  [
    'a run time in the year 10000',
    { runAt: `ARRAY['10000-01-01'::timestamptz]` },
    /task #1: run_at must be within the years 1 to 9999/,
  ],
  [
    'a 100,000-character trace context',
    { trace: `repeat('x', 100000)` },
    /enqueue: trace_context must be at most 1024 characters/,
  ],
  ['shard 64', { shard: '64::smallint' }, /enqueue: shard must be an integer from 0 to 63 \(got 64\)/],
  ['shards 0', { shards: '0::smallint' }, /enqueue: shards must be an integer from 1 to 64 \(got 0\)/],
  ['arrays of different lengths', { types: `ARRAY['t', 't']` }, /one element per task/],
  [
    'a two-dimensional types array',
    { types: `ARRAY[['t', 't'], ['t', 't']]`, payloads: `ARRAY['{}'::jsonb, '{}', '{}', '{}']` },
    /must be one-dimensional arrays/,
  ],
  [
    'a run time before the year 1 by more than a day',
    { runAt: `ARRAY['0001-01-01 00:00:00+00'::timestamptz - interval '2 days']` },
    /task #1: run_at must be within the years 1 to 9999/,
  ],
  // Migration 32 reads one task's elements by subscript 1: arrays subscripted otherwise are
  // still checked (by check_tasks, which reads them by unnest).
  [
    'a run time of infinity in an array subscripted from 0',
    { runAt: `'[0:0]={infinity}'::timestamptz[]` },
    /task #1: run_at must be within the years 1 to 9999/,
  ],
  ['max_attempts 0 subscripted from 0', { maxAttempts: `'[0:0]={0}'::integer[]` }, /task #1: max_attempts/],
  ['an empty dedupe key subscripted from 2', { dedupe: `'[2:2]={""}'::text[]` }, /task #1: dedupe_key/],
  ['a null payload subscripted from 0', { payloads: `'[0:0]={null}'::jsonb[]` }, /task #1: payload must not be null/],
  ['an empty type subscripted from 5', { types: `'[5:5]={""}'::text[]` }, /task #1: type must be a non-empty/],
  // A batch's elements (one EXISTS over the arrays, then check_tasks for the message).
  [
    "a batch's second run time in the year 10000",
    {
      types: `ARRAY['t', 't']`,
      payloads: `ARRAY['{}'::jsonb, '{}']`,
      runAt: `ARRAY[now(), '10000-01-01'::timestamptz]`,
    },
    /task #2: run_at must be within the years 1 to 9999/,
  ],
  [
    "a batch's second payload null",
    { types: `ARRAY['t', 't']`, payloads: `ARRAY['{}'::jsonb, NULL]` },
    /task #2: payload must not be null/,
  ],
];

for (const [who, db] of [
  ['producer', asProducer],
  ['worker', asWorker],
] as const) {
  test(`as the ${who} role, enqueue() called directly refuses each value the client refuses, naming it, and writes nothing`, async () => {
    const before = await footprint();
    for (const [what, over, message] of ENQUEUE_REFUSALS) {
      await assert.rejects(db.query(enqueueCall(over)), (e: Error & { code?: string }) => {
        assert.equal(e.code, '22023', `${what}: ${e.message}`);
        assert.match(e.message, message, what);
        return true;
      });
    }
    // The older signature (before trace contexts) checks the same.
    await assert.rejects(
      db.query(
        `SELECT * FROM ${S}.enqueue(repeat('q', 300), 0::smallint, NULL, 16::smallint, ARRAY['t'], ARRAY['{}'::jsonb], NULL, NULL, NULL)`,
      ),
      /enqueue: queue must be at most 255 UTF-8 bytes/,
    );
    // A NUL never reaches the function: PostgreSQL refuses it in text and in jsonb.
    await assert.rejects(
      db.query(enqueueCall({ types: 'ARRAY[$1::text]' }), ['a\u0000b']),
      (e: Error & { code?: string }) => e.code === '22021',
    );
    await assert.rejects(
      db.query(enqueueCall({ payloads: `ARRAY['{"a": "\\u0000"}'::jsonb]` })),
      (e: Error & { code?: string }) => e.code === '22P05',
    );
    assert.equal(await footprint(), before, 'nothing was written');
    // Within the limits it enqueues (priority is any smallint, as in the client).
    const ok = await db.query(enqueueCall({ priority: '(-32768)::smallint', queue: `repeat('q', 255)` }));
    assert.equal(ok.rows[0].state, 'ready');
  });
}

test('the run times the client accepts at its bounds are accepted, give or take the rounding of a delay or a time zone', async () => {
  // The longest delay the client takes arrives a fraction of a millisecond past 9999-12-31
  // 23:59:59.999; year 1 can arrive seconds early from a time zone with a local-mean-time offset.
  for (const at of [`'9999-12-31 23:59:59.999916+00'`, `'0001-12-31 23:59:58+00 BC'`]) {
    const r = await asProducer.query(enqueueCall({ runAt: `ARRAY[${at}::timestamptz]` }));
    assert.ok(['ready', 'scheduled'].includes(r.rows[0].state), at);
  }
});

test('a lane opened before the queue limit keeps taking back its scheduled and retried tasks', async () => {
  // A lane of a 300-byte queue, as an older client or SQL before migration 20 could open it, with
  // a task deferred and due: promotion appends it through provision_lane().
  const queue = 'L'.repeat(300);
  const lane = await admin.query(
    `INSERT INTO ${S}.lanes (queue, priority, shard) VALUES ($1, 0, 0) RETURNING lane_id`,
    [queue],
  );
  await admin.query(`CREATE SEQUENCE ${S}."lane_seq_${lane.rows[0].lane_id}"`);
  await admin.query(
    `INSERT INTO ${S}.deferred (id, type, payload, queue, priority, shard, attempts, created_at, state, run_at)
     VALUES (nextval('${S}.task_id_seq'), 't', '{}', $1, 0, 0, 0, now(), 'scheduled', now())`,
    [queue],
  );
  const again = await asWorker.query(`SELECT ${S}.provision_lane($1, 0::smallint, 0::smallint) AS id`, [queue]);
  assert.equal(again.rows[0].id, lane.rows[0].lane_id, 'the existing lane is returned, not refused');
  const { promoteDue } = await import('../src/maintenance-api.js');
  await promoteDue(admin, schema);
  const left = await admin.query(`SELECT count(*)::int AS n FROM ${S}.deferred WHERE queue = $1`, [queue]);
  assert.equal(left.rows[0].n, 0, 'the due task went back to its lane');
  // A new lane of such a queue is still refused.
  await assert.rejects(
    asWorker.query(`SELECT ${S}.provision_lane($1, 1::smallint, 0::smallint)`, [queue]),
    /provision_lane: queue must be at most 255 UTF-8 bytes/,
  );
});

test('as the worker role, provision_lane(), move_task(), remove_unleased() and cancel_tasks() refuse what the client refuses', async () => {
  const before = await footprint();
  const refusals: [string, string, RegExp][] = [
    [
      'provision_lane',
      `SELECT ${S}.provision_lane(repeat('q', 256), 0::smallint, 0::smallint)`,
      /provision_lane: queue must be at most 255 UTF-8 bytes/,
    ],
    ['provision_lane', `SELECT ${S}.provision_lane('q', 0::smallint, 64::smallint)`, /shard 64 is outside 0-63/],
    [
      'move_task',
      `SELECT ${S}.move_task(1, repeat('q', 256), 0::smallint)`,
      /move_task: queue must be at most 255 UTF-8 bytes/,
    ],
    [
      'remove_unleased',
      `SELECT ${S}.remove_unleased(1, repeat('r', 65))`,
      /remove_unleased: reason must be a non-empty string of at most 64/,
    ],
    [
      'cancel_tasks',
      `SELECT * FROM ${S}.cancel_tasks(ARRAY[1::bigint], repeat('a', 201))`,
      /cancel_tasks: actor must be at most 200 characters \(got 201\)/,
    ],
    [
      'cancel_tasks',
      `SELECT * FROM ${S}.cancel_tasks(ARRAY(SELECT generate_series(1, 10001)::bigint), 'a')`,
      /cancel_tasks: at most 10000 ids a call/,
    ],
  ];
  for (const [fn, sql, message] of refusals) {
    await assert.rejects(asWorker.query(sql), (e: Error & { code?: string }) => {
      assert.equal(e.code, '22023', `${fn}: ${e.message}`);
      assert.match(e.message, message, fn);
      return true;
    });
  }
  assert.equal(await footprint(), before, 'nothing was written');
});

test('a cancel or a removal by a runtime role is audited with the session role, beside the actor it claims', async () => {
  const a = await enqueue(admin, 't', {}, { schema, queue: 'audit' });
  const b = await enqueue(admin, 't', {}, { schema, queue: 'audit' });
  await admin.query(`TRUNCATE ${S}.audit_log`);
  const cancelled = await asWorker.query(`SELECT * FROM ${S}.cancel_tasks(ARRAY[$1::bigint], 'someone-else')`, [a.id]);
  assert.deepEqual(cancelled.rows, [{ id: a.id, result: 'removed' }]);
  const removed = await asWorker.query(`SELECT ${S}.remove_unleased($1, 'deleted') AS r`, [b.id]);
  assert.equal(removed.rows[0].r, 'removed');
  // Nothing to cancel or remove: no row.
  await asWorker.query(`SELECT * FROM ${S}.cancel_tasks(ARRAY[$1::bigint], 'someone-else')`, [b.id]);
  const audit = await admin.query(`SELECT actor, action, target, result FROM ${S}.audit_log ORDER BY id`);
  assert.deepEqual(audit.rows, [
    {
      actor: `db:${worker}`,
      action: 'cancel',
      target: { ids: [Number(a.id)], actor: 'someone-else' },
      result: { [a.id!]: 'removed' },
    },
    {
      actor: `db:${worker}`,
      action: 'remove',
      target: { id: Number(b.id), reason: 'deleted' },
      result: { result: 'removed' },
    },
  ]);
  // The producer role may neither cancel nor remove.
  await assert.rejects(asProducer.query(`SELECT * FROM ${S}.cancel_tasks(ARRAY[1::bigint], 'x')`), /permission denied/);
  await assert.rejects(asProducer.query(`SELECT ${S}.remove_unleased(1, 'x')`), /permission denied/);
});
