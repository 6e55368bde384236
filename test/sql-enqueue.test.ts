/**
 * add_task() and add_tasks() (migration 23), the documented SQL door to enqueue: from a trigger,
 * psql and Python's psycopg, each followed by a worker's run; their errors; dedupe inside a batch
 * and against the client's enqueue; the producer role; every isolation level.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import pg from 'pg';
import { defineTask, enqueue, grantRuntimeRole, migrate } from '../src/index.js';
import { runDueTasks } from '../src/testing-api.js';
import { wakeChannel } from '../src/sql.js';
import { DATABASE_URL, freshSchema, migrateUpTo, urlAs, waitFor } from './helpers.js';

const run = promisify(execFile);
const { schema, pool } = await freshSchema('sql_enqueue');
const S = `"${schema}"`;

/** A handler per type that records what it ran. */
const ran: { type: string; payload: unknown; id: string }[] = [];
const def = (type: string) =>
  defineTask({
    type,
    ceilingMs: 60_000,
    handler: async (payload: unknown, ctx) => {
      ran.push({ type, payload, id: ctx.id });
    },
  });

async function drain(types: string[], queues?: string[]): Promise<{ type: string; payload: unknown; id: string }[]> {
  ran.length = 0;
  const reports = await runDueTasks(
    pool,
    types.map((t) => def(t)),
    { schema, queues },
  );
  for (const r of reports) assert.equal(r.status, 'completed', `${r.type} ${r.id} completed`);
  return ran.splice(0).sort((a, b) => Number(a.id) - Number(b.id));
}

/** Tasks waiting in the ring or deferred storage. */
async function pending(): Promise<number> {
  const r = await pool.query<{ n: number }>(
    `SELECT (SELECT count(*) FROM ${S}.deferred)::int + (SELECT count(*) FROM ${S}.ready r
       WHERE NOT EXISTS (SELECT 1 FROM ${S}.leased_entries le WHERE le.id = r.id))::int AS n`,
  );
  return r.rows[0]!.n;
}

test('a trigger enqueues on INSERT: committed, a worker runs it and the wake NOTIFY arrives; rolled back, no task', async () => {
  await pool.query(`CREATE TABLE ${S}.orders (id serial PRIMARY KEY, email text NOT NULL)`);
  await pool.query(`
    CREATE FUNCTION ${S}.order_created() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      PERFORM ${S}.add_task('order_created', jsonb_build_object('order', NEW.id, 'email', NEW.email),
                            dedupe_key => 'order:' || NEW.id);
      RETURN NEW;
    END $$`);
  await pool.query(
    `CREATE TRIGGER order_created AFTER INSERT ON ${S}.orders FOR EACH ROW EXECUTE FUNCTION ${S}.order_created()`,
  );
  const listener = new pg.Client({ connectionString: DATABASE_URL });
  await listener.connect();
  const notices: string[] = [];
  listener.on('notification', (n) => {
    if (n.channel === wakeChannel(schema)) notices.push(n.payload ?? '');
  });
  await listener.query(`LISTEN "${wakeChannel(schema)}"`);
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query(`INSERT INTO ${S}.orders (email) VALUES ('gone@example.com')`);
    await client.query('ROLLBACK');
    assert.equal(await pending(), 0, 'the rolled-back insert enqueued nothing');

    await client.query('BEGIN');
    const order = await client.query<{ id: number }>(
      `INSERT INTO ${S}.orders (email) VALUES ('a@example.com') RETURNING id`,
    );
    await client.query('COMMIT');
    const lane = await waitFor(() => notices[0], 20_000, 'the wake NOTIFY of the committed enqueue');
    const entry = await pool.query(`SELECT lane_id::text AS lane FROM ${S}.ready WHERE type = 'order_created'`);
    assert.equal(lane, entry.rows[0].lane, 'the NOTIFY names the lane, as for a client enqueue');
    const done = await drain(['order_created']);
    assert.deepEqual(
      done.map((d) => d.payload),
      [{ order: order.rows[0]!.id, email: 'a@example.com' }],
    );
  } finally {
    client.release();
    await listener.end();
  }
});

