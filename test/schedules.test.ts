/**
 * Schedules (issue 31): declared in code, stored in the database, fired by the leader exactly
 * once per instant.
 * - declaration errors at `new Worker()` name the schedule and the field;
 * - `runDueTasks` fires a due schedule and runs its task, whose `ctx.schedule` names the instant;
 * - exactly once per instant is the watermark's: two concurrent fires of one instant enqueue one
 *   task, and after that task completed (its dedupe key freed) the instant is still refused;
 *   a clock jumping back and forth fires nothing twice;
 * - misfire policies skip, once and all (capped) after downtime;
 * - daylight saving in Europe/Berlin, pinned for a daily 02:30 and an hourly schedule;
 * - stale marking of schedules no live worker declares;
 * - a running Worker fires an every-second schedule on its own.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { z } from 'zod';
import {
  attemptsOf,
  BerthInputError,
  grantRuntimeRole,
  BerthMetrics,
  defineSchedule,
  defineTask,
  listAttempts,
  Worker,
  type ScheduleFire,
} from '../src/index.js';
import { runDueTasks } from '../src/testing-api.js';
import { fireDueSchedules, markStale } from '../src/maintenance/scheduler.js';
import { fireInstant } from '../src/storage/schedules.js';
import { storageFor } from '../src/storage/storage.js';
import { counterValue, DATABASE_URL, freshSchema, testLogger, urlAs, waitFor } from './helpers.js';
import { runCli } from './support/run-cli.js';
import { listAudit } from '../src/admin/audit.js';
import { loadWorkerModule } from '../src/cli/worker.js';

const { schema, pool } = await freshSchema('schedules');
const storage = storageFor(schema);

const fired: { name: string; instant: string; payload: unknown }[] = [];
const report = defineTask<{ kind: string }>({
  type: 'sched_report',
  ceilingMs: 30_000,
  handler: async (payload, ctx) => {
    const s = ctx.schedule as ScheduleFire;
    fired.push({ name: s?.name ?? '-', instant: s?.instant.toISOString() ?? '-', payload });
  },
});

function worker(schedules: unknown[], extra: Record<string, unknown> = {}) {
  return new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [report],
    schedules: schedules as never,
    logger: testLogger,
    ...extra,
  });
}

const metrics = new BerthMetrics();
const tick = (clock: Date) => fireDueSchedules(pool, storage, { metrics, logger: testLogger, clock: () => clock });

/** Put a schedule's watermark where a test wants it (the schema owner's UPDATE). */
async function setWatermark(name: string, at: Date): Promise<void> {
  await pool.query(`UPDATE "${schema}".schedules SET fired_through = $2 WHERE name = $1`, [name, at]);
}

async function firesOf(name: string): Promise<string[]> {
  const r = await pool.query<{ instant: Date }>(
    `SELECT instant FROM "${schema}".schedule_fires WHERE schedule = $1 AND kind = 'cron' ORDER BY instant`,
    [name],
  );
  return r.rows.map((x) => x.instant.toISOString());
}

async function declare(...schedules: ReturnType<typeof defineSchedule>[]): Promise<void> {
  // runDueTasks declares as a starting worker does; the clock far in the past fires nothing.
  await runDueTasks(pool, [report], { schema, schedules, now: new Date('2000-01-01T00:00:00Z') });
}

