/**
 * Attacks on the SQL enqueue door (add_task, add_tasks, enqueueSql): a caller's shadowing
 * functions and operators, names that look like SQL, a call of tens of thousands of tasks over
 * many lanes, the client's limits (a type counted in UTF-16 units, infinite run times), the lane
 * lock order against the client's enqueueMany, concurrent SQL and client producers on the same
 * lanes and dedupe keys at every isolation level, the wake NOTIFY, promotion of a deferred SQL
 * task, and enqueueSql bound by a driver that sends every value as text.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { BerthInputError, enqueue, enqueueMany, enqueueSql, getTask, grantRuntimeRole } from '../src/index.js';
import { promoteDue } from '../src/maintenance-api.js';
import { runDueTasks } from '../src/testing-api.js';
import { defineTask } from '../src/index.js';
import { wakeChannel } from '../src/sql.js';
import { listLaneSequenceProblems } from '../src/storage/lane-sequences.js';
import { DATABASE_URL, freshSchema, urlAs, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('sql_enqueue_attacks');
const S = `"${schema}"`;

/** Run every due task of these types; answers the ids that ran, in order. */
async function drain(types: string[], queues?: string[]): Promise<string[]> {
  const ran: string[] = [];
  const defs = types.map((type) =>
    defineTask({
      type,
      ceilingMs: 60_000,
      handler: async (_payload: unknown, ctx) => {
        ran.push(ctx.id);
      },
    }),
  );
  const reports = await runDueTasks(pool, defs, { schema, queues });
  for (const r of reports) assert.equal(r.status, 'completed', `${r.type} ${r.id} completed`);
  return ran.sort((a, b) => Number(a) - Number(b));
}

test("a caller's own functions and operators named like those add_task calls are never run", async (t) => {
  const role = `berth_sqlatk_p_${process.pid}`;
  await pool.query(`DROP ROLE IF EXISTS "${role}"`);
  await pool.query(`CREATE ROLE "${role}" LOGIN`);
  const trap = `sqlatk_trap_${process.pid}`;
  const p = new pg.Pool({ connectionString: urlAs(role), max: 1 });
  t.after(async () => {
    await p.end();
    await pool.query(`DROP SCHEMA IF EXISTS "${trap}" CASCADE`);
    await pool.query(`DROP OWNED BY "${role}"`).catch(() => undefined);
    await pool.query(`DROP ROLE IF EXISTS "${role}"`);
  });
  await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role, kind: 'producer' });
  await pool.query(`CREATE SCHEMA "${trap}" AUTHORIZATION "${role}"`);
  // The producer defines, in a schema of its own first on its search_path, a function or
  // operator for every name add_task and enqueue() call unqualified; each raises if run.
  const T = `"${trap}"`;
  const raise = `LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'shadow ran'; END $$`;
  for (const sig of [
    'now() RETURNS timestamptz',
    'txid_current() RETURNS bigint',
    'octet_length(text) RETURNS integer',
    'char_length(text) RETURNS integer',
    'to_json(text) RETURNS json',
    'jsonb_typeof(jsonb) RETURNS text',
    'nextval(regclass) RETURNS bigint',
    'pg_notify(text, text) RETURNS void',
    'pg_advisory_xact_lock(integer, integer) RETURNS void',
    'lower(text) RETURNS text',
    'ascii(text) RETURNS integer',
  ]) {
    await p.query(`CREATE FUNCTION ${T}.${sig} ${raise}`);
  }
  await p.query(`CREATE FUNCTION ${T}.eq_trap(text, text) RETURNS boolean ${raise}`);
  await p.query(`CREATE OPERATOR ${T}.= (LEFTARG = text, RIGHTARG = text, FUNCTION = ${T}.eq_trap)`);
  await p.query(`CREATE FUNCTION ${T}.lt_trap(integer, integer) RETURNS boolean ${raise}`);
  await p.query(`CREATE OPERATOR ${T}.< (LEFTARG = integer, RIGHTARG = integer, FUNCTION = ${T}.lt_trap)`);
  const client = await p.connect();
  try {
    await client.query(`SET search_path = "${trap}", pg_catalog`);
    // The trap works for the caller's own statements: the test would see a shadow that ran.
    await assert.rejects(client.query('SELECT now()'), /shadow ran/);
    const one = await client.query(
      `SELECT ${S}.add_task('shadowed', '{"a":1}', queue => 'q''"; DROP TABLE x; --', dedupe_key => 'k''1') AS id`,
    );
    const many = await client.query(`SELECT id::text, state FROM ${S}.add_tasks($1::jsonb)`, [
      JSON.stringify([
        { type: 'shadowed', queue: '%I %s $1 \\', delay: '1 hour' },
        { type: 'shadowed', queue: 'x', shard: 3, dedupe_key: "k'1" },
        { type: 'shadowed', queue: 'y' },
      ]),
    ]);
    assert.deepEqual(
      many.rows.map((r) => r.state),
      ['scheduled', 'duplicate', 'ready'],
    );
    const task = await getTask(pool, schema, String(one.rows[0].id));
    assert.equal(task?.queue, 'q\'"; DROP TABLE x; --', 'a queue name is data, stored as given');
    assert.equal(task?.dedupeKey, "k'1");
    const later = await getTask(pool, schema, many.rows[0].id);
    assert.equal(later?.queue, '%I %s $1 \\');
    assert.equal(later?.state, 'scheduled');
  } finally {
    client.release();
  }
  await pool.query(`DELETE FROM ${S}.deferred WHERE type = 'shadowed'`);
  await pool.query(`DELETE FROM ${S}.dedupe WHERE dedupe_key = 'k''1'`);
});

