/**
 * A schedule's ceiling (`defineSchedule({ ceilingMs })`): it may only shorten its task type's
 * ceiling, is stored in `schedules.ceiling_ms`, and shortens the handler's deadline of the tasks
 * the schedule fires (and its triggers) from the claim's own stamp, while the lease stays the
 * type's.
 * - declaration errors name the schedule and the field (a bad value, one above the type's
 *   ceiling, a name other libraries use);
 * - the ceiling is stored, shown (getSchedule, the CLI), and a changed one is an update that
 *   leaves the watermark alone;
 * - a fired task's `ctx.deadline` is the claim's stamp minus the margin minus the difference of the
 *   two ceilings, and its handler is aborted with a DeadlineAbort there; a trigger's task too,
 *   in a running Worker that does not declare the schedule; a plain task of the type keeps the
 *   type's deadline; a shortened deadline spent before the handler starts is a late claim;
 * - the worker's cache reads a name once per TTL; a failed read is logged and the task runs
 *   under its type's deadline;
 * - migration 27 gives the new column to a worker role granted before it.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import pg from 'pg';
import {
  BerthInputError,
  createLogger,
  DeadlineAbort,
  defineSchedule,
  defineTask,
  enqueue,
  getSchedule,
  grantRuntimeRole,
  listSchedules,
  migrate,
  triggerSchedule,
  Worker,
  WORKER_DEFAULTS,
} from '../src/index.js';
import { runDueTasks } from '../src/testing-api.js';
import { MIGRATIONS } from '../src/schema/migrations.js';
import { ScheduleCeilings } from '../src/processor/schedule-ceilings.js';
import { upsertSchedules } from '../src/storage/schedules.js';
import { storageFor } from '../src/storage/storage.js';
import type { Queryable } from '../src/sql.js';
import { DATABASE_URL, freshSchema, scaled, testLogger, urlAs, waitFor } from './helpers.js';
import { runCli } from './support/run-cli.js';

const { schema, pool } = await freshSchema('sched_ceiling');
const storage = storageFor(schema);

const MARGIN = WORKER_DEFAULTS.leaseMarginMs;
const TYPE_CEILING = 60_000;
/** Short against the type's, and long enough that a loaded machine still starts the handler within it. */
const SCHEDULE_CEILING = 2_000;

/** What a handler saw: its deadline, its lease's expiry as the database stamped it, and why it ended. */
interface Seen {
  deadline: number;
  expiresAt: number;
  schedule: string | null;
  reason: unknown;
}
const seen = new Map<string, Seen>();

/** Overruns (waits for its signal, up to a generous bound) when the payload says so. */
const slow = defineTask<{ overrun: boolean }>({
  type: 'ceil_slow',
  ceilingMs: TYPE_CEILING,
  maxAttempts: 1,
  handler: async (payload, ctx) => {
    const lease = await pool.query<{ e: number }>(
      `SELECT extract(epoch FROM expires_at)::float8 * 1000 AS e FROM "${schema}".leased_entries WHERE id = $1`,
      [ctx.id],
    );
    const entry: Seen = {
      deadline: ctx.deadline.getTime(),
      expiresAt: lease.rows[0]!.e,
      schedule: ctx.schedule?.name ?? null,
      reason: null,
    };
    seen.set(ctx.id, entry);
    if (!payload.overrun) return;
    entry.reason = await new Promise<unknown>((resolve) => {
      const timer = setTimeout(() => resolve('not aborted'), scaled(30_000));
      ctx.signal.addEventListener('abort', () => {
        clearTimeout(timer);
        resolve(ctx.signal.reason);
      });
      if (ctx.signal.aborted) resolve(ctx.signal.reason);
    });
    if (entry.reason instanceof Error) throw entry.reason;
  },
});

/** The deadline the claim's stamp gives a task of `slow` under a ceiling of `ceilingMs`. */
const expected = (s: Seen, ceilingMs: number) => s.expiresAt - MARGIN - (TYPE_CEILING - ceilingMs);