describe('declaration', () => {
  test('a bad expression, time zone, task type or option is a BerthInputError naming the schedule and field', () => {
    const base = { name: 'nightly', cron: '0 3 * * *', task: report, payload: { kind: 'x' } };
    const refused = (over: Record<string, unknown>, pattern: RegExp) =>
      assert.throws(
        () => worker([{ ...base, ...over }]),
        (e: unknown) => e instanceof BerthInputError && pattern.test(e.message),
      );
    refused({ cron: '61 * * * *' }, /schedule "nightly": cron "61 \* \* \* \*" is not a valid expression/);
    refused({ cron: '* * *' }, /schedule "nightly": cron/);
    refused({ timeZone: 'Mars/Olympus' }, /schedule "nightly": timeZone "Mars\/Olympus"/);
    refused(
      { task: 'no_such_type' },
      /schedule "nightly": task "no_such_type" is not one of this worker's task definitions/,
    );
    refused({ tz: 'UTC' }, /schedule "nightly": unknown option "tz"; did you mean "timeZone"/);
    refused({ misfire: 'sometimes' }, /schedule "nightly": misfire must be one of skip, once, all/);
    refused({ misfireCap: 0 }, /schedule "nightly": misfireCap must be an integer from 1 to 1000/);
    refused({ name: 'no spaces' }, /name must be/);
    assert.throws(() => worker([base, base]), /schedule "nightly" is declared twice/);
    assert.throws(() => worker([base], { heartbeatIntervalMs: false }), /schedules need the heartbeat/);
    // The typed helper refuses at once, before any worker.
    assert.throws(
      () => defineSchedule({ name: 'typed', cron: 'every day', task: report, payload: { kind: 'x' } }),
      /schedule "typed": cron "every day"/,
    );
    const typed = defineSchedule({
      name: 'typed',
      cron: '0 3 * * *',
      timeZone: 'Europe/Berlin',
      task: report,
      payload: { kind: 'x' },
    });
    assert.equal(typed.taskType, 'sched_report');
    assert.equal(typed.timeZone, 'Europe/Berlin');
  });

  test('a payload the task definition refuses is refused at new Worker()', () => {
    const checked = defineTask<{ n: number }>({
      type: 'sched_checked',
      ceilingMs: 1000,
      schema: z.object({ n: z.number() }),
      handler: async () => {},
    });
    assert.throws(
      () =>
        new Worker({
          connectionString: DATABASE_URL,
          schema,
          tasks: [checked],
          schedules: [{ name: 'bad-payload', cron: '* * * * *', task: 'sched_checked', payload: { n: 'x' } } as never],
          logger: testLogger,
        }),
      /schedule "bad-payload": payload: .*payload for task type "sched_checked" is invalid: n: /,
    );
  });
});

describe('firing', () => {
  test('runDueTasks fires a due instant and runs its task; ctx.schedule names the instant; the same instant never fires again', async () => {
    const every = defineSchedule({
      name: 'rd-minutely',
      cron: '* * * * *',
      task: report,
      payload: { kind: 'minutely' },
    });
    await declare(every);
    await setWatermark('rd-minutely', new Date('2030-01-01T00:00:30Z'));
    fired.length = 0;
    const reports = await runDueTasks(pool, [report], {
      schema,
      schedules: [every],
      now: new Date('2030-01-01T00:01:05Z'),
    });
    assert.deepEqual(
      reports.map((r) => r.status),
      ['completed'],
    );
    assert.deepEqual(fired, [
      { name: 'rd-minutely', instant: '2030-01-01T00:01:00.000Z', payload: { kind: 'minutely' } },
    ]);
    // An ordinary task: its attempt history names the schedule.
    const attempts = await attemptsOf(pool, schema, reports[0]!.id);
    assert.deepEqual(
      attempts.map((a) => [a.outcome, a.schedule]),
      [['success', 'rd-minutely']],
    );
    const listed = await listAttempts(pool, schema, { type: 'sched_report' });
    assert.ok(listed.attempts.some((a) => a.id === reports[0]!.id && a.schedule === 'rd-minutely'));
    // The task completed and freed its dedupe key; the watermark still refuses the instant.
    const again = await runDueTasks(pool, [report], {
      schema,
      schedules: [every],
      now: new Date('2030-01-01T00:01:05Z'),
    });
    assert.deepEqual(again, []);
    const client = await pool.connect();
    try {
      const r = await fireInstant(client, storage, {
        name: 'rd-minutely',
        instant: new Date('2030-01-01T00:01:00Z'),
        through: new Date('2030-01-01T00:01:00Z'),
        lateMs: 0,
      });
      assert.deepEqual(r, { kind: 'refused' });
    } finally {
      client.release();
    }
  });

  test('two fires of one instant at once (two leaders, two fleets) enqueue one task', async () => {
    const s = defineSchedule({ name: 'race', cron: '*/5 * * * * *', task: report, payload: { kind: 'race' } });
    await declare(s);
    await setWatermark('race', new Date('2030-01-02T00:00:00Z'));
    const instant = new Date('2030-01-02T00:00:05Z');
    const other = new pg.Pool({ connectionString: DATABASE_URL, max: 4 });
    try {
      const fire = async (p: pg.Pool) => {
        const c = await p.connect();
        try {
          return await fireInstant(c, storage, { name: 'race', instant, through: instant, lateMs: 0 });
        } finally {
          c.release();
        }
      };
      const results = await Promise.all([fire(pool), fire(other), fire(pool), fire(other)]);
      assert.equal(results.filter((r) => r.kind === 'fired').length, 1);
      assert.equal(results.filter((r) => r.kind === 'refused').length, 3);
      assert.deepEqual(await firesOf('race'), [instant.toISOString()]);
    } finally {
      await other.end();
    }
  });

  test('a clock that jumps forward and back fires each instant once', async () => {
    const s = defineSchedule({ name: 'jumpy', cron: '* * * * * *', task: report, payload: { kind: 'jumpy' } });
    await declare(s);
    const t0 = Date.parse('2030-01-03T00:00:00Z');
    await setWatermark('jumpy', new Date(t0));
    const at = (sec: number) => new Date(t0 + sec * 1000);
    await tick(at(3)); // 1, 2, 3
    await tick(at(1.5)); // the clock went back: nothing is due past the watermark
    await tick(at(3.5));
    await tick(at(5)); // 4, 5
    await tick(at(2)); // back again
    assert.deepEqual(
      await firesOf('jumpy'),
      [1, 2, 3, 4, 5].map((n) => at(n).toISOString()),
    );
    // The leader's gauges: the interval, and the last fire (the last tick fired nothing: the
    // row's last commit, on the database's clock).
    assert.equal(await counterValue(metrics, 'berth_schedule_interval_seconds', { schedule: 'jumpy' }), 1);
    const lastFire = await counterValue(metrics, 'berth_schedule_last_fire_timestamp_seconds', { schedule: 'jumpy' });
    assert.ok(Math.abs(lastFire - Date.now() / 1000) < 600, `last fire ${lastFire}`);
    const tasks = await pool.query(
      `SELECT count(*)::int AS n FROM "${schema}".ready WHERE dedupe_key LIKE 'berth-schedule:jumpy@%'`,
    );
    assert.equal(tasks.rows[0].n, 5);
  });
});