test('a call from psql, then a worker runs the task', async () => {
  const { stdout } = await run('psql', [
    DATABASE_URL,
    '-X',
    '-At',
    '-v',
    'ON_ERROR_STOP=1',
    '-c',
    `SELECT ${S}.add_task('from_psql', '{"to":"a@b"}', priority => 3)`,
  ]);
  const id = stdout.trim();
  assert.match(id, /^\d+$/);
  const done = await drain(['from_psql']);
  assert.deepEqual(done, [{ type: 'from_psql', payload: { to: 'a@b' }, id }]);
});

/** A Python 3 that can import psycopg (scripts/test-prereqs.sh installs python3-psycopg). */
async function pythonWithPsycopg(): Promise<string> {
  for (const python of [process.env.PYTHON, '/usr/bin/python3', 'python3'].filter(Boolean) as string[]) {
    try {
      await run(python, ['-c', 'import psycopg']);
      return python;
    } catch {}
  }
  throw new Error('no python3 with psycopg: run scripts/test-prereqs.sh (Debian package python3-psycopg)');
}

test("a call from Python's psycopg, then a worker runs the task", async () => {
  const python = await pythonWithPsycopg();
  const script = `
import sys
import psycopg
from psycopg.types.json import Jsonb
url, schema = sys.argv[1], sys.argv[2]
with psycopg.connect(url) as conn:  # commits when the block ends
    row = conn.execute(
        "SELECT " + schema + ".add_task(type => %s, payload => %s, queue => %s, priority => %s)",
        ("from_python", Jsonb({"to": "b@c", "n": 2}), "py", 5),
    ).fetchone()
    print(row[0])
`;
  const { stdout } = await run(python, ['-c', script, DATABASE_URL, S]);
  const id = stdout.trim();
  assert.match(id, /^\d+$/);
  const entry = await pool.query(`SELECT queue, priority FROM ${S}.ready WHERE id = $1`, [id]);
  assert.deepEqual(entry.rows, [{ queue: 'py', priority: 5 }]);
  const done = await drain(['from_python'], ['py']);
  assert.deepEqual(done, [{ type: 'from_python', payload: { to: 'b@c', n: 2 }, id }]);
});

/** The call fails with `code` and a message matching `message`, and writes no task. */
async function refused(text: string, values: unknown[], code: string, message: RegExp): Promise<void> {
  const before = await pending();
  await assert.rejects(pool.query(text, values), (err: { code?: string; message: string }) => {
    assert.equal(err.code, code, `${text} ${JSON.stringify(values).slice(0, 80)}: ${err.message}`);
    assert.match(err.message, message);
    return true;
  });
  assert.equal(await pending(), before, 'nothing was written');
}

