/**
 * The leader's gauges of queue limits (berth_queue_limit_*), and starvation that is not a limit:
 * berth_task_oldest_due_seconds leaves out the due work of a queue at its limit right now
 * (running at its max, or its rate's starts used up), and still counts a limited queue below its
 * limits. A cleared limit's series disappear.
 */
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { BerthMetrics, clearQueueLimit, defineTask, enqueueMany, setQueueLimit } from '../src/index.js';
import { promoteDue, readGauges } from '../src/maintenance-api.js';
import { publishGauges, resetGauges } from '../src/maintenance/gauges.js';
import { claim } from '../src/processor/claim.js';
import { runDueTasks } from '../src/testing-api.js';
import { claimParams } from './claim-params.js';
import pg from 'pg';
import { DATABASE_URL, freshSchema } from './helpers.js';

const { schema, pool } = await freshSchema('limitgauges');
const S = `"${schema}"`;

const work = defineTask<{ i: number }>({ type: 'lim_gauge', ceilingMs: 60_000, handler: async () => {} });

/** `n` tasks of `queue` due ten minutes ago, promoted into the ready ring as the leader would. */
async function dueWork(queue: string, n: number): Promise<void> {
  const runAt = new Date(Date.now() - 600_000);
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: work, payload: { i }, queue, runAt })),
    { schema },
  );
  await promoteDue(pool, schema);
}

/**
 * The gauges now, with `queue` held by its limit: left out of oldest due (nothing else is due
 * here), its row as expected, and its held tasks exported. Answers what was exported.
 */
async function assertHeld(queue: string, row: { running: number; started: number; held: number }): Promise<string> {
  const g = await readGauges(pool, schema);
  assert.equal(g.oldestDueSeconds, 0, `${queue} is left out of oldest due`);
  assert.deepEqual(
    g.limits.map((l) => ({
      queue: l.queue,
      running: l.running,
      started: l.started,
      atLimit: l.atLimit,
      held: l.heldTasks,
    })),
    [{ queue, ...row, atLimit: true }],
  );
  const text = await exported();
  assert.match(text, new RegExp(`^berth_queue_limit_held_tasks\\{queue="${queue}"\\} ${row.held}$`, 'm'));
  assert.match(text, /^berth_task_oldest_due_seconds 0$/m);
  return text;
}

async function exported(): Promise<string> {
  const m = new BerthMetrics();
  publishGauges(m, await readGauges(pool, schema));
  return (await m.registry.metrics())
    .split('\n')
    .filter((l) => l.startsWith('berth_queue_limit_') || l.startsWith('berth_task_oldest_due_seconds'))
    .join('\n');
}

test('a queue at its running limit is held, not starved: left out of oldest due, counted by held_tasks; below it, counted again', async () => {
  await dueWork('held', 3);
  const lane = (await pool.query(`SELECT lane_id FROM ${S}.lanes WHERE queue = 'held'`)).rows[0].lane_id;
  assert.equal((await claim(pool, claimParams(schema, [lane], 1))).length, 1);
  // Without a limit, two tasks due ten minutes ago with nobody claiming them: starvation.
  assert.ok((await readGauges(pool, schema)).oldestDueSeconds >= 590);

  // The running task counts against the new limit of 1: the queue is at it.
  await setQueueLimit(pool, schema, 'held', { maxRunning: 1 }, 'test');
  const text = await assertHeld('held', { running: 1, started: 0, held: 2 });
  assert.match(text, /^berth_queue_limit_max_running\{queue="held"\} 1$/m);
  assert.match(text, /^berth_queue_limit_running\{queue="held"\} 1$/m);
  assert.doesNotMatch(text, /berth_queue_limit_rate/, 'no rate series without a rate limit');

  // Below its limit (2 allowed, 1 running) its waiting work is starvation again.
  await setQueueLimit(pool, schema, 'held', { maxRunning: 2 }, 'test');
  const below = await readGauges(pool, schema);
  assert.ok(below.oldestDueSeconds >= 590, `oldest due ${below.oldestDueSeconds}`);
  assert.deepEqual(
    below.limits.map((l) => [l.queue, l.atLimit, l.heldTasks]),
    [['held', false, 0]],
  );
  assert.match(await exported(), /^berth_queue_limit_held_tasks\{queue="held"\} 0$/m);
  await clearQueueLimit(pool, schema, 'held', 'test');
  await pool.query(`TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred`);
});