describe('misfire policies', () => {
  const t0 = Date.parse('2030-02-01T00:00:00Z');
  const min = (n: number) => new Date(t0 + n * 60_000);
  test('skip: the missed instants are skipped and counted; the on-time one fires', async () => {
    const s = defineSchedule({ name: 'mf-skip', cron: '* * * * *', task: report, payload: { kind: 's' } });
    await declare(s);
    await setWatermark('mf-skip', min(0));
    // Down from minute 0 to 10:00.5: instants 1..9 are past the 60 s grace, 10 is on time.
    const r = await tick(new Date(min(10).getTime() + 500));
    assert.deepEqual(await firesOf('mf-skip'), [min(10).toISOString()]);
    assert.equal(r.misses['mf-skip'], 9);
    assert.equal(await counterValue(metrics, 'berth_schedule_misses_total', { schedule: 'mf-skip' }), 9);
    assert.equal(await counterValue(metrics, 'berth_schedule_fires_total', { schedule: 'mf-skip', kind: 'cron' }), 1);
    assert.equal(await counterValue(metrics, 'berth_schedule_lateness_seconds_count', { schedule: 'mf-skip' }), 1);
  });

  test('once: one task for all missed instants, standing for the latest', async () => {
    const s = defineSchedule({
      name: 'mf-once',
      cron: '* * * * *',
      task: report,
      payload: { kind: 'o' },
      misfire: 'once',
    });
    await declare(s);
    await setWatermark('mf-once', min(0));
    const r = await tick(new Date(min(10).getTime() + 500));
    assert.deepEqual(await firesOf('mf-once'), [min(9).toISOString(), min(10).toISOString()]);
    assert.equal(r.misses['mf-once'], 8);
    assert.deepEqual(
      r.fires.map((f) => f.kind),
      ['missed', 'cron'],
    );
  });

  test('all: every missed instant up to the cap (the latest ones), in order', async () => {
    const s = defineSchedule({
      name: 'mf-all',
      cron: '* * * * *',
      task: report,
      payload: { kind: 'a' },
      misfire: 'all',
      misfireCap: 3,
    });
    await declare(s);
    await setWatermark('mf-all', min(0));
    const r = await tick(new Date(min(10).getTime() + 500));
    assert.deepEqual(
      await firesOf('mf-all'),
      [7, 8, 9, 10].map((n) => min(n).toISOString()),
    );
    assert.equal(r.misses['mf-all'], 6);
  });
});