test('add_tasks of 30,000 tasks over 64 lanes answers one row per task in input order', async () => {
  const n = 30_000;
  const tasks = Array.from({ length: n }, (_, i) => ({
    type: 'bulk',
    payload: { i },
    shard: i % 32,
    priority: i % 2,
    ...(i % 1000 === 7 ? { dedupe_key: `bulk:${i % 3000}` } : {}),
  }));
  // Two tasks share a key in different lanes: the one in the lane locked first takes it.
  tasks[29_007] = { ...tasks[29_007]!, dedupe_key: 'bulk:7' };
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const rows = (
      await client.query(`SELECT ord, id::text, state, duplicate_of::text FROM ${S}.add_tasks($1::jsonb)`, [
        JSON.stringify(tasks),
      ])
    ).rows as { ord: number; id: string | null; state: string; duplicate_of: string | null }[];
    assert.equal(rows.length, n);
    assert.deepEqual(
      rows.map((r) => r.ord),
      Array.from({ length: n }, (_, i) => i + 1),
      'in input order',
    );
    const keyed = tasks.filter((t) => 'dedupe_key' in t).map((t) => t.dedupe_key);
    const dups = rows.filter((r) => r.state === 'duplicate');
    assert.equal(dups.length, keyed.length - new Set(keyed).size);
    const stored = await client.query<{ id: string; i: number; shard: number; priority: number }>(
      `SELECT id::text, (payload->>'i')::int AS i, shard, priority FROM ${S}.ready WHERE type = 'bulk'`,
    );
    assert.equal(stored.rows.length, n - dups.length);
    const byId = new Map(stored.rows.map((r) => [r.id, r]));
    for (const r of rows) {
      if (r.state === 'duplicate') {
        assert.ok(byId.has(r.duplicate_of!), 'a duplicate names the task of the batch that holds its key');
        continue;
      }
      const s = byId.get(r.id!)!;
      assert.equal(s.i, r.ord - 1, `row ${r.ord} is the id of task ${r.ord}`);
      assert.deepEqual([s.shard, s.priority], [(r.ord - 1) % 32, (r.ord - 1) % 2]);
    }
  } finally {
    await client.query('ROLLBACK');
    client.release();
  }
});