/** Equal up to the ms the stamp loses as a Date (ctx.deadline is a Date: whole ms). */
function near(actual: number, want: number, what: string): void {
  assert.ok(
    Math.abs(actual - want) <= 2,
    `${what}: ${new Date(actual).toISOString()} vs ${new Date(want).toISOString()}`,
  );
}

function scheduled(name: string, over: Record<string, unknown> = {}) {
  return defineSchedule({
    name,
    cron: '* * * * *',
    task: slow,
    payload: { overrun: true },
    ceilingMs: SCHEDULE_CEILING,
    ...over,
  });
}

/** Declare as a starting worker does; a clock far in the past fires nothing. */
async function declare(...schedules: ReturnType<typeof defineSchedule>[]): Promise<void> {
  await runDueTasks(pool, [slow], { schema, schedules, now: new Date('2000-01-01T00:00:00Z') });
}

async function setWatermark(name: string, at: Date): Promise<void> {
  await pool.query(`UPDATE "${schema}".schedules SET fired_through = $2 WHERE name = $1`, [name, at]);
}

/** A pino logger whose lines the test reads back. */
function capturingLogger(): { logger: ReturnType<typeof createLogger>; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n').filter(Boolean)) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { logger: createLogger({}, stream, 'info'), lines };
}

describe('declaration', () => {
  const worker = (schedules: unknown[]) =>
    new Worker({
      connectionString: DATABASE_URL,
      schema,
      tasks: [slow],
      schedules: schedules as never,
      logger: testLogger,
    });
  const base = { name: 'ceil-decl', cron: '0 3 * * *', task: slow, payload: { overrun: false } };

  test('a bad value, or a name other libraries use, is a BerthInputError naming the schedule and the field', () => {
    for (const bad of [0, -5, 'fast', Number.NaN, 2 ** 31]) {
      assert.throws(
        () => defineSchedule({ ...base, ceilingMs: bad as number }),
        (e: unknown) =>
          e instanceof BerthInputError &&
          /^schedule "ceil-decl": ceilingMs must be a number of milliseconds from 1 to 2147483647/.test(e.message),
        `ceilingMs ${String(bad)}`,
      );
    }
    for (const key of ['timeout', 'ceiling']) {
      assert.throws(
        () => worker([{ ...base, [key]: 1000 }]),
        (e: unknown) =>
          e instanceof BerthInputError &&
          e.message.includes(`schedule "ceil-decl": unknown option "${key}"; did you mean "ceilingMs"`),
        key,
      );
    }
    // Whole milliseconds, rounded down: never longer than asked.
    assert.equal(defineSchedule({ ...base, ceilingMs: 300.9 }).ceilingMs, 300);
    assert.equal(defineSchedule(base).ceilingMs, null);
  });

  test("a ceiling above the task type's is refused where the worker's definitions are known", async () => {
    const above = defineSchedule({ ...base, ceilingMs: TYPE_CEILING + 1 });
    const refused = (e: unknown) =>
      e instanceof BerthInputError &&
      /^schedule "ceil-decl": ceilingMs 60001 is above task "ceil_slow"'s ceilingMs 60000: a schedule may only shorten/.test(
        e.message,
      ) &&
      /lease/.test(e.message);
    assert.throws(() => worker([above]), refused);
    await assert.rejects(runDueTasks(pool, [slow], { schema, schedules: [above] }), refused);
    // Equal to the type's is allowed (it shortens nothing).
    worker([defineSchedule({ ...base, ceilingMs: TYPE_CEILING })]);
  });
});