describe('daylight saving (Europe/Berlin, croner)', () => {
  /** Tick a schedule minute by minute through [from, to] and return the instants it fired. */
  async function walk(name: string, cron: string, from: string, to: string): Promise<string[]> {
    const s = defineSchedule({ name, cron, timeZone: 'Europe/Berlin', task: report, payload: { kind: name } });
    await declare(s);
    await setWatermark(name, new Date(from));
    for (let t = Date.parse(from); t <= Date.parse(to); t += 10 * 60_000) await tick(new Date(t));
    return firesOf(name);
  }

  test('spring (29 March 2026, 02:00 -> 03:00): daily 02:30 runs once, at 03:00 CEST; hourly skips no real hour', async () => {
    // 02:30 does not exist that day: croner runs a fixed-time job at the first valid time after the gap.
    assert.deepEqual(await walk('dst-spring-daily', '30 2 * * *', '2026-03-28T12:00:00Z', '2026-03-30T12:00:00Z'), [
      '2026-03-29T01:00:00.000Z', // 03:00 CEST
      '2026-03-30T00:30:00.000Z', // 02:30 CEST
    ]);
    // Hourly: 01:00 CET then 03:00 CEST, an hour apart in real time; there is no 02:00.
    assert.deepEqual(await walk('dst-spring-hourly', '0 * * * *', '2026-03-28T23:30:00Z', '2026-03-29T02:30:00Z'), [
      '2026-03-29T00:00:00.000Z', // 01:00 CET
      '2026-03-29T01:00:00.000Z', // 03:00 CEST
      '2026-03-29T02:00:00.000Z', // 04:00 CEST
    ]);
  });

  test('autumn (25 October 2026, 03:00 -> 02:00): daily 02:30 runs once, the first time; hourly runs both 02:00s', async () => {
    assert.deepEqual(await walk('dst-autumn-daily', '30 2 * * *', '2026-10-24T12:00:00Z', '2026-10-26T12:00:00Z'), [
      '2026-10-25T00:30:00.000Z', // 02:30 CEST, the first of the two
      '2026-10-26T01:30:00.000Z', // 02:30 CET
    ]);
    assert.deepEqual(await walk('dst-autumn-hourly', '0 * * * *', '2026-10-24T23:30:00Z', '2026-10-25T02:30:00Z'), [
      '2026-10-25T00:00:00.000Z', // 02:00 CEST
      '2026-10-25T01:00:00.000Z', // 02:00 CET, the repeated hour
      '2026-10-25T02:00:00.000Z', // 03:00 CET
    ]);
  });
});

describe('stale schedules', () => {
  test('a schedule no live worker declares is marked stale and not fired; declaring it again clears the mark', async () => {
    const s = defineSchedule({ name: 'orphan', cron: '* * * * * *', task: report, payload: { kind: 'orphan' } });
    await declare(s);
    // Declared long ago, by no live worker.
    await pool.query(`UPDATE "${schema}".schedules SET declared_at = now() - interval '1 hour' WHERE name = 'orphan'`);
    const r = await markStale(pool, storage, testLogger);
    assert.ok(r.marked.includes('orphan'));
    await setWatermark('orphan', new Date('2030-03-01T00:00:00Z'));
    await tick(new Date('2030-03-01T00:00:05Z'));
    assert.deepEqual(await firesOf('orphan'), []);
    const row = await pool.query(
      `SELECT stale, stale_since IS NOT NULL AS since FROM "${schema}".schedules WHERE name = 'orphan'`,
    );
    assert.deepEqual(row.rows[0], { stale: true, since: true });
    await declare(s);
    const back = await pool.query(`SELECT stale FROM "${schema}".schedules WHERE name = 'orphan'`);
    assert.equal(back.rows[0].stale, false);
  });

  test('a worker is live for three of its own heartbeat intervals: one beating every minute keeps its schedules', async () => {
    const s = defineSchedule({ name: 'slow-beat', cron: '0 0 1 1 *', task: report, payload: { kind: 'slow' } });
    await declare(s);
    await pool.query(
      `UPDATE "${schema}".schedules SET declared_at = now() - interval '1 hour' WHERE name = 'slow-beat'`,
    );
    const beat = (ago: string) =>
      pool.query(
        `INSERT INTO "${schema}".workers (worker_id, host, pid, queues, slots, busy, prefetched, leader, started_at,
                                         last_seen_at, schedules, heartbeat_ms)
         VALUES ('slow-worker', 'h', 1, NULL, 1, 0, 0, false, now() - interval '1 hour', now() - $1::interval,
                 ARRAY['slow-beat'], 60000)
         ON CONFLICT (worker_id) DO UPDATE SET last_seen_at = excluded.last_seen_at`,
        [ago],
      );
    await beat('45 seconds');
    assert.ok(!(await markStale(pool, storage, testLogger)).marked.includes('slow-beat'), 'live: 45 s < 3 × 60 s');
    await beat('4 minutes');
    assert.ok((await markStale(pool, storage, testLogger)).marked.includes('slow-beat'), 'gone: 4 min > 3 × 60 s');
    await pool.query(`DELETE FROM "${schema}".workers WHERE worker_id = 'slow-worker'`);
  });

  test('a running worker that declares a schedule keeps it from being marked', async () => {
    const s = defineSchedule({ name: 'kept', cron: '0 0 1 1 *', task: report, payload: { kind: 'kept' } });
    const w = worker([s], { maintenance: false, slots: 1 });
    await w.start();
    try {
      await pool.query(`UPDATE "${schema}".schedules SET declared_at = now() - interval '1 hour' WHERE name = 'kept'`);
      await waitFor(async () => {
        const x = await pool.query(`SELECT schedules FROM "${schema}".workers WHERE worker_id = $1`, [w.id]);
        return x.rows[0]?.schedules?.includes('kept');
      });
      const r = await markStale(pool, storage, testLogger);
      assert.ok(!r.marked.includes('kept'));
    } finally {
      await w.stop();
    }
    // Its worker stopped cleanly (its row removed): now no live worker declares it.
    const r = await markStale(pool, storage, testLogger);
    assert.ok(r.marked.includes('kept'));
  });
});