test('add_task refuses what the client refuses: a type over 200 UTF-16 units, infinite run times; a year-0 run_at is not a poison task', async () => {
  const emoji = '\u{1F600}';
  // 101 emoji: 101 code points, 202 UTF-16 units. The client and defineTask refuse it, so no
  // worker could ever run it.
  await assert.rejects(enqueue(pool, emoji.repeat(101), {}, { schema }), BerthInputError);
  assert.throws(
    () => defineTask({ type: emoji.repeat(101), ceilingMs: 1000, handler: async () => {} }),
    BerthInputError,
  );
  await assert.rejects(pool.query(`SELECT ${S}.add_task($1)`, [emoji.repeat(101)]), (err: pg.DatabaseError) => {
    assert.equal(err.code, '22023');
    assert.match(err.message, /task #1: type must be a non-empty string of at most 200 characters.*\(got 202\)/);
    return true;
  });
  await assert.rejects(
    pool.query(`SELECT * FROM ${S}.add_tasks($1::jsonb)`, [
      JSON.stringify([{ type: 'ok' }, { type: emoji.repeat(101) }]),
    ]),
    /task #2: type must be/,
  );
  // 100 emoji is 200 units: both take it.
  const ok = await pool.query(`SELECT ${S}.add_task($1) AS id`, [emoji.repeat(100)]);
  assert.equal((await getTask(pool, schema, String(ok.rows[0].id)))?.type, emoji.repeat(100));
  assert.deepEqual(await drain([emoji.repeat(100)]), [String(ok.rows[0].id)]);

  for (const runAt of ['infinity', '-infinity']) {
    await assert.rejects(
      pool.query(`SELECT ${S}.add_task('inf', run_at => $1)`, [runAt]),
      /run_at must be within the years 1 to 9999/,
    );
    await assert.rejects(
      pool.query(`SELECT * FROM ${S}.add_tasks($1::jsonb)`, [JSON.stringify([{ type: 'inf', run_at: runAt }])]),
      /run_at must be within the years 1 to 9999/,
    );
  }
  await assert.rejects(
    pool.query(`SELECT ${S}.add_task('inf', delay => '-1 microsecond')`),
    /delay must be an interval from 0/,
  );
  // The database keeps a day of slack below year 1 (migration 21): the client refuses such a
  // run time, the database takes it; it must still be a task a worker reads and runs.
  await assert.rejects(enqueue(pool, 'bc', {}, { schema, runAt: new Date('0000-12-31T12:00:00Z') }), BerthInputError);
  const bc = await pool.query(`SELECT ${S}.add_task('bc', run_at => '0001-12-31 12:00:00+00 BC') AS id`);
  const read = await getTask(pool, schema, String(bc.rows[0].id));
  assert.equal(read?.runAt?.toISOString(), '0000-12-31T12:00:00.000Z');
  assert.deepEqual(await drain(['bc']), [String(bc.rows[0].id)]);
});

/**
 * A client whose queries after the first wait for `gate`: the client's enqueueMany sends one
 * statement per lane, so it holds its first lane's lock while the gate is shut.
 */
function gated(client: pg.PoolClient, gate: Promise<void>): pg.PoolClient {
  let n = 0;
  return new Proxy(client, {
    get(target, key) {
      if (key !== 'query') return Reflect.get(target, key);
      return async (...args: Parameters<pg.PoolClient['query']>) => {
        if (n++ > 0) await gate;
        return (target.query as (...a: unknown[]) => unknown)(...args);
      };
    },
  });
}

test('a SQL batch and a client batch over lanes whose JavaScript and code-point orders differ take their locks in one order', async () => {
  // By code point U+E000 < U+1F600; by UTF-16 unit (JavaScript's sort) U+1F600 (D83D DE00)
  // sorts first. Lanes provisioned beforehand, so only the lane locks are taken.
  const queues = ['\u{1F600}', '\uE000'];
  for (const queue of queues) await enqueue(pool, 'order', {}, { schema, queue, shard: 0 });
  let open!: () => void;
  const gate = new Promise<void>((r) => {
    open = r;
  });
  const js = await pool.connect();
  const sql = await pool.connect();
  try {
    await js.query('BEGIN');
    await sql.query('BEGIN');
    const jsPid = (await js.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
    const sqlPid = (await sql.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
    const client = gated(js, gate);
    // Its first lane's statement runs; the second waits for the gate.
    const jsDone = enqueueMany(
      client,
      queues.map((queue) => ({ type: 'order', payload: {}, queue, shard: 0 })),
      { schema },
    );
    await waitFor(
      async () =>
        (await pool.query('SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = $2 AND granted', [jsPid, 'advisory']))
          .rowCount,
      20_000,
      'the client batch to hold its first lane',
    );
    const sqlDone = sql.query(`SELECT * FROM ${S}.add_tasks($1::jsonb)`, [
      JSON.stringify(queues.map((queue) => ({ type: 'order', queue, shard: 0 }))),
    ]);
    sqlDone.catch(() => undefined);
    // The SQL batch waits for a lane lock (the client's first lane, when the orders agree).
    await waitFor(
      async () => (await pool.query('SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted', [sqlPid])).rowCount,
      20_000,
      'the SQL batch to wait',
    );
    open();
    const results = await jsDone;
    assert.deepEqual(
      results.map((r) => r.state),
      ['ready', 'ready'],
    );
    await js.query('COMMIT');
    const rows = await sqlDone;
    assert.deepEqual(
      rows.rows.map((r) => r.state),
      ['ready', 'ready'],
      'no deadlock (40P01)',
    );
    await sql.query('COMMIT');
  } finally {
    open();
    await js.query('ROLLBACK').catch(() => undefined);
    await sql.query('ROLLBACK').catch(() => undefined);
    js.release();
    sql.release();
  }
  assert.equal((await drain(['order'], queues)).length, 6);
});

for (const level of ['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']) {
  test(`SQL and client producers at ${level} on the same lanes and dedupe keys: no task lost or doubled`, async () => {
    const type = `mix_${level.replace(' ', '_').toLowerCase()}`;
    const keys = ['a', 'b', 'c'].map((k) => `${type}:${k}`);
    const committed: { id: string; key: string | null }[] = [];
    // A transaction enqueues through SQL or the client; a serialization failure (40001) or a
    // deadlock (40P01) is the caller's to retry, as for any transaction.
    const producer = async (w: number) => {
      for (let round = 0; round < 8; round++) {
        for (;;) {
          const c = await pool.connect();
          try {
            await c.query(`BEGIN ISOLATION LEVEL ${level}`);
            const specs = [0, 1, 2].map((j) => ({
              queue: j === 0 ? 'mix-a' : 'mix-b',
              shard: (w + j + round) % 2,
              key: (w + round + j) % 4 === 0 ? keys[(w + j) % keys.length]! : null,
            }));
            let got: { id: string | null; key: string | null }[];
            if ((w + round) % 2 === 0) {
              const rows = await c.query(`SELECT id::text FROM ${S}.add_tasks($1::jsonb)`, [
                JSON.stringify(
                  specs.map((s) => ({
                    type,
                    payload: { w, round },
                    queue: s.queue,
                    shard: s.shard,
                    dedupe_key: s.key,
                  })),
                ),
              ]);
              got = rows.rows.map((r, i) => ({ id: r.id as string | null, key: specs[i]!.key }));
            } else {
              const res = await enqueueMany(
                c,
                specs.map((s) => ({
                  type,
                  payload: { w, round },
                  queue: s.queue,
                  shard: s.shard,
                  ...(s.key ? { dedupeKey: s.key } : {}),
                })),
                { schema },
              );
              got = res.map((r, i) => ({ id: r.id, key: specs[i]!.key }));
            }
            await c.query('COMMIT');
            for (const g of got) if (g.id !== null) committed.push({ id: g.id, key: g.key });
            break;
          } catch (err) {
            await c.query('ROLLBACK').catch(() => undefined);
            if (!['40001', '40P01'].includes((err as { code?: string }).code ?? '')) throw err;
          } finally {
            c.release();
          }
        }
      }
    };
    await Promise.all([0, 1, 2, 3].map(producer));
    const byKey = new Map<string, number>();
    for (const c of committed) if (c.key) byKey.set(c.key, (byKey.get(c.key) ?? 0) + 1);
    for (const [key, n] of byKey) assert.equal(n, 1, `one live task holds ${key}`);
    assert.deepEqual(await listLaneSequenceProblems(pool, schema), []);
    // Each lane's entries in lane_seq order, no position twice (the primary key) or out of order.
    const ran = await drain([type], ['mix-a', 'mix-b']);
    assert.deepEqual(
      ran,
      committed.map((c) => c.id).sort((a, b) => Number(a) - Number(b)),
      'every committed task ran once',
    );
    await pool.query(`DELETE FROM ${S}.dedupe WHERE dedupe_key = ANY ($1)`, [keys]);
  });
}

test('wake: a listener hears each lane of a committed add_tasks, nothing of a rolled back one; a deferred SQL task is promoted', async () => {
  const listener = new pg.Client({ connectionString: DATABASE_URL });
  await listener.connect();
  const heard: string[] = [];
  listener.on('notification', (m) => heard.push(m.payload ?? ''));
  try {
    await listener.query(`LISTEN "${wakeChannel(schema)}"`);
    const c = await pool.connect();
    try {
      await c.query('BEGIN');
      await c.query(`SELECT * FROM ${S}.add_tasks($1::jsonb)`, [
        JSON.stringify([
          { type: 'wake', queue: 'wake-rb', shard: 1 },
          { type: 'wake', queue: 'wake-rb', shard: 2 },
        ]),
      ]);
      await c.query('ROLLBACK');
      await c.query('BEGIN');
      await c.query(`SELECT * FROM ${S}.add_tasks($1::jsonb)`, [
        JSON.stringify([
          { type: 'wake', queue: 'wake', shard: 1 },
          { type: 'wake', queue: 'wake', shard: 2 },
          { type: 'wake', queue: 'wake', run_at: '2999-01-01T00:00:00Z' },
        ]),
      ]);
      assert.equal(heard.length, 0, 'nothing before the commit');
      await c.query('COMMIT');
    } finally {
      c.release();
    }
    const lanes = await pool.query<{ lane_id: number; queue: string }>(
      `SELECT lane_id, queue FROM ${S}.lanes WHERE queue IN ('wake', 'wake-rb') ORDER BY shard`,
    );
    const committedLanes = lanes.rows.filter((l) => l.queue === 'wake').map((l) => String(l.lane_id));
    await waitFor(() => heard.length >= 2, 20_000, 'the wake notices');
    // A marker notice after them: everything sent before it has arrived.
    await pool.query(`SELECT pg_notify($1, 'marker')`, [wakeChannel(schema)]);
    await waitFor(() => heard.includes('marker'), 20_000, 'the marker');
    assert.deepEqual(heard.filter((h) => h !== 'marker').sort(), committedLanes.sort(), 'one per lane committed');
  } finally {
    await listener.end();
  }
  // The deferred one: once due, the leader's promotion appends it to its lane and a worker runs it.
  const later = await pool.query(`SELECT id::text FROM ${S}.deferred WHERE type = 'wake'`);
  assert.equal(later.rows.length, 1);
  await pool.query(`UPDATE ${S}.deferred SET run_at = now() - interval '1 second' WHERE type = 'wake'`);
  assert.equal(await promoteDue(pool, schema), 1);
  const ran = await drain(['wake'], ['wake']);
  assert.equal(ran.length, 3);
  assert.ok(ran.includes(later.rows[0].id));
});

test('enqueueSql bound by a driver that sends every value as text writes what enqueue writes', async () => {
  const options = { schema, queue: 'sqltext', priority: -3, maxAttempts: 4, shard: 5, delay: 0 };
  const viaJs = await enqueue(pool, 'astext', { a: [1, 'two'], b: null }, { ...options, dedupeKey: 'astext:js' });
  const call = await enqueueSql('astext', { a: [1, 'two'], b: null }, { ...options, dedupeKey: 'astext:sql' });
  // Every parameter declared text, as postgres.js or Prisma bind a string: the casts in the text
  // must resolve add_task without the server inferring a type.
  const c = await pool.connect();
  let id: string;
  try {
    const types = call.values.map(() => 'text').join(', ');
    await c.query(`PREPARE astext(${types}) AS ${call.text}`);
    const args = call.values.map((v) => (v === null ? 'NULL' : pg.escapeLiteral(String(v)))).join(', ');
    id = String((await c.query(`EXECUTE astext(${args})`)).rows[0].id);
    await c.query('DEALLOCATE astext');
  } finally {
    c.release();
  }
  const a = await getTask(pool, schema, viaJs.id!);
  const b = await getTask(pool, schema, id);
  const same = (t: typeof a) => ({ ...t, id: undefined, dedupeKey: undefined, createdAt: undefined, runAt: undefined });
  assert.deepEqual(same(b), same(a));
  assert.deepEqual([a?.dedupeKey, b?.dedupeKey], ['astext:js', 'astext:sql']);
  const later = await enqueueSql('astext', {}, { schema, runAt: new Date('2999-01-01T00:00:00.123Z') });
  const c2 = await pool.connect();
  try {
    await c2.query(`PREPARE astext2(${later.values.map(() => 'text').join(', ')}) AS ${later.text}`);
    const args = later.values.map((v) => (v === null ? 'NULL' : pg.escapeLiteral(String(v)))).join(', ');
    const lid = String((await c2.query(`EXECUTE astext2(${args})`)).rows[0].id);
    assert.equal((await getTask(pool, schema, lid))?.runAt?.toISOString(), '2999-01-01T00:00:00.123Z');
  } finally {
    c2.release();
  }
  await pool.query(`DELETE FROM ${S}.deferred WHERE type = 'astext'`);
  assert.equal((await drain(['astext'], ['sqltext'])).length, 2);
});