describe('stored and shown', () => {
  test('the ceiling is stored and shown; a changed one is an update that leaves the watermark alone', async () => {
    const s = scheduled('ceil-shown', { cron: '0 4 * * *' });
    await declare(s);
    assert.equal((await getSchedule(pool, schema, 'ceil-shown')).ceilingMs, SCHEDULE_CEILING);
    assert.equal((await listSchedules(pool, schema)).find((x) => x.name === 'ceil-shown')?.ceilingMs, SCHEDULE_CEILING);
    const berth = (...args: string[]) => runCli([...args, '--schema', schema, '--database-url', DATABASE_URL]);
    const shown = await berth('schedules', 'show', 'ceil-shown');
    assert.equal(shown.code, 0, shown.err);
    assert.match(shown.out, /^ceiling: 2000 ms$/m);
    assert.equal(JSON.parse((await berth('schedules', 'show', 'ceil-shown', '--json')).out).ceilingMs, 2000);
    const listed = await berth('schedules', 'list');
    assert.match(listed.out, /ceil-shown\s+0 4 \* \* \*\s+UTC\s+ceil_slow\s+2000\s+active/);

    const before = (await getSchedule(pool, schema, 'ceil-shown')).firedThrough;
    const [changed] = await upsertSchedules(
      pool,
      storage,
      [scheduled('ceil-shown', { cron: '0 4 * * *', ceilingMs: 200 })],
      [86_400_000],
      'test',
    );
    assert.deepEqual(changed, { name: 'ceil-shown', created: false, changed: true });
    const after = await getSchedule(pool, schema, 'ceil-shown');
    assert.equal(after.ceilingMs, 200);
    assert.equal(after.firedThrough.getTime(), before.getTime(), 'the watermark did not move');
    // Declared without one: the type's again.
    await upsertSchedules(
      pool,
      storage,
      [scheduled('ceil-shown', { cron: '0 4 * * *', ceilingMs: undefined })],
      [86_400_000],
      'test',
    );
    assert.equal((await getSchedule(pool, schema, 'ceil-shown')).ceilingMs, null);
    const plain = await berth('schedules', 'show', 'ceil-shown');
    assert.match(plain.out, /^ceiling: the task type's$/m);
  });
});

describe('the deadline of a schedule’s task', () => {
  test("a fired task's deadline is the claim's stamp shortened by the ceilings' difference, and it is aborted there", async () => {
    const s = scheduled('ceil-fired');
    await declare(s);
    await setWatermark('ceil-fired', new Date('2030-01-01T00:00:30Z'));
    const reports = await runDueTasks(pool, [slow], { schema, schedules: [s], now: new Date('2030-01-01T00:01:05Z') });
    const mine = reports.filter((r) => seen.get(r.id)?.schedule === 'ceil-fired');
    assert.equal(mine.length, 1);
    const r = mine[0]!;
    const run = seen.get(r.id)!;
    near(run.deadline, expected(run, SCHEDULE_CEILING), 'the deadline');
    assert.ok(run.deadline < run.expiresAt - MARGIN, "before the type's deadline");
    assert.ok(run.reason instanceof DeadlineAbort, `aborted by its deadline, not ${String(run.reason)}`);
    near(run.reason.deadline, run.deadline, "the abort's deadline");
    assert.equal(r.outcome, 'timeout');
    assert.equal(r.status, 'dead');
    assert.match(r.error ?? '', /handler deadline .* passed/);
    // The lease itself stayed the type's: the claim does not change.
    near(run.expiresAt - MARGIN - run.deadline, TYPE_CEILING - SCHEDULE_CEILING, 'the lease');
  });

  test("a trigger's task, in a running Worker that does not declare the schedule, runs under the stored ceiling", async () => {
    await declare(scheduled('ceil-trigger', { cron: '0 0 1 1 *' }));
    const w = new Worker({
      connectionString: DATABASE_URL,
      schema,
      tasks: [slow],
      logger: testLogger,
      maintenance: false,
      slots: 2,
    });
    await w.start();
    try {
      const { taskId } = await triggerSchedule(pool, schema, 'ceil-trigger');
      const run = await waitFor(
        () => (seen.get(taskId)?.reason ? seen.get(taskId) : undefined),
        30_000,
        'the run to end',
      );
      assert.equal(run.schedule, 'ceil-trigger');
      near(run.deadline, expected(run, SCHEDULE_CEILING), 'the deadline');
      assert.ok(run.deadline < run.expiresAt - MARGIN, "before the type's deadline");
      assert.ok(run.reason instanceof DeadlineAbort, `aborted by its deadline, not ${String(run.reason)}`);
    } finally {
      await w.stop();
    }
  });

  test("a plain task of the same type, and one with a dedupe key of its own, keep the type's deadline", async () => {
    const plain = (await enqueue(pool, slow, { overrun: false }, { schema })).id!;
    const keyed = (await enqueue(pool, slow, { overrun: false }, { schema, dedupeKey: 'ceil-own-key' })).id!;
    const reports = await runDueTasks(pool, [slow], { schema });
    for (const id of [plain, keyed]) {
      assert.equal(reports.find((r) => r.id === id)?.status, 'completed');
      const run = seen.get(id)!;
      assert.equal(run.schedule, null);
      near(run.deadline, run.expiresAt - MARGIN, "the type's deadline");
    }
  });

  test('a shortened deadline already spent when the handler would start is a late claim: not started, failed as a timeout', async () => {
    await declare(scheduled('ceil-spent', { cron: '0 0 1 1 *', ceilingMs: 1 }));
    const { taskId } = await triggerSchedule(pool, schema, 'ceil-spent');
    // The ceiling's read answers 50 ms late: a 1 ms ceiling from the claim's stamp is spent by then.
    const slowRead = withQuery(pool, async (text, run) => {
      if (text.includes('SELECT ceiling_ms, task_type FROM')) await new Promise((r) => setTimeout(r, 50));
      return run();
    });
    const reports = await runDueTasks(slowRead, [slow], { schema });
    const r = reports.find((x) => x.id === taskId)!;
    assert.equal(seen.has(taskId), false, 'the handler never ran');
    assert.equal(r.outcome, 'timeout');
    assert.match(r.error ?? '', /schedule "ceil-spent"'s ceiling was spent before the handler started/);
  });

  test("a failed read of the ceiling is logged with the task's fields, and the task runs under its type's deadline", async () => {
    await declare(scheduled('ceil-broken', { cron: '0 0 1 1 *', payload: { overrun: false } }));
    const { taskId } = await triggerSchedule(pool, schema, 'ceil-broken');
    const broken = withQuery(pool, async (text, run) => {
      if (text.includes('SELECT ceiling_ms, task_type FROM')) throw new Error('injected read failure');
      return run();
    });
    const { logger, lines } = capturingLogger();
    const reports = await runDueTasks(broken, [slow], { schema, logger });
    assert.equal(reports.find((x) => x.id === taskId)?.status, 'completed');
    const run = seen.get(taskId)!;
    near(run.deadline, run.expiresAt - MARGIN, "the type's deadline");
    const warn = lines.find((l) => String(l.msg).startsWith("could not read the schedule's ceiling"));
    assert.ok(warn, `a warning among ${JSON.stringify(lines.map((l) => l.msg))}`);
    assert.equal(warn.level, 40);
    assert.equal(warn.task_id, taskId);
    assert.equal(warn.task_type, 'ceil_slow');
    assert.equal(warn.attempt, 1);
    assert.equal(warn.schedule, 'ceil-broken');
    assert.match(String(warn.err), /injected read failure/);
  });
});

describe("the worker's cache", () => {
  test('one read per name per TTL, shared by concurrent asks; a failed read is not kept', async () => {
    await declare(scheduled('ceil-cached', { cron: '0 0 1 1 *' }));
    let reads = 0;
    let fail = false;
    const counting: Queryable = {
      query: ((q: pg.QueryConfig) => {
        reads++;
        return fail ? Promise.reject(new Error('down')) : pool.query(q);
      }) as Queryable['query'],
    };
    const cache = new ScheduleCeilings(counting, storage);
    const [a, b] = await Promise.all([cache.of('ceil-cached'), cache.of('ceil-cached')]);
    assert.deepEqual(a, { ceilingMs: SCHEDULE_CEILING, taskType: 'ceil_slow' });
    assert.deepEqual(b, a);
    await cache.of('ceil-cached');
    assert.equal(reads, 1);
    assert.equal(await cache.of('no-such-schedule'), null);
    assert.equal(reads, 2);

    const expiring = new ScheduleCeilings(counting, storage, 0);
    fail = true;
    await assert.rejects(expiring.of('ceil-cached'), /down/);
    fail = false;
    assert.deepEqual(await expiring.of('ceil-cached'), a);
    await expiring.of('ceil-cached');
    assert.equal(reads, 5, 'a TTL of 0 reads every time; the failed read was not kept');
  });
});

describe('migration 27', () => {
  test('a worker role granted before it may write the new column after it', async () => {
    const other = `t_ceil_mig_${process.pid}`;
    const role = `berth_ceil_w_${process.pid}`;
    await pool.query(`DROP SCHEMA IF EXISTS "${other}" CASCADE`);
    await pool.query(`DROP ROLE IF EXISTS ${role}`);
    await pool.query(`CREATE ROLE ${role} LOGIN NOSUPERUSER`);
    const asWorker = new pg.Pool({ connectionString: urlAs(role), max: 2 });
    try {
      await migrate({ connectionString: DATABASE_URL, schema: other });
      await grantRuntimeRole({ connectionString: DATABASE_URL, schema: other, role });
      // Back to a schedules table of 26, with the role as a grant of then left it, and migration
      // 27's own SQL run again (later migrations have run: migrate would not apply 27 again).
      await pool.query(`ALTER TABLE "${other}".schedules DROP COLUMN ceiling_ms`);
      const m27 = MIGRATIONS.find((m) => m.version === 27)!;
      await pool.query(m27.sql(other));
      const granted = await pool.query<{ ok: boolean }>(
        `SELECT has_column_privilege($1, $2, 'ceiling_ms', 'UPDATE') AS ok`,
        [role, `"${other}".schedules`],
      );
      assert.equal(granted.rows[0]!.ok, true);
      // The role declares (and redeclares: the UPDATE) a schedule with a ceiling.
      const s = defineSchedule({
        name: 'ceil-role',
        cron: '0 0 1 1 *',
        task: slow,
        payload: { overrun: false },
        ceilingMs: 500,
      });
      for (let i = 0; i < 2; i++)
        await runDueTasks(asWorker, [slow], { schema: other, schedules: [s], now: new Date('2000-01-01T00:00:00Z') });
      assert.equal((await getSchedule(pool, other, 'ceil-role')).ceilingMs, 500);
    } finally {
      await asWorker.end();
      await pool.query(`DROP SCHEMA IF EXISTS "${other}" CASCADE`);
      await pool.query(`DROP OWNED BY ${role}`).catch(() => undefined);
      await pool.query(`DROP ROLE IF EXISTS ${role}`);
    }
  });
});

/**
 * `pool` with its `query` passed through `wrap` (the statement's text, and the call itself):
 * one statement made slow or failing, every other one sent to the real database as it is.
 */
function withQuery(
  target: pg.Pool,
  wrap: (text: string, run: () => Promise<pg.QueryResult>) => Promise<pg.QueryResult>,
): pg.Pool {
  return new Proxy(target, {
    get(t, prop) {
      if (prop === 'query') {
        return (q: string | pg.QueryConfig, values?: unknown[]) =>
          wrap(typeof q === 'string' ? q : q.text, () =>
            typeof q === 'string' ? t.query(q, values) : t.query(q as pg.QueryConfig),
          );
      }
      const v = Reflect.get(t, prop, t) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
    },
  });
}
