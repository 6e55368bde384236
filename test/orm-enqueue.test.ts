/**
 * Enqueueing inside an ORM's transaction: Drizzle, Kysely and Knex (each on pg), through add_task()
 * with the ORM's raw SQL, berth's own `enqueue` where the ORM runs on a pg client the caller holds
 * (Drizzle), and `enqueueSql`'s call run through pg and Kysely. Committed, the task runs; rolled
 * back, neither the business row nor the task exists. These are docs/api.md's examples.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { z } from 'zod';
import { sql as dsql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import { pgSchema, serial, text } from 'drizzle-orm/pg-core';
import { CompiledQuery, type Generated, Kysely, PostgresDialect, sql as ksql } from 'kysely';
import knexFactory from 'knex';
import { BerthInputError, defineTask, defineTaskType, enqueue, enqueueSql } from '../src/index.js';
import { runDueTasks } from '../src/testing-api.js';
import { DATABASE_URL, freshSchema } from './helpers.js';

const { schema, pool } = await freshSchema('orm_enqueue');
const S = `"${schema}"`;
await pool.query(`CREATE TABLE ${S}.signups (id serial PRIMARY KEY, email text NOT NULL)`);

const ran: { type: string; payload: unknown }[] = [];
async function drain(...types: string[]): Promise<{ type: string; payload: unknown }[]> {
  ran.length = 0;
  const defs = types.map((type) =>
    defineTask({
      type,
      ceilingMs: 60_000,
      handler: async (payload: unknown) => {
        ran.push({ type, payload });
      },
    }),
  );
  const reports = await runDueTasks(pool, defs, { schema });
  for (const r of reports) assert.equal(r.status, 'completed');
  return ran.splice(0);
}

async function signups(): Promise<string[]> {
  return (await pool.query(`SELECT email FROM ${S}.signups ORDER BY id`)).rows.map((r) => r.email);
}

async function clearSignups(): Promise<void> {
  await pool.query(`TRUNCATE ${S}.signups`);
}

const rollback = new Error('rolled back on purpose');
const isRollback = (err: unknown) => err === rollback;

test('Drizzle: add_task through sql`…` and berth enqueue on the client Drizzle runs on, committed and rolled back', async () => {
  const signupsTable = pgSchema(schema).table('signups', {
    id: serial('id').primaryKey(),
    email: text('email').notNull(),
  });
  // Drizzle on a client the caller holds: its transaction runs on that client, so berth's own
  // enqueue(client, …) joins it.
  const client = await pool.connect();
  try {
    const db = drizzle({ client });
    await db.transaction(async (tx) => {
      await tx.insert(signupsTable).values({ email: 'd@example.com' });
      await tx.execute(
        dsql`SELECT ${dsql.identifier(schema)}.add_task('welcome_email', ${JSON.stringify({ email: 'd@example.com' })}::jsonb)`,
      );
      await enqueue(client, 'audit_signup', { email: 'd@example.com' }, { schema });
    });
    await assert.rejects(
      db.transaction(async (tx) => {
        await tx.insert(signupsTable).values({ email: 'gone@example.com' });
        await tx.execute(dsql`SELECT ${dsql.identifier(schema)}.add_task('welcome_email', '{}')`);
        await enqueue(client, 'audit_signup', {}, { schema });
        throw rollback;
      }),
      isRollback,
    );
  } finally {
    client.release();
  }
  assert.deepEqual(await signups(), ['d@example.com']);
  const done = await drain('welcome_email', 'audit_signup');
  assert.deepEqual(done.map((d) => d.type).sort(), ['audit_signup', 'welcome_email']);
  assert.ok(done.every((d) => JSON.stringify(d.payload) === '{"email":"d@example.com"}'));
  await clearSignups();
});

interface Database {
  signups: { id: Generated<number>; email: string };
}

test('Kysely: add_task through sql`…` and enqueueSql through CompiledQuery.raw, committed and rolled back', async () => {
  // Kysely ends its pool on destroy(): a pool of its own.
  const db = new Kysely<Database>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: DATABASE_URL, max: 2 }) }),
  });
  const welcome = defineTaskType({ type: 'welcome_email', schema: z.object({ email: z.email() }) });
  await db.transaction().execute(async (trx) => {
    await trx.withSchema(schema).insertInto('signups').values({ email: 'k@example.com' }).execute();
    await ksql`SELECT ${ksql.id(schema, 'add_task')}('welcome_email', ${JSON.stringify({ email: 'k@example.com' })}::jsonb)`.execute(
      trx,
    );
    const call = await enqueueSql(welcome, { email: 'k2@example.com' }, { schema, priority: 1 });
    const res = await trx.executeQuery<{ id: string | null }>(CompiledQuery.raw(call.text, call.values));
    assert.match(String(res.rows[0]!.id), /^\d+$/);
  });
  await assert.rejects(
    db.transaction().execute(async (trx) => {
      await trx.withSchema(schema).insertInto('signups').values({ email: 'gone@example.com' }).execute();
      await ksql`SELECT ${ksql.id(schema, 'add_task')}('welcome_email', '{}')`.execute(trx);
      const call = await enqueueSql(welcome, { email: 'gone@example.com' }, { schema });
      await trx.executeQuery(CompiledQuery.raw(call.text, call.values));
      throw rollback;
    }),
    isRollback,
  );
  await db.destroy();
  assert.deepEqual(await signups(), ['k@example.com']);
  const done = await drain('welcome_email');
  assert.deepEqual(done.map((d) => JSON.stringify(d.payload)).sort(), [
    '{"email":"k2@example.com"}',
    '{"email":"k@example.com"}',
  ]);
  await clearSignups();
});

test('Knex: add_task through trx.raw, committed and rolled back', async () => {
  const knex = knexFactory({ client: 'pg', connection: DATABASE_URL, pool: { min: 0, max: 2 } });
  try {
    await knex.transaction(async (trx) => {
      await trx.withSchema(schema).insert({ email: 'n@example.com' }).into('signups');
      const res = await trx.raw('SELECT ??.add_task(?, ?::jsonb, queue => ?) AS id', [
        schema,
        'welcome_email',
        JSON.stringify({ email: 'n@example.com' }),
        'default',
      ]);
      assert.match(String(res.rows[0].id), /^\d+$/);
    });
    await assert.rejects(
      knex.transaction(async (trx) => {
        await trx.withSchema(schema).insert({ email: 'gone@example.com' }).into('signups');
        await trx.raw('SELECT ??.add_task(?)', [schema, 'welcome_email']);
        throw rollback;
      }),
      isRollback,
    );
  } finally {
    await knex.destroy();
  }
  assert.deepEqual(await signups(), ['n@example.com']);
  const done = await drain('welcome_email');
  assert.deepEqual(
    done.map((d) => d.payload),
    [{ email: 'n@example.com' }],
  );
  await clearSignups();
});

test('enqueueSql: checked as enqueue, every option bound, run through pg', async () => {
  const report = defineTaskType({
    type: 'report',
    schema: z.object({ month: z.string().regex(/^\d{4}-\d{2}$/) }),
    queue: 'reports',
    maxAttempts: 3,
  });
  const call = await enqueueSql(
    report,
    { month: '2024-05' },
    { schema, priority: -2, dedupeKey: 'r:2024-05', shard: 7 },
  );
  assert.match(call.text, /^SELECT "t_orm_enqueue_\d+"\.add_task\(type => \$1::text/);
  assert.deepEqual(call.values, ['report', '{"month":"2024-05"}', 'reports', null, -2, 'r:2024-05', 3, null, 7, null]);
  const first = await pool.query<{ id: string | null }>(call.text, call.values);
  assert.match(String(first.rows[0]!.id), /^\d+$/);
  const again = await pool.query<{ id: string | null }>(call.text, call.values);
  assert.equal(again.rows[0]!.id, null, 'a duplicate answers NULL');
  const row = await pool.query(
    `SELECT r.queue, r.priority, r.shard, r.max_attempts, r.dedupe_key FROM ${S}.ready r WHERE r.id = $1`,
    [first.rows[0]!.id],
  );
  assert.deepEqual(row.rows, [{ queue: 'reports', priority: -2, shard: 7, max_attempts: 3, dedupe_key: 'r:2024-05' }]);

  const runAt = new Date(Date.now() + 3_600_000);
  const later = await enqueueSql('report', { month: '2024-06' }, { schema, runAt, queue: 'reports' });
  const delayed = await enqueueSql('report', { month: '2024-07' }, { schema, delay: 600_000, shards: 4 });
  const ids = [];
  for (const c of [later, delayed]) ids.push((await pool.query(c.text, c.values)).rows[0].id);
  const deferred = await pool.query(
    `SELECT id::text, run_at, queue, run_at > now() + interval '5 minutes' AS far FROM ${S}.deferred ORDER BY id`,
  );
  assert.deepEqual(
    deferred.rows.map((r) => [r.id, r.queue, r.far]),
    [
      [ids[0], 'reports', true],
      [ids[1], 'default', true],
    ],
  );
  assert.equal(deferred.rows[0].run_at.getTime(), runAt.getTime());
  await pool.query(`DELETE FROM ${S}.deferred`);

  // The same checks as enqueue: the payload's schema, every option, unknown keys.
  await assert.rejects(
    enqueueSql(report, { month: 'May' }, { schema }),
    (err) => err instanceof BerthInputError && /task \(report\)|month/.test(err.message),
  );
  await assert.rejects(
    enqueueSql('report', {}, { schema, dealy: 5 } as never),
    (err) => err instanceof BerthInputError && /unknown option "dealy"; did you mean "delay"\?/.test(err.message),
  );
  await assert.rejects(
    enqueueSql('report', {}, { priority: 40_000 }),
    (err) => err instanceof BerthInputError && /priority must be an integer from -32768 to 32767/.test(err.message),
  );
  await assert.rejects(
    enqueueSql('', {}),
    (err) => err instanceof BerthInputError && /type must be a non-empty string/.test(err.message),
  );
  await assert.rejects(
    enqueueSql('report', { s: 'a\u0000b' }),
    (err) => err instanceof BerthInputError && /NUL/.test(err.message),
  );
  const plain = await enqueueSql('report', {});
  assert.match(plain.text, /^SELECT "berth"\.add_task\(/, "the schema defaults to 'berth'");
  await drain('report');
});