test('add_task refuses what enqueue refuses, with 22023 naming the argument', async () => {
  const call = `SELECT ${S}.add_task(type => $1, payload => $2::jsonb, queue => $3, priority => $4,
    max_attempts => $5, dedupe_key => $6, run_at => $7, delay => $8)`;
  const ok = ['t', '{}', 'default', 0, null, null, null, null];
  const bad = (i: number, v: unknown) => ok.map((x, j) => (j === i ? v : x));
  await refused(call, bad(0, ''), '22023', /berth: add_task: task #1: type must be a non-empty string/);
  await refused(call, bad(0, 'x'.repeat(201)), '22023', /type must be .* at most 200 characters \(got 201/);
  await refused(call, bad(0, null), '22023', /type must be/);
  await refused(call, bad(1, null), '22023', /payload must not be null/);
  await refused(call, bad(2, 'q'.repeat(256)), '22023', /queue must be at most 255 UTF-8 bytes \(got 256\)/);
  await refused(call, bad(3, 32768), '22023', /priority must be an integer from -32768 to 32767 \(got 32768\)/);
  await refused(call, bad(3, -40000), '22023', /priority must be an integer from -32768 to 32767/);
  await refused(call, bad(4, 0), '22023', /max_attempts must be an integer from 1 to 1000000 \(got 0\)/);
  await refused(call, bad(5, 'k'.repeat(1025)), '22023', /dedupe_key must be .* at most 1024 UTF-8 bytes/);
  await refused(call, bad(5, ''), '22023', /dedupe_key must be a non-empty string/);
  await refused(call, bad(6, '10000-01-01T00:00:00Z'), '22023', /run_at must be within the years 1 to 9999/);
  await refused(call, bad(7, '-1 second'), '22023', /delay must be an interval from 0/);
  await refused(call, bad(7, '9000 years'), '22023', /run_at must be within the years 1 to 9999/);
  await refused(
    `SELECT ${S}.add_task('t', shard => 64)`,
    [],
    '22023',
    /shard must be an integer from 0 to 63 \(got 64\)/,
  );
  await refused(`SELECT ${S}.add_task('t', shards => 0)`, [], '22023', /shards must be an integer from 1 to 64/);
  // NUL: PostgreSQL refuses it in text and in jsonb before the function runs.
  await refused(call, bad(1, '{"a":"\\u0000"}'), '22P05', /unsupported Unicode escape sequence/);
  await refused(call, bad(0, 'a\u0000b'), '22021', /invalid byte sequence/);
});

test('a payload need not be an object (as with enqueue); NULL is the default of every optional argument', async () => {
  const a = await pool.query(`SELECT ${S}.add_task('any_json', '[1, "two"]') AS id`);
  const b = await pool.query(`SELECT ${S}.add_task('any_json', '"text"', NULL, NULL, NULL, NULL, NULL) AS id`);
  const c = await pool.query(`SELECT ${S}.add_task('any_json') AS id`);
  const rows = await pool.query(
    `SELECT id::text, queue, priority, max_attempts FROM ${S}.ready WHERE type = 'any_json' ORDER BY id`,
  );
  assert.deepEqual(
    rows.rows.map((r) => [r.queue, r.priority, r.max_attempts]),
    [
      ['default', 0, null],
      ['default', 0, null],
      ['default', 0, null],
    ],
  );
  const done = await drain(['any_json']);
  assert.deepEqual(
    done.map((d) => [d.id, d.payload]),
    [
      [a.rows[0].id, [1, 'two']],
      [b.rows[0].id, 'text'],
      [c.rows[0].id, {}],
    ],
  );
});

test('run_at in the future or a delay defers the task; a due run_at makes it ready at once', async () => {
  const later = await pool.query(`SELECT ${S}.add_task('later', run_at => now() + interval '1 hour') AS id`);
  const delayed = await pool.query(`SELECT ${S}.add_task('later', delay => '10 minutes') AS id`);
  const past = await pool.query(`SELECT ${S}.add_task('later', run_at => now() - interval '1 hour') AS id`);
  const deferred = await pool.query(`SELECT id::text, state FROM ${S}.deferred WHERE type = 'later' ORDER BY id`);
  assert.deepEqual(deferred.rows, [
    { id: later.rows[0].id, state: 'scheduled' },
    { id: delayed.rows[0].id, state: 'scheduled' },
  ]);
  const done = await drain(['later']);
  assert.deepEqual(
    done.map((d) => d.id),
    [past.rows[0].id],
    'only the due one runs',
  );
  await pool.query(`DELETE FROM ${S}.deferred WHERE type = 'later'`);
});

test('dedupe: add_task answers NULL for a held key; add_tasks reports each duplicate and what holds its key, in input order', async () => {
  const held = await enqueue(pool, 'dd', { from: 'js' }, { schema, dedupeKey: 'held' });
  assert.equal(held.state, 'ready');
  const dup = await pool.query(`SELECT ${S}.add_task('dd', dedupe_key => 'held') AS id`);
  assert.equal(dup.rows[0].id, null, "NULL, as the client's enqueue answers id: null for a duplicate");
  const batch = await pool.query(`SELECT * FROM ${S}.add_tasks($1::jsonb)`, [
    JSON.stringify([
      { type: 'dd', payload: { n: 1 }, dedupe_key: 'k' },
      { type: 'dd', payload: { n: 2 }, dedupe_key: 'k' },
      { type: 'dd', payload: { n: 3 }, queue: 'other', priority: -1 },
      { type: 'dd', payload: { n: 4 }, dedupe_key: 'held' },
      { type: 'dd', payload: { n: 5 }, run_at: '2999-01-01T00:00:00Z', dedupe_key: 'later' },
      { type: 'dd', payload: { n: 6 }, queue: null, priority: null },
    ]),
  ]);
  const rows = batch.rows as { ord: number; id: string | null; state: string; duplicate_of: string | null }[];
  assert.deepEqual(
    rows.map((r) => [r.ord, r.state]),
    [
      [1, 'ready'],
      [2, 'duplicate'],
      [3, 'ready'],
      [4, 'duplicate'],
      [5, 'scheduled'],
      [6, 'ready'],
    ],
  );
  assert.equal(rows[1]!.id, null);
  assert.equal(rows[1]!.duplicate_of, rows[0]!.id, 'a duplicate inside the batch names the task that took the key');
  assert.equal(rows[3]!.duplicate_of, held.id, "a duplicate of the client's task names it");
  const js = await enqueue(pool, 'dd', {}, { schema, dedupeKey: 'k' });
  assert.deepEqual(js, { id: null, state: 'duplicate', duplicateOf: rows[0]!.id }, 'the client sees the SQL task');
  const done = await drain(['dd'], ['default', 'other']);
  // Ids are drawn lane by lane (in lock order), as for the client's enqueueMany: compare as a set.
  assert.deepEqual(done.map((d) => JSON.stringify(d.payload)).sort(), [
    '{"from":"js"}',
    '{"n":1}',
    '{"n":3}',
    '{"n":6}',
  ]);
  await pool.query(`DELETE FROM ${S}.deferred WHERE type = 'dd'`);
  await pool.query(`DELETE FROM ${S}.dedupe WHERE dedupe_key = 'later'`);
});

test('add_tasks refuses a malformed batch with 22023 naming the task and key, and writes nothing', async () => {
  const call = `SELECT * FROM ${S}.add_tasks($1::jsonb)`;
  const batch = (...tasks: unknown[]) => [JSON.stringify(tasks)];
  await refused(call, ['{"type":"a"}'], '22023', /tasks must be a JSON array of task objects \(got object\)/);
  await refused(call, batch({ type: 'a' }, 7), '22023', /task #2: must be a JSON object \(got number\)/);
  await refused(
    call,
    batch({ type: 'a', runAt: 'x' }),
    '22023',
    /task #1: unknown key "runAt"; did you mean "run_at"\?/,
  );
  await refused(call, batch({ type: 'a', priority: '1' }), '22023', /task #1: priority must be an integer \(got "1"\)/);
  await refused(call, batch({ type: 'a', priority: 1.5 }), '22023', /priority must be an integer \(got 1.5\)/);
  await refused(call, batch({ type: 'a' }, { type: 'b', priority: 99999 }), '22023', /task #2: priority must be/);
  await refused(call, batch({ type: 'a' }, { type: 7 }), '22023', /task #2: type must be a string \(got number\)/);
  await refused(call, batch({ type: 'a' }, { payload: {} }), '22023', /add_tasks: task #2: type must be a non-empty/);
  await refused(call, batch({ type: 'a', run_at: 'soon' }), '22023', /run_at must be a timestamp.*"soon"/);
  const empty = await pool.query(call, batch());
  assert.deepEqual(empty.rows, [], 'an empty batch is no task');
});

test('a producer role and a worker role may call both; a role with no grant may not', async (t) => {
  const producer = `berth_sqlenq_p_${process.pid}`;
  const worker = `berth_sqlenq_w_${process.pid}`;
  const outsider = `berth_sqlenq_x_${process.pid}`;
  const roles = [producer, worker, outsider];
  for (const r of roles) {
    await pool.query(`DROP ROLE IF EXISTS "${r}"`);
    await pool.query(`CREATE ROLE "${r}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`);
  }
  const pools: pg.Pool[] = [];
  t.after(async () => {
    await Promise.all(pools.map((p) => p.end()));
    // The grants on the schema are the roles' only objects; revoked, the roles can be dropped.
    for (const r of roles) {
      await pool.query(`DROP OWNED BY "${r}"`).catch(() => undefined);
      await pool.query(`DROP ROLE IF EXISTS "${r}"`).catch(() => undefined);
    }
  });
  await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: producer, kind: 'producer' });
  await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role: worker, kind: 'worker' });
  await pool.query(`GRANT USAGE ON SCHEMA ${S} TO "${outsider}"`);
  const as = (role: string) => {
    const p = new pg.Pool({ connectionString: urlAs(role), max: 1 });
    pools.push(p);
    return p;
  };
  const ids: string[] = [];
  for (const role of [producer, worker]) {
    const p = as(role);
    ids.push((await p.query(`SELECT ${S}.add_task('by_role', '{}') AS id`)).rows[0].id);
    const rows = await p.query(`SELECT id::text FROM ${S}.add_tasks('[{"type":"by_role"}]')`);
    ids.push(rows.rows[0].id);
  }
  const x = as(outsider);
  for (const text of [`SELECT ${S}.add_task('by_role')`, `SELECT * FROM ${S}.add_tasks('[]')`]) {
    await assert.rejects(x.query(text), (err: { code?: string }) => err.code === '42501');
  }
  await assert.rejects(
    as(producer).query(`SELECT ${S}.add_task_rows('f', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')`),
    (err: { code?: string }) => err.code === '42501',
    'the inner function is granted to no one',
  );
  const done = await drain(['by_role']);
  assert.deepEqual(
    done.map((d) => d.id),
    ids,
  );
});

for (const level of ['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE']) {
  test(`calls at ${level} enqueue tasks a worker then runs`, async () => {
    const type = `iso_${level.replace(' ', '_').toLowerCase()}`;
    const client = await pool.connect();
    try {
      await client.query(`BEGIN ISOLATION LEVEL ${level}`);
      await client.query(`SELECT ${S}.add_task($1, '{"n":1}')`, [type]);
      await client.query(`SELECT * FROM ${S}.add_tasks($1::jsonb)`, [
        JSON.stringify([
          { type, payload: { n: 2 } },
          { type, payload: { n: 3 }, queue: 'iso', priority: 2 },
        ]),
      ]);
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    const done = await drain([type], ['default', 'iso']);
    assert.deepEqual(
      done.map((d) => d.payload),
      [{ n: 1 }, { n: 2 }, { n: 3 }],
    );
  });
}

test('migration 23 gives add_task and add_tasks to every role that could run enqueue() before it', async (t) => {
  const role = `berth_sqlenq_old_${process.pid}`;
  const old = `t_sql_enqueue_pre23_${process.pid}`;
  const O = `"${old}"`;
  await pool.query(`DROP SCHEMA IF EXISTS ${O} CASCADE`);
  await pool.query(`DROP ROLE IF EXISTS "${role}"`);
  await pool.query(`CREATE ROLE "${role}" LOGIN`);
  t.after(async () => {
    await pool.query(`DROP SCHEMA IF EXISTS ${O} CASCADE`);
    await pool.query(`DROP OWNED BY "${role}"`).catch(() => undefined);
    await pool.query(`DROP ROLE IF EXISTS "${role}"`);
  });
  // The schema as migration 22 left it, with a producer's grant of that version.
  await pool.query(`CREATE SCHEMA ${O}`);
  await migrateUpTo(pool, old, 22);
  await pool.query(`GRANT USAGE ON SCHEMA ${O} TO "${role}"`);
  await pool.query(
    `GRANT EXECUTE ON FUNCTION ${O}.enqueue(text, smallint, smallint, smallint, text[], jsonb[], timestamptz[],
       integer[], text[], text) TO "${role}"`,
  );
  await migrate({ connectionString: DATABASE_URL, schema: old });
  const p = new pg.Pool({ connectionString: urlAs(role), max: 1 });
  try {
    const id = await p.query(`SELECT ${O}.add_task('old_role') AS id`);
    assert.match(String(id.rows[0].id), /^\d+$/);
    const rows = await p.query(`SELECT state FROM ${O}.add_tasks('[{"type":"old_role"}]')`);
    assert.deepEqual(rows.rows, [{ state: 'ready' }]);
  } finally {
    await p.end();
  }
});