describe('a running worker', () => {
  test('its leader fires by the scheduleClock it is given (here a clock running 120 times fast)', async () => {
    fired.length = 0;
    const start = Date.now();
    const clock = () => new Date(start + (Date.now() - start) * 120);
    const s = defineSchedule({
      name: 'fast-clock',
      cron: '* * * * *',
      task: report,
      payload: { kind: 'fast' },
      misfireGraceMs: 3600_000,
    });
    const w = worker([s], { slots: 2, scheduleClock: clock, maintenance: { scheduleTickMs: 100 } });
    await w.start();
    try {
      await waitFor(() => fired.filter((f) => f.name === 'fast-clock').length >= 3, 30_000, 'three minutely fires');
    } finally {
      await w.stop();
    }
    const instants = fired.filter((f) => f.name === 'fast-clock').map((f) => f.instant);
    assert.equal(new Set(instants).size, instants.length, 'no instant ran twice');
    for (const i of instants) assert.match(i, /:00\.000Z$/, 'whole minutes, on the given clock');
  });

  test('its leader fires an every-second schedule and its tasks run, once per instant', async () => {
    fired.length = 0;
    const s = defineSchedule({ name: 'live-second', cron: '* * * * * *', task: report, payload: { kind: 'live' } });
    const w = worker([s], { slots: 2, maintenance: { scheduleTickMs: 200 } });
    await w.start();
    try {
      await waitFor(() => fired.filter((f) => f.name === 'live-second').length >= 3, 30_000, 'three fires');
    } finally {
      await w.stop();
    }
    const instants = fired.filter((f) => f.name === 'live-second').map((f) => f.instant);
    assert.equal(new Set(instants).size, instants.length, 'no instant ran twice');
    for (const i of instants) assert.ok(i.endsWith(':00.000Z') || /\.000Z$/.test(i));
  });
});