test("a queue whose rate's starts are used up is held; the rate series are exported; a cleared limit's series disappear", async () => {
  await dueWork('metered', 3);
  await setQueueLimit(pool, schema, 'metered', { rate: { limit: 1, intervalMs: 3_600_000 } }, 'test');
  // One start uses up the hour's rate: the other two wait for it.
  const ran = await runDueTasks(pool, [work], { schema, queues: ['metered'] });
  assert.equal(ran.length, 1);
  const text = await assertHeld('metered', { running: 0, started: 1, held: 2 });
  assert.match(text, /^berth_queue_limit_rate\{queue="metered"\} 1$/m);
  assert.match(text, /^berth_queue_limit_rate_interval_seconds\{queue="metered"\} 3600$/m);
  assert.match(text, /^berth_queue_limit_rate_starts\{queue="metered"\} 1$/m);
  assert.match(text, /^berth_queue_limit_running\{queue="metered"\} 0$/m);
  assert.doesNotMatch(text, /berth_queue_limit_max_running\{/, 'no max series without a running limit');

  // The same registry across two gauge runs, as the leader keeps it: the cleared queue's series go.
  const m = new BerthMetrics();
  publishGauges(m, await readGauges(pool, schema));
  assert.match(await m.registry.metrics(), /berth_queue_limit_rate\{queue="metered"\}/);
  await clearQueueLimit(pool, schema, 'metered', 'test');
  const cleared = await readGauges(pool, schema);
  assert.ok(cleared.oldestDueSeconds >= 590, 'no limit: its waiting work is starvation');
  publishGauges(m, cleared);
  assert.doesNotMatch(await m.registry.metrics(), /^berth_queue_limit_\w+\{/m);

  // A leader that steps down drops them too.
  await setQueueLimit(pool, schema, 'metered', { maxRunning: 4 }, 'test');
  publishGauges(m, await readGauges(pool, schema));
  assert.match(await m.registry.metrics(), /^berth_queue_limit_max_running\{queue="metered"\} 4$/m);
  resetGauges(m);
  assert.doesNotMatch(await m.registry.metrics(), /^berth_queue_limit_\w+\{/m);
  await clearQueueLimit(pool, schema, 'metered', 'test');
});

/**
 * A pool of its own, as the leader's, whose sessions record each statement's text and the most
 * statements in flight at once across them: readGauges takes the leader's paths on it (its ring
 * reads check a client out for their transaction, as on any pool).
 */
function recording(): { pool: pg.Pool; texts: string[]; mostAtOnce: () => number } {
  const texts: string[] = [];
  let inFlight = 0;
  let most = 0;
  const query = pg.Client.prototype.query as (this: pg.Client, ...args: unknown[]) => unknown;
  class RecordingClient extends pg.Client {}
  // pg's pool calls it with a callback, readGauges's clients without: both are counted.
  RecordingClient.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    const config = args[0] as string | { text: string };
    texts.push(typeof config === 'string' ? config : config.text);
    most = Math.max(most, ++inFlight);
    const last = args.length - 1;
    const callback = args[last];
    if (typeof callback === 'function') {
      args[last] = (...result: unknown[]) => {
        inFlight--;
        return (callback as (...r: unknown[]) => unknown)(...result);
      };
      return query.apply(this, args);
    }
    return (query.apply(this, args) as Promise<unknown>).finally(() => inFlight--);
  } as typeof pg.Client.prototype.query;
  const recorded = new pg.Pool({
    connectionString: DATABASE_URL,
    max: 4,
    options: '-c jit=off',
    Client: RecordingClient,
  });
  after(() => recorded.end());
  return { pool: recorded, texts, mostAtOnce: () => most };
}

test("the gauges read one statement at a time, and count a limited queue's waiting tasks only while it is at its limit", async () => {
  await dueWork('capped', 2);
  await dueWork('roomy', 2);
  const laneOf = async (queue: string): Promise<number> =>
    (await pool.query(`SELECT lane_id FROM ${S}.lanes WHERE queue = $1`, [queue])).rows[0].lane_id;
  assert.equal((await claim(pool, claimParams(schema, [await laneOf('capped')], 1))).length, 1);
  await setQueueLimit(pool, schema, 'capped', { maxRunning: 1 }, 'test');
  await setQueueLimit(pool, schema, 'roomy', { maxRunning: 5 }, 'test');
  const countsWaiting = (t: string) => /\bsum\(/.test(t) && /\blanes l\b/.test(t);

  const both = recording();
  const g = await readGauges(both.pool, schema);
  assert.deepEqual(
    g.limits.map((l) => [l.queue, l.atLimit, l.running, l.heldTasks]),
    [
      ['capped', true, 1, 1],
      ['roomy', false, 0, 0],
    ],
  );
  assert.equal(both.texts.filter(countsWaiting).length, 1, 'one waiting count, for the queue at its limit');
  assert.equal(both.mostAtOnce(), 1, 'never two statements at once (each would take a session of its own)');

  // No queue at a limit: the waiting count, planned over every ring partition, is not run.
  await setQueueLimit(pool, schema, 'capped', { maxRunning: 3 }, 'test');
  const none = recording();
  const below = await readGauges(none.pool, schema);
  assert.deepEqual(
    below.limits.map((l) => [l.queue, l.atLimit, l.heldTasks]),
    [
      ['capped', false, 0],
      ['roomy', false, 0],
    ],
  );
  assert.equal(none.texts.filter(countsWaiting).length, 0);
  assert.equal(none.mostAtOnce(), 1);
  await clearQueueLimit(pool, schema, 'capped', 'test');
  await clearQueueLimit(pool, schema, 'roomy', 'test');
  await pool.query(`TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred`);
});