describe('berth schedules', () => {
  test("berth worker --tasks takes the module's schedules export with its tasks", async () => {
    const m = await loadWorkerModule(new URL('./fixtures/schedule-tasks.ts', import.meta.url).pathname);
    assert.deepEqual(
      m.tasks.map((t) => t.type),
      ['fixture_cleanup'],
    );
    assert.deepEqual(
      m.schedules.map((x) => (x as { name: string }).name),
      ['fixture-nightly'],
    );
  });

  const berth = (...args: string[]) => runCli([...args, '--schema', schema, '--database-url', DATABASE_URL]);

  test('list, show, pause, resume and trigger, audited; the pause survives a redeclaration', async () => {
    const s = defineSchedule({
      name: 'ops',
      cron: '0 4 * * *',
      timeZone: 'Europe/Berlin',
      task: report,
      payload: { kind: 'ops' },
    });
    await declare(s);
    const listed = await berth('schedules', 'list');
    assert.equal(listed.code, 0, listed.err);
    assert.match(listed.out, /ops\s+0 4 \* \* \*\s+Europe\/Berlin\s+sched_report\s+-\s+active\s+\d{4}-/);
    const json = JSON.parse((await berth('schedules', 'show', 'ops', '--json')).out);
    assert.equal(json.name, 'ops');
    assert.equal(json.paused, false);
    assert.ok(new Date(json.nextFireAt).getTime() > Date.now());

    const paused = await berth('schedules', 'pause', 'ops');
    assert.equal(paused.code, 0, paused.err);
    assert.match(paused.out, /schedule "ops" paused/);
    // A worker starting with the same declaration leaves the operator's pause alone.
    await declare(s);
    const shown = await berth('schedules', 'show', 'ops');
    assert.match(shown.out, /schedule ops: paused/);
    assert.match(shown.out, /next fire: -/);
    // Paused: the leader does not fire it.
    await setWatermark('ops', new Date('2030-04-01T00:00:00Z'));
    await tick(new Date('2030-04-01T02:00:30Z'));
    assert.deepEqual(await firesOf('ops'), []);

    const triggered = await berth('schedules', 'trigger', 'ops', '--json');
    assert.equal(triggered.code, 0, triggered.err);
    const { taskId } = JSON.parse(triggered.out);
    fired.length = 0;
    // (Run with the other tests' fired tasks still queued: only this one matters here.)
    const ran = await runDueTasks(pool, [report], { schema });
    assert.equal(ran.find((r) => r.id === taskId)?.status, 'completed');
    assert.ok(fired.some((f) => f.name === 'ops' && f.payload !== null));
    // The trigger did not move the schedule.
    const after = JSON.parse((await berth('schedules', 'show', 'ops', '--json')).out);
    assert.equal(after.lastInstant, null);
    assert.equal(after.firedThrough, '2030-04-01T00:00:00.000Z');

    const resumed = await berth('schedules', 'resume', 'ops');
    assert.match(resumed.out, /schedule "ops" resumed/);
    const active = JSON.parse((await berth('schedules', 'show', 'ops', '--json')).out);
    assert.equal(active.paused, false);
    // Resumed: the instants that passed while it was paused are not owed.
    assert.ok(new Date(active.firedThrough).getTime() >= Date.now() - 60_000);

    const audit = await listAudit(pool, schema);
    assert.deepEqual(
      audit
        .filter((a) => a.action.startsWith('schedule.'))
        .map((a) => a.action)
        .reverse(),
      ['schedule.pause', 'schedule.trigger', 'schedule.resume'],
    );
    const missing = await berth('schedules', 'pause', 'nope');
    assert.notEqual(missing.code, 0);
    assert.match(missing.err, /no schedule named "nope"/);
  });
});

describe('a worker role', () => {
  test('declares, fires, marks stale and reads attempts with the worker grants alone; it may not pause', async () => {
    const role = `berth_sched_w_${process.pid}`;
    await pool.query(`DROP ROLE IF EXISTS ${role}`);
    await pool.query(`CREATE ROLE ${role} LOGIN NOSUPERUSER`);
    const asWorker = new pg.Pool({ connectionString: urlAs(role), max: 3 });
    try {
      await grantRuntimeRole({ connectionString: DATABASE_URL, schema, role });
      const s = defineSchedule({ name: 'as-worker', cron: '* * * * *', task: report, payload: { kind: 'w' } });
      await runDueTasks(asWorker, [report], { schema, schedules: [s], now: new Date('2000-01-01T00:00:00Z') });
      await setWatermark('as-worker', new Date('2030-05-01T00:00:30Z'));
      const runs = await runDueTasks(asWorker, [report], {
        schema,
        schedules: [s],
        now: new Date('2030-05-01T00:01:01Z'),
      });
      const mine = runs.filter((r) => (r.payload as { kind?: string }).kind === 'w');
      assert.deepEqual(
        mine.map((r) => r.status),
        ['completed'],
      );
      assert.equal((await attemptsOf(asWorker, schema, mine[0]!.id))[0]?.schedule, 'as-worker');
      await markStale(asWorker, storageFor(schema), testLogger);
      await assert.rejects(
        asWorker.query(`UPDATE "${schema}".schedules SET paused = true WHERE name = 'as-worker'`),
        /permission denied/,
      );
    } finally {
      await asWorker.end();
      await pool.query(`DROP OWNED BY ${role}`).catch(() => undefined);
      await pool.query(`DROP ROLE IF EXISTS ${role}`);
    }
  });
});
