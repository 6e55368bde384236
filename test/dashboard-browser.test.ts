import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser, type Page } from 'playwright-core';
import {
  attemptsOf,
  defineSchedule,
  defineTask,
  enqueue,
  enqueueMany,
  getTask,
  listKeyLimits,
  listQueueLimits,
  listTypeLimits,
  pauseQueue,
  resumeQueue,
  setTypeLimitAudited,
  Worker,
} from '../src/index.js';
import { startDashboard } from '../src/dashboard/index.js';
import { DATABASE_URL, freshSchema, scaled, testLogger, waitFor } from './helpers.js';

/**
 * The dashboard in a real browser against a real worker. Needs Chromium at /usr/bin/chromium
 * (`apt-get install chromium`; scripts/test-prereqs.sh installs it): without it these tests fail.
 * The overview screenshot goes to docs/dashboard.png with BERTH_UPDATE_SCREENSHOT=1, else to a
 * temporary file (so a test run leaves the tree clean).
 */
const CHROMIUM = '/usr/bin/chromium';
/** Browser-side waits (playwright's own timeouts) are scaled here; waitFor scales its own. */
const WAIT = 30_000;
const LONG = scaled(WAIT);

const { schema, pool } = await freshSchema('dashbrowser');
const S = `"${schema}"`;

const gate = { failInvoices: true };
const ran = new Map<string, number>();
function record(id: string): void {
  ran.set(id, (ran.get(id) ?? 0) + 1);
}
/** `slow.job` handlers wait for `hold.release()` (a fresh hold each time `hold.arm()` is called). */
const hold = {
  released: Promise.resolve(),
  release: () => {},
  arm() {
    this.released = new Promise<void>((r) => (this.release = r));
  },
};
const tasks = [
  defineTask({
    type: 'slow.job',
    ceilingMs: 60_000,
    handler: async (_p, ctx) => {
      await hold.released;
      record(ctx.id);
    },
  }),
  defineTask({ type: 'email.send', ceilingMs: 10_000, handler: async (_p, ctx) => record(ctx.id) }),
  defineTask({ type: 'report.build', ceilingMs: 10_000, handler: async (_p, ctx) => record(ctx.id) }),
  defineTask<{ invoice: number }>({
    type: 'invoice.sync',
    ceilingMs: 10_000,
    maxAttempts: 1,
    handler: async (_p, ctx) => {
      if (gate.failInvoices) throw new Error('upstream 503: billing API unavailable');
      record(ctx.id);
    },
  }),
];
const worker = new Worker({
  connectionString: DATABASE_URL,
  schema,
  tasks,
  // The pages are filled from several queues (mail, reports, billing, exports): serve them all.
  queues: 'all',
  slots: 4,
  pollIntervalMs: 200,
  heartbeatIntervalMs: 250,
  // Fast promotion. The ring never rotates during the file, so no completed task is pruned
  // before a page reads it: at the default pace (a slot sealed after 5 s, pruned once settled)
  // a completed entry could vanish while a loaded machine was still loading the page.
  maintenance: { leaderPollMs: 100, promoteIntervalMs: 50, gaugeIntervalMs: 500, ringRotateAfterMs: 3_600_000 },
  logger: testLogger,
  http: { port: 0, dashboard: true },
  // Yearly: it never fires on its own during the file; the Schedules page test triggers it.
  schedules: [
    defineSchedule({
      name: 'yearly-report',
      cron: '0 6 1 1 *',
      timeZone: 'Europe/Berlin',
      task: tasks[2]!,
      payload: { year: true },
      queue: 'reports',
      ceilingMs: 5_000,
    }),
  ],
});
await worker.start();
const base = worker.httpUrl!;

let launched: Promise<Browser> | null = null;
function browser(): Promise<Browser> {
  if (!existsSync(CHROMIUM)) {
    return Promise.reject(
      new Error(`${CHROMIUM} is missing: install it with \`apt-get install chromium\` (scripts/test-prereqs.sh does)`),
    );
  }
  launched ??= chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  return launched;
}
after(async () => {
  hold.release();
  if (launched) await (await launched).close();
  await worker.stop();
});

/** A fresh page (own context) at a dashboard route; page errors and console errors (CSP included) are kept. */
async function open(
  route: string,
  timezoneId?: string,
): Promise<{ page: Page; errors: string[]; close(): Promise<void> }> {
  const context = await (await browser()).newContext({
    viewport: { width: 1280, height: 800 },
    ...(timezoneId && { timezoneId }),
  });
  context.setDefaultTimeout(LONG);
  const page = await context.newPage();
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  await page.goto(`${base}/#/${route}`);
  return { page, errors, close: () => context.close() };
}

/** Wait until the element's text matches (the page refreshes itself every few seconds). */
async function textOf(page: Page, selector: string, expected: RegExp): Promise<string> {
  const handle = await page.waitForFunction(
    ([sel, source, flags]) => {
      const el = document.querySelector(sel!);
      const text = el?.textContent ?? '';
      return new RegExp(source!, flags).test(text) ? text : null;
    },
    [selector, expected.source, expected.flags],
    { timeout: LONG, polling: 100 },
  );
  return (await handle.jsonValue()) as string;
}

const later = () => new Date(Date.now() + 3600_000);

test('the overview shows pending, running and dead counts per queue and task type', async () => {
  for (let i = 0; i < 3; i++)
    await enqueue(pool, 'email.send', { to: `user${i}@example.com` }, { schema, queue: 'mail', runAt: later() });
  for (let i = 0; i < 2; i++)
    await enqueue(pool, 'report.build', { month: `2026-0${i + 1}` }, { schema, queue: 'reports', runAt: later() });
  const { page, errors, close } = await open('overview');
  try {
    await textOf(page, 'tr[data-queue="mail"] td:nth-child(2)', /^3$/);
    await textOf(page, 'tr[data-queue="reports"] td:nth-child(2)', /^2$/);
    await textOf(page, 'tr[data-type="email.send"] td:nth-child(2)', /^3$/);
    await textOf(page, '[data-card="workers"] .card-value', /^1$/);
    await textOf(
      page,
      '[data-card="leader"] .card-value',
      new RegExp(worker.id.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')),
    );
    assert.equal(await page.locator('figure.chart svg').count(), 2, 'throughput and failure charts');
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test('filtering tasks by state and type changes the list; a task opens with its payload and timeline', async () => {
  const hostile = await enqueue(
    pool,
    'report.build',
    { title: '<img src=x onerror="window.pwned=1">', n: 42 },
    { schema, queue: 'reports', runAt: later() },
  );
  const { page, errors, close } = await open('tasks');
  try {
    await page.waitForSelector('tr[data-task]');
    await page.selectOption('select[name="state"]', 'scheduled');
    await page.waitForFunction(() => location.hash.includes('state=scheduled'));
    await page.fill('input[name="type"]', 'report.build');
    await page.click('form.filters button[type="submit"]');
    await page.waitForFunction(
      () => {
        const rows = [...document.querySelectorAll('tr[data-task]')];
        return (
          rows.length === 3 &&
          rows.every((r) => r.textContent!.includes('report.build') && r.textContent!.includes('scheduled'))
        );
      },
      undefined,
      { timeout: LONG },
    );
    await page.fill('input[name="type"]', 'email.send');
    await page.click('form.filters button[type="submit"]');
    await page.waitForFunction(
      () => {
        const rows = [...document.querySelectorAll('tr[data-task]')];
        return rows.length === 3 && rows.every((r) => r.textContent!.includes('email.send'));
      },
      undefined,
      { timeout: LONG },
    );

    await page.goto(`${base}/#/tasks?type=report.build`);
    await page.click(`tr[data-task="${hostile.id}"] td:nth-child(2)`);
    await page.waitForFunction((id) => location.hash === `#/tasks/${id}`, hostile.id);
    const payload = await textOf(page, '#payload', /onerror/);
    assert.deepEqual(JSON.parse(payload), { title: '<img src=x onerror="window.pwned=1">', n: 42 });
    assert.equal(await page.locator('main img').count(), 0, 'the payload is text, never markup');
    assert.equal(await page.evaluate(() => (window as unknown as { pwned?: number }).pwned), undefined);
    await page.waitForSelector('#timeline li[data-event="created"]');
    assert.deepEqual(
      await page.locator('#timeline li').evaluateAll((els) => els.map((e) => e.getAttribute('data-event'))),
      ['created', 'scheduled'],
    );
    await textOf(page, 'dd[data-field="state"]', /^scheduled$/);
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test('retrying a dead letter from the Dead letters page runs it', async () => {
  gate.failInvoices = true;
  const { id } = await enqueue(pool, 'invoice.sync', { invoice: 1001 }, { schema, queue: 'billing' });
  await waitFor(async () => (await getTask(pool, schema, id!))?.state === 'dead', WAIT, 'the invoice task to die');
  const { page, errors, close } = await open('dead');
  try {
    const row = `tr[data-task="${id}"]`;
    await textOf(page, row, /billing API unavailable/);
    gate.failInvoices = false;
    await page.click(`${row} button:has-text("Retry")`);
    await textOf(page, '#toast', /retried/);
    await waitFor(() => ran.get(id!) === 1, WAIT, 'the retried task to run');
    await page.goto(`${base}/#/tasks/${id}`);
    await textOf(page, 'dd[data-field="state"]', /^completed$/);
    await page.waitForSelector('#timeline li[data-event="attempt"]');
    await page.waitForSelector('#attempts li[data-outcome="success"]');
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test("a task's page offers only the actions that apply to its state", async () => {
  gate.failInvoices = true;
  const dead = await enqueue(pool, 'invoice.sync', { invoice: 1500 }, { schema, queue: 'billing' });
  const scheduled = await enqueue(
    pool,
    'email.send',
    { to: 'later@example.com' },
    { schema, queue: 'mail', runAt: later() },
  );
  const done = await enqueue(pool, 'email.send', { to: 'now@example.com' }, { schema, queue: 'mail' });
  await waitFor(async () => (await getTask(pool, schema, dead.id!))?.state === 'dead', WAIT, 'the invoice task to die');
  await waitFor(
    async () => (await getTask(pool, schema, done.id!))?.state === 'completed',
    WAIT,
    'the email to be sent',
  );
  const { page, errors, close } = await open(`tasks/${scheduled.id}`);
  const buttons = async (id: string, state: string) => {
    await page.goto(`${base}/#/tasks/${id}`);
    await textOf(page, 'dd[data-field="state"]', new RegExp(`^${state}$`));
    return page.locator('main .actions button').evaluateAll((els) => els.map((e) => e.textContent));
  };
  try {
    assert.deepEqual(await buttons(dead.id!, 'dead'), ['Retry', 'Delete']);
    assert.deepEqual(await buttons(scheduled.id!, 'scheduled'), ['Run now', 'Cancel', 'Delete', 'Move']);
    assert.deepEqual(await buttons(done.id!, 'completed'), []);
    // Times carry the full ISO timestamp (UTC) in a tooltip.
    assert.match(
      String(await page.locator('dd[data-field="created"] time').getAttribute('title')),
      /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \(UTC\)$/,
    );
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test("a waiting task's page says what it waits on and lists its parents; the parent's page lists its dependents", async () => {
  // The parent is due in an hour: its dependent waits for the whole test.
  const [parent, child] = await enqueueMany(
    pool,
    [
      { type: 'email.send', payload: { to: 'parent@example.com' }, queue: 'pipeline', ref: 'p', runAt: later() },
      { type: 'email.send', payload: { to: 'child@example.com' }, queue: 'pipeline', dependsOn: [{ ref: 'p' }] },
    ],
    { schema },
  );
  const { page, errors, close } = await open(`tasks/${child!.id}`);
  try {
    await textOf(page, 'dd[data-field="state"]', /^waiting$/);
    await textOf(page, 'dd[data-field="due"]', /^when its parents complete$/);
    await textOf(page, '#waiting-on', new RegExp(`^Waiting on 1 of 1 parent: ${parent!.id} \\(scheduled\\)\\. `));
    await textOf(page, `#parents tr[data-parent="${parent!.id}"] td:nth-child(3)`, /^scheduled$/);
    assert.deepEqual(await page.locator('main .actions button').evaluateAll((els) => els.map((e) => e.textContent)), [
      'Cancel',
      'Delete',
    ]);
    // Each parent is a link to its own page, which lists the waiting dependent.
    await page.click(`#parents tr[data-parent="${parent!.id}"] a`);
    await page.waitForFunction((id) => location.hash === `#/tasks/${id}`, parent!.id);
    await textOf(page, `#dependents tr[data-dependent="${child!.id}"] td:nth-child(2)`, /^waiting$/);
    await textOf(page, `#dependents tr[data-dependent="${child!.id}"] td:nth-child(3)`, /^yes$/);
    assert.equal(await page.locator('#waiting-on').count(), 0, 'the parent waits on nothing');
    // The tasks list filters on the state.
    await page.goto(`${base}/#/tasks?state=waiting&queue=pipeline`);
    await textOf(page, `tr[data-task="${child!.id}"] td:nth-child(4)`, /^waiting$/);
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test('a queue paused from the Queues page is not claimed while others run; resuming runs it', async () => {
  // The queue needs a lane to be listed: one task that runs now.
  const first = await enqueue(pool, 'report.build', {}, { schema, queue: 'exports' });
  await waitFor(() => ran.get(first.id!) === 1, WAIT, 'the first export');
  const { page, errors, close } = await open('queues');
  try {
    const row = 'tr[data-queue="exports"]';
    await page.fill(`${row} input[data-keep]`, 'storage migration');
    await page.click(`${row} button:has-text("Pause")`);
    await textOf(page, row, /paused.*dashboard:local.*storage migration/);

    const held = await enqueue(pool, 'report.build', { held: true }, { schema, queue: 'exports' });
    const other = await enqueue(pool, 'email.send', { to: 'ops@example.com' }, { schema, queue: 'mail' });
    await waitFor(() => ran.get(other.id!) === 1, WAIT, 'the task on another queue to run');
    const detail = await (await browser()).newPage();
    detail.setDefaultTimeout(LONG);
    await detail.goto(`${base}/#/tasks/${held.id}`);
    await textOf(detail, 'dd[data-field="state"]', /^ready$/);
    await detail.close();
    assert.equal(ran.get(held.id!), undefined, 'not claimed while paused');

    await page.click(`${row} button:has-text("Resume")`);
    await textOf(page, row, /active/);
    await waitFor(() => ran.get(held.id!) === 1, WAIT, 'the held task to run after resume');
    await page.goto(`${base}/#/tasks/${held.id}`);
    await textOf(page, 'dd[data-field="state"]', /^completed$/);
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test('the Schedules page shows a schedule, pauses and resumes it, and triggers one run (audited)', async () => {
  const { page, errors, close } = await open('schedules');
  try {
    const row = 'tr[data-schedule="yearly-report"]';
    // Next fire: 1 January, 06:00 in Berlin (05:00 UTC).
    await textOf(
      page,
      row,
      /yearly-report.*0 6 1 1 \* \(Europe\/Berlin\).*report\.build on reports, ceiling 5\.0 s.*active/,
    );
    const next = await page.getAttribute(`${row} td:nth-child(5) time`, 'datetime');
    assert.match(next ?? '', /-01-01T05:00:00\.000Z$/);
    await page.click(`${row} button:has-text("Pause")`);
    await textOf(page, row, /paused by dashboard:local/);
    const paused = await pool.query(`SELECT paused, paused_by FROM ${S}.schedules WHERE name = 'yearly-report'`);
    assert.deepEqual(paused.rows[0], { paused: true, paused_by: 'dashboard:local' });
    await page.click(`${row} button:has-text("Resume")`);
    await textOf(page, row, /active/);

    await page.click(`${row} button:has-text("Trigger")`);
    await textOf(page, '#confirm-text', /Enqueue one run of yearly-report now\?/);
    await page.click('#confirm-ok');
    // The audit row is written after the trigger commits, before the answer: the toast, not the
    // task's run (which can come first), says it is there.
    await textOf(page, '#toast', /Trigger yearly-report: /);
    const fire = await waitFor(
      async () =>
        (
          await pool.query(
            `SELECT task_id::text AS id FROM ${S}.schedule_fires WHERE schedule = 'yearly-report' AND kind = 'trigger'`,
          )
        ).rows[0]?.id as string | undefined,
      WAIT,
      'the triggered task',
    );
    await waitFor(() => ran.get(fire) === 1, WAIT, 'the triggered task to run');
    const actions = await pool.query(
      `SELECT action FROM ${S}.audit_log WHERE target->>'schedule' = 'yearly-report' ORDER BY id`,
    );
    assert.deepEqual(
      actions.rows.map((r) => r.action),
      ['schedule.pause', 'schedule.resume', 'schedule.trigger'],
    );
    // A trigger does not move the schedule: still no last fire.
    const after = await pool.query(`SELECT last_instant FROM ${S}.schedules WHERE name = 'yearly-report'`);
    assert.equal(after.rows[0].last_instant, null);
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test('the Queues page limits a queue: set from its form, held at the limit (running and held shown), raised, refused with the field named, cleared (audited)', async () => {
  hold.arm();
  // The queue needs a lane to be limited: one task that runs now.
  const first = await enqueue(pool, 'email.send', {}, { schema, queue: 'throttled' });
  await waitFor(() => ran.get(first.id!) === 1, WAIT, 'the first throttled task');
  const { page, errors, close } = await open('queues');
  const row = 'tr[data-limit="throttled"]';
  try {
    await textOf(page, '#limits', /No queue is limited\./);
    await page.fill('#limit-new input[list="limit-queues"]', 'throttled');
    await page.fill('#limit-new input[data-field="maxRunning"]', '1');
    await page.click('#limit-new button:has-text("Set limit")');
    await textOf(page, '#toast', /Limit throttled: max 1 running/);
    await textOf(page, row, /^throttled1\d.*dashboard:local/);

    const jobs = await enqueueMany(
      pool,
      [1, 2, 3].map((i) => ({ type: 'slow.job', payload: { i }, queue: 'throttled' })),
      { schema },
    );
    // One runs; the other two wait for the limit, and the page says so.
    await textOf(page, `${row} td:nth-child(6)`, /^2 at limit$/);
    await textOf(page, `${row} td:nth-child(3)`, /^1$/);
    await textOf(page, 'tr[data-queue="throttled"]', /max 1 running at limit/);
    const states = await Promise.all(jobs.map(async (j) => (await getTask(pool, schema, j.id!))?.state));
    assert.deepEqual(states.sort(), ['ready', 'ready', 'running']);

    // Raised to 3 from its row: the held two start (3 of 3 running is at the limit, holding none).
    await page.fill(`${row} input[data-field="maxRunning"]`, '3');
    await page.click(`${row} button:has-text("Save")`);
    await textOf(page, `${row} td:nth-child(3)`, /^3$/);
    await textOf(page, `${row} td:nth-child(6)`, /^0 at limit$/);
    assert.equal((await listQueueLimits(pool, schema)).find((l) => l.queue === 'throttled')?.maxRunning, 3);

    // A rate the server cannot read is refused, naming the field; the limit stays as it was.
    await page.fill(`${row} input[data-field="rate"]`, '20 per second');
    await page.click(`${row} button:has-text("Save")`);
    await textOf(page, '#toast', /Limit throttled failed: rate must be a count and an interval/);
    assert.equal((await listQueueLimits(pool, schema)).find((l) => l.queue === 'throttled')?.rateLimit, null);

    await page.click(`${row} button:has-text("Clear")`);
    await textOf(page, '#confirm-text', /Remove every limit of throttled\?/);
    await page.click('#confirm-ok');
    await textOf(page, '#limits', /No queue is limited\./);
    hold.release();
    await waitFor(() => jobs.every((j) => ran.get(j.id!) === 1), WAIT, 'the throttled jobs to finish');
    const actions = await pool.query(
      `SELECT actor, action, target FROM ${S}.audit_log WHERE target->>'queue' = 'throttled' ORDER BY id`,
    );
    assert.deepEqual(
      actions.rows.map((r) => [r.actor, r.action, r.target.maxRunning ?? null]),
      [
        ['dashboard:local', 'queue.limit', 1],
        ['dashboard:local', 'queue.limit', 3],
        ['dashboard:local', 'queue.unlimit', null],
      ],
    );
    // The refused save answered 400, which the browser logs as a failed resource load.
    assert.deepEqual(
      errors.filter((e) => !/status of 400/.test(e)),
      [],
    );
  } finally {
    hold.release();
    await close();
  }
});

test('the Queues page shows a task type rate limit set through the API (started at the limit, paced, refused), sets one from its form, refuses a bad rate naming the field, and clears them (audited)', async () => {
  // One start an hour for report.build, set as the CLI would; then two tasks of it, due in a
  // second (by then the worker has read the new limit, at the latest at its next poll).
  await setTypeLimitAudited(pool, schema, null, 'ops:alice', 'report.build', { limit: 1, intervalMs: 3_600_000 });
  const jobs = await enqueueMany(
    pool,
    [1, 2].map((i) => ({ type: 'report.build', payload: { i }, queue: 'rated', delay: 1000 })),
    { schema },
  );
  const { page, errors, close } = await open('queues');
  const row = 'tr[data-type-limit="report.build"]';
  try {
    // One starts; the other is handed back unstarted and paced an hour ahead. A granted start
    // that could not begin within the limit's guard (250 ms here: an answer slower than that on a
    // loaded machine) is spent, and that task asks again and is refused too: so the settled state
    // is one start counted and, of the two tasks, each either run or paced, with a refusal per
    // paced task. The page shows the counts the database holds.
    const settled = await waitFor(
      async () => {
        const [limit] = await listTypeLimits(pool, schema);
        const runs = jobs.filter((j) => ran.has(j.id!)).length;
        return limit &&
          limit.started === 1 &&
          limit.paced >= 1 &&
          limit.refused === limit.paced &&
          runs + limit.paced === 2
          ? { refused: limit.refused, runs }
          : null;
      },
      WAIT,
      'one start counted and every task of the limited type run or paced',
    );
    await textOf(page, `${row} td:nth-child(3)`, /^1 at limit$/);
    await textOf(page, `${row} td:nth-child(4)`, new RegExp(`^${settled.refused}$`));
    await textOf(page, row, new RegExp(`^report\\.build1/1h1 at limit${settled.refused}${settled.refused}ops:alice`));
    assert.ok(jobs.every((j) => (ran.get(j.id!) ?? 0) <= 1));

    // Set from the form, for a type with no task yet; a rate the server cannot read is refused
    // first, naming the field, and nothing is set.
    await page.fill('#type-limit-new input[data-field="type"]', 'partner.call');
    await page.fill('#type-limit-new input[data-field="rate"]', '20 per second');
    await page.click('#type-limit-new button:has-text("Set rate limit")');
    await textOf(page, '#toast', /Rate limit of type partner\.call failed: rate must be a count and an interval/);
    assert.deepEqual(
      (await listTypeLimits(pool, schema)).map((l) => l.type),
      ['report.build'],
    );
    await page.fill('#type-limit-new input[data-field="rate"]', '20/1s');
    await page.click('#type-limit-new button:has-text("Set rate limit")');
    await textOf(page, '#toast', /Rate limit of type partner\.call: at most 20\/1s/);
    await textOf(page, 'tr[data-type-limit="partner.call"]', /^partner\.call20\/1s000dashboard:local/);

    // Cleared with a confirmation: the paced task is due again at once and runs.
    await page.click(`${row} button:has-text("Clear")`);
    await textOf(
      page,
      '#confirm-text',
      /Remove the rate limit of type report\.build\? The tasks it paced are due again/,
    );
    await page.click('#confirm-ok');
    await textOf(page, '#toast', /Clear rate limit of type report\.build: rate limit cleared/);
    await waitFor(() => jobs.every((j) => ran.get(j.id!) === 1), WAIT, 'the paced report to run once cleared');
    await page.click('tr[data-type-limit="partner.call"] button:has-text("Clear")');
    await page.click('#confirm-ok');
    await textOf(page, '#type-limits', /No task type is rate limited\./);
    const actions = await pool.query(
      `SELECT actor, action, target FROM ${S}.audit_log WHERE action LIKE 'type.%' ORDER BY id`,
    );
    assert.deepEqual(
      actions.rows.map((r) => [r.actor, r.action, r.target.type, r.target.rate ?? null]),
      [
        ['ops:alice', 'type.limit', 'report.build', { limit: 1, intervalMs: 3_600_000 }],
        ['dashboard:local', 'type.limit', 'partner.call', { limit: 20, intervalMs: 1000 }],
        ['dashboard:local', 'type.unlimit', 'report.build', null],
        ['dashboard:local', 'type.unlimit', 'partner.call', null],
      ],
    );
    // The refused set answered 400, which the browser logs as a failed resource load.
    assert.deepEqual(
      errors.filter((e) => !/status of 400/.test(e)),
      [],
    );
  } finally {
    await close();
  }
});

test('the Queues page sets a key limit from its form (the held tasks of a key start), refuses a bad one naming the field, lists the held keys, and clears it (audited)', async () => {
  hold.arm();
  const { page, errors, close } = await open('queues');
  try {
    await textOf(page, '#keys', /No key limits set/);
    await textOf(page, '#keys', /No tasks are held for their keys\./);
    const jobs = await enqueueMany(
      pool,
      [1, 2, 3].map((i) => ({ type: 'slow.job', payload: { i }, queue: 'keyed', concurrencyKey: 'tenant-x' })),
      { schema },
    );
    // One key, no limit: one runs, two are held; the page lists the key.
    const held = 'tr[data-held-key="tenant-x"]';
    await textOf(page, `${held} td:nth-child(2)`, /^2$/);
    await textOf(page, `${held} td:nth-child(3)`, /^1$/);

    // A per-key value the server cannot read is refused, naming the field; nothing is set.
    await page.selectOption('#key-limit-new select[data-field="scope"]', 'queue');
    await page.fill('#key-limit-new input[data-field="name"]', 'keyed');
    await page.fill('#key-limit-new input[data-field="perKey"]', 'many');
    await page.click('#key-limit-new button:has-text("Set key limit")');
    await textOf(page, '#toast', /Key limit of queue keyed failed: .*perKey must be an integer/);
    assert.deepEqual(await listKeyLimits(pool, schema), []);

    // Three per key: the held two start.
    await page.fill('#key-limit-new input[data-field="perKey"]', '3');
    await page.click('#key-limit-new button:has-text("Set key limit")');
    await textOf(page, '#toast', /Key limit of queue keyed: at most 3 per key/);
    const row = 'tr[data-key-limit="queue:keyed"]';
    await textOf(page, row, /^queuekeyed3dashboard:local/);
    await textOf(page, '#keys', /No tasks are held for their keys\./);
    await waitFor(
      async () => {
        const states = await Promise.all(jobs.map(async (j) => (await getTask(pool, schema, j.id!))?.state));
        return states.every((s) => s === 'running');
      },
      WAIT,
      'the three keyed jobs running at once',
    );

    // Changed from its row, then cleared with a confirmation.
    await page.fill(`${row} input[data-field="perKey"]`, '2');
    await page.click(`${row} button:has-text("Save")`);
    await textOf(page, `${row} td:nth-child(3)`, /^2$/);
    await page.click(`${row} button:has-text("Clear")`);
    await textOf(page, '#confirm-text', /Remove the key limit of queue keyed\?/);
    await page.click('#confirm-ok');
    await textOf(page, '#keys', /No key limits set/);
    hold.release();
    await waitFor(() => jobs.every((j) => ran.get(j.id!) === 1), WAIT, 'the keyed jobs to finish');
    const actions = await pool.query(
      `SELECT actor, action, target FROM ${S}.audit_log WHERE action LIKE 'key.%' AND NOT result ? 'error' ORDER BY id`,
    );
    assert.deepEqual(
      actions.rows.map((r) => [r.actor, r.action, r.target.perKey ?? null]),
      [
        ['dashboard:local', 'key.limit', 3],
        ['dashboard:local', 'key.limit', 2],
        ['dashboard:local', 'key.unlimit', null],
      ],
    );
    // The refused set answered 400, which the browser logs as a failed resource load.
    assert.deepEqual(
      errors.filter((e) => !/status of 400/.test(e)),
      [],
    );
  } finally {
    hold.release();
    await close();
  }
});

test('the Maintenance page renders past a forged workers row (leader = true, ten years ahead, malformed report), marked invalid', async () => {
  await pool.query(
    `INSERT INTO ${S}.workers (worker_id, host, pid, queues, slots, busy, prefetched, leader, maintenance, started_at, last_seen_at)
     VALUES ('forged', 'nowhere', 1, NULL, 4, 0, 0, true, '{"branches": {"promote": 1}, "waitingLanes": "x"}', now(), now() + interval '10 years')`,
  );
  const { page, errors, close } = await open('maintenance');
  try {
    await textOf(page, '#leader', new RegExp(`Worker ${worker.id.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\\.`));
    const forged = await textOf(page, 'main table tr:has(span[data-invalid])', /forged/);
    assert.doesNotMatch(forged, /leader/, 'the forged row is not badged leader');
    assert.match(
      String(await page.locator('span[data-invalid]').getAttribute('title')),
      /dated in the future.*malformed branches, waitingLanes/,
    );
    assert.deepEqual(errors, []);
  } finally {
    await close();
    await pool.query(`DELETE FROM ${S}.workers WHERE worker_id = 'forged'`);
  }
});

test("a running task is cancelled from its page: confirmed, its handler's signal fires, and it never runs again", async () => {
  hold.arm();
  const { id } = await enqueue(pool, 'slow.job', {}, { schema, queue: 'slow' });
  const { page, errors, close } = await open('overview');
  try {
    await waitFor(async () => (await getTask(pool, schema, id!))?.state === 'running', WAIT, 'the slow job to run');
    await page.goto(`${base}/#/tasks/${id}`);
    await textOf(page, 'dd[data-field="state"]', /^running$/);
    assert.deepEqual(await page.locator('main .actions button').evaluateAll((els) => els.map((e) => e.textContent)), [
      'Cancel',
    ]);
    await page.click('main .actions button:has-text("Cancel")');
    await textOf(page, '#confirm-text', /Its handler is aborted and it never runs again/);
    await page.click('#confirm-ok');
    await textOf(page, '#toast', /cancelled/);
    await waitFor(
      async () => (await getTask(pool, schema, id!))?.state === 'cancelled',
      WAIT,
      'the task to read as cancelled',
    );
    const history = await attemptsOf(pool, schema, id!);
    assert.equal(history.length, 1);
    assert.equal(history[0]!.outcome, 'cancelled');
    assert.match(String(history[0]!.error?.message), /^cancelled by dashboard/);
    // The page refreshes into the cancelled task: who cancelled it and when, and no action left.
    await textOf(page, 'dd[data-field="state"]', /^cancelled$/);
    await textOf(page, 'dd[data-field="cancelled"]', /^by dashboard:.*, \d{4}-/);
    assert.equal(await page.locator('main .actions button').count(), 0);
    assert.deepEqual(errors, []);
  } finally {
    hold.release();
    await close();
  }
});

test('the overview shows a running task as running and not also as waiting (waiting + running = pending)', async () => {
  hold.arm();
  const { id } = await enqueue(pool, 'slow.job', {}, { schema, queue: 'slow' });
  const { page, errors, close } = await open('overview');
  try {
    await waitFor(async () => (await getTask(pool, schema, id!))?.state === 'running', WAIT, 'the slow job to run');
    const row = 'tr[data-queue="slow"]';
    await textOf(page, `${row} td:nth-child(3)`, /^1$/);
    assert.equal(await page.locator(`${row} td:nth-child(2)`).textContent(), '0', 'not waiting: a worker holds it');
    assert.equal(
      await page.locator(`${row} td:nth-child(2) span`).getAttribute('title'),
      '1 pending = 0 waiting + 1 running',
    );
    assert.deepEqual((await page.locator('main table').first().locator('th').allTextContents()).slice(0, 4), [
      'Queue',
      'Waiting',
      'Running',
      'Dead',
    ]);
    assert.equal(await page.locator('[data-card="pending"]').count(), 0, 'no pending card to read the task twice in');
    await textOf(page, '[data-card="waiting"] .card-note', /^of \d+ pending$/);
    assert.deepEqual(errors, []);
  } finally {
    hold.release();
    await close();
  }
  await waitFor(() => ran.get(id!) === 1, WAIT, 'the slow job to finish');
});

test("the Lanes page folds a queue's lanes into one row (sums, oldest age) and unfolds it to show each lane", async () => {
  // Paused, so what is enqueued stays in the ring and counts as depth.
  await pauseQueue(pool, schema, 'fold', 'cli:test');
  for (const shard of [0, 1, 2, 3])
    for (let i = 0; i < 2; i++) await enqueue(pool, 'email.send', { shard, i }, { schema, queue: 'fold', shard });
  await enqueue(pool, 'email.send', { urgent: true }, { schema, queue: 'fold', shard: 0, priority: 5 });
  const { page, errors, close } = await open('lanes');
  const lanes = () =>
    page
      .locator('tr[data-lane^="fold/"]')
      .evaluateAll((els) =>
        els.map((e) => `${e.getAttribute('data-lane')}=${e.querySelector('td:nth-child(5)')?.textContent}`).sort(),
      );
  try {
    const group = 'tr.lane-group[data-queue="fold"]';
    await textOf(page, `${group} td:nth-child(5)`, /^9$/);
    assert.equal(await page.locator(`${group} td:nth-child(4)`).textContent(), '5 lanes');
    assert.deepEqual(
      (await page.locator(`${group} td:nth-child(3)`).textContent())!.split(', ').sort(),
      ['0', '5'],
      'its priorities',
    );
    assert.equal(await page.locator(`${group} td:nth-child(12)`).textContent(), 'paused');
    assert.deepEqual(await lanes(), [], 'folded: no lane rows');

    await page.click(`${group} button.toggle`);
    await page.waitForFunction(() => document.querySelectorAll('tr[data-lane^="fold/"]').length === 5);
    assert.deepEqual(await lanes(), ['fold/0/0=2', 'fold/0/1=2', 'fold/0/2=2', 'fold/0/3=2', 'fold/5/0=1']);
    assert.equal(await page.locator(`${group} button.toggle`).getAttribute('aria-expanded'), 'true');
    // The page redraws itself every few seconds; the queue stays unfolded.
    const drawn = await page.$(group);
    await page.waitForFunction((el) => !el?.isConnected, drawn, { timeout: LONG, polling: 100 });
    assert.equal((await lanes()).length, 5, 'still unfolded after a refresh');

    await page.click(`${group} button.toggle`);
    await page.waitForFunction(() => document.querySelectorAll('tr[data-lane^="fold/"]').length === 0);
    assert.deepEqual(errors, []);
  } finally {
    await close();
    await resumeQueue(pool, schema, 'fold', 'cli:test');
  }
});

/** "2026-12-01 12:55:18 UTC+05:30": a date, a clock and a zone. */
const KOLKATA = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\+05:30$/;

test("every time shown carries its date and zone (the browser's), with the UTC instant on hover", async () => {
  const { id } = await enqueue(pool, 'report.build', {}, { schema, queue: 'dated', runAt: later() });
  const { page, errors, close } = await open('tasks?queue=dated', 'Asia/Kolkata');
  try {
    await page.waitForSelector(`tr[data-task="${id}"] time`);
    const times = await page
      .locator(`tr[data-task="${id}"] time`)
      .evaluateAll((els) =>
        els.map((e) => [e.getAttribute('datetime') ?? '', e.textContent ?? '', e.getAttribute('title') ?? ''] as const),
      );
    assert.equal(times.length, 2, 'created and due');
    for (const [iso, text, title] of times) {
      const local = new Date(Date.parse(iso) + 330 * 60_000).toISOString();
      assert.equal(text, `${local.slice(0, 10)} ${local.slice(11, 19)} UTC+05:30`);
      assert.equal(title, `${new Date(iso).toISOString()} (UTC)`);
    }
    await page.goto(`${base}/#/tasks/${id}`);
    await textOf(page, 'dd[data-field="due"]', KOLKATA);
    assert.match(String(await page.locator('#timeline li[data-event="created"] time').textContent()), KOLKATA);
    // A relative time accompanies the date, never replaces it (a heartbeat, a branch's last run).
    await page.goto(`${base}/#/maintenance`);
    await textOf(page, 'main', /\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\+05:30 \((\d+s ago|in \d+s)\)/);
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test('tasks selected on the list (select all on the page) are cancelled or retried in one action, confirmed, with a summary of what changed and why not', async () => {
  const picked: string[] = [];
  for (let i = 0; i < 3; i++)
    picked.push((await enqueue(pool, 'report.build', { i }, { schema, queue: 'triage', runAt: later() })).id!);
  const kept = (await enqueue(pool, 'email.send', { kept: true }, { schema, queue: 'triage', runAt: later() })).id!;
  const { page, errors, close } = await open('tasks?queue=triage');
  const rows = (n: number) =>
    page.waitForFunction((count) => document.querySelectorAll('tr[data-task]').length === count, n, {
      timeout: LONG,
    });
  try {
    await rows(4);
    await textOf(page, '[data-selected]', /^0 selected$/);
    assert.equal(await page.locator('button[data-bulk="cancel"]').isDisabled(), true);
    await page.check('input[data-select-all]');
    await textOf(page, '[data-selected]', /^4 selected$/);
    await page.uncheck(`input[data-select="${kept}"]`);
    await textOf(page, '[data-selected]', /^3 selected$/);
    assert.equal(await page.evaluate(() => location.hash), '#/tasks?queue=triage', 'a tick does not open the task');
    assert.equal(
      await page.locator('input[data-select-all]').evaluate((e) => (e as HTMLInputElement).indeterminate),
      true,
    );
    // Declined: nothing happens.
    await page.click('button[data-bulk="cancel"]');
    await textOf(page, '#confirm-text', /^Cancel 3 selected task\(s\)\?/);
    await page.click('#confirm button[value="cancel"]');
    assert.equal((await getTask(pool, schema, picked[0]!))?.state, 'scheduled');

    await page.click('button[data-bulk="cancel"]');
    await page.click('#confirm-ok');
    await textOf(page, '#bulk-result [data-summary]', /^Cancel: 3 of 3 changed \(3 removed\)\.$/);
    // Still listed, now as cancelled (the list is not filtered by state).
    await page.waitForFunction(
      (ids) => ids.every((id) => document.querySelector(`tr[data-task="${id}"] .badge.cancelled`) !== null),
      picked,
      { timeout: LONG },
    );
    for (const id of picked)
      assert.equal((await getTask(pool, schema, id))?.state, 'cancelled', `task ${id} cancelled`);
    await textOf(page, '[data-selected]', /^0 selected$/);

    // A completed task cannot be retried: the summary says so, and which.
    const done = (await enqueue(pool, 'email.send', { now: true }, { schema, queue: 'triage' })).id!;
    await waitFor(async () => (await getTask(pool, schema, done))?.state === 'completed', WAIT, 'the email to be sent');
    await rows(5);
    await page.check(`input[data-select="${kept}"]`);
    await page.check(`input[data-select="${done}"]`);
    await page.click('button[data-bulk="retry"]');
    await textOf(page, '#confirm-text', /^Retry 2 selected task\(s\)\?/);
    await page.click('#confirm-ok');
    await textOf(
      page,
      '#bulk-result [data-summary]',
      /^Retry: 1 of 2 changed \(1 retried\); 1 not changed: 1 not retryable \(ready, running or completed\)\.$/,
    );
    await textOf(page, '#bulk-result li[data-reason="not_retryable"]', new RegExp(`^not retryable .*: ${done}$`));
    await waitFor(() => ran.get(kept) === 1, WAIT, 'the retried task to run now');
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test('dead letters selected on their page are retried in one action', async () => {
  gate.failInvoices = true;
  const ids: string[] = [];
  for (let i = 0; i < 2; i++)
    ids.push((await enqueue(pool, 'invoice.sync', { invoice: 3000 + i }, { schema, queue: 'dunning' })).id!);
  for (const id of ids)
    await waitFor(async () => (await getTask(pool, schema, id))?.state === 'dead', WAIT, 'the invoice to die');
  const { page, errors, close } = await open('dead?queue=dunning');
  try {
    await page.waitForFunction(() => document.querySelectorAll('tr[data-task]').length === 2);
    gate.failInvoices = false;
    await page.check('input[data-select-all]');
    await page.click('button[data-bulk="retry"]');
    await page.click('#confirm-ok');
    await textOf(page, '#bulk-result [data-summary]', /^Retry: 2 of 2 changed \(2 retried\)\.$/);
    for (const id of ids) await waitFor(() => ran.get(id) === 1, WAIT, 'the retried invoice to run');
    assert.deepEqual(errors, []);
  } finally {
    await close();
  }
});

test('a read-only dashboard draws no checkboxes and no bulk actions', async () => {
  await enqueue(pool, 'report.build', {}, { schema, queue: 'ro-list', runAt: later() });
  const ro = await startDashboard({ pool, schema, port: 0, logger: testLogger, readOnly: true });
  const context = await (await browser()).newContext();
  context.setDefaultTimeout(LONG);
  try {
    const page = await context.newPage();
    await page.goto(`${ro.url}#/tasks?queue=ro-list`);
    await page.waitForSelector('tr[data-task]');
    assert.equal(await page.locator('input[type="checkbox"], button[data-bulk], #bulk-result').count(), 0);
  } finally {
    await context.close();
    await ro.close();
  }
});

test('the Attempts page lists failed and completed attempts by outcome and type; a task page shows every attempt with its error and stack', async () => {
  gate.failInvoices = true;
  const failed = await enqueue(pool, 'invoice.sync', { invoice: 7 }, { schema, queue: 'billing' });
  const done = await enqueue(pool, 'email.send', { to: 'a@example.com' }, { schema, queue: 'mail' });
  await waitFor(
    async () =>
      (await getTask(pool, schema, failed.id!))?.state === 'dead' &&
      (await getTask(pool, schema, done.id!))?.state === 'completed',
    LONG,
    'the invoice to die and the email to complete',
  );
  const { page, errors, close } = await open('attempts?outcome=failure&type=invoice.sync');
  try {
    await page.waitForSelector(`tr[data-attempt="${failed.id}:1"]`);
    const rows = await page.locator('tr[data-attempt]').evaluateAll((els) => els.map((e) => e.textContent ?? ''));
    assert.ok(rows.length >= 1);
    assert.ok(
      rows.every((r) => r.includes('invoice.sync') && r.includes('failure')),
      rows.join('\n'),
    );
    await page.selectOption('select[name="outcome"]', 'success');
    await page.fill('input[name="type"]', 'email.send');
    await page.fill('input[name="queue"]', 'mail');
    await page.click('form.filters button[type="submit"]');
    await page.waitForSelector(`tr[data-attempt="${done.id}:1"]`);
    assert.ok(
      (await page.locator('tr[data-attempt]').evaluateAll((els) => els.map((e) => e.textContent ?? ''))).every(
        (r) => r.includes('email.send') && r.includes('success') && r.includes('mail'),
      ),
    );

    await page.goto(`${base}/#/attempts?outcome=failure&type=invoice.sync`);
    await page.click(`tr[data-attempt="${failed.id}:1"] td:nth-child(4)`);
    await page.waitForFunction((id) => location.hash === `#/tasks/${id}`, failed.id);
    await page.waitForSelector('#attempts li[data-outcome="failure"]');
    const error = await textOf(page, '#attempts li[data-attempt="1"] pre.error-text', /upstream 503/);
    assert.match(error, /upstream 503: billing API unavailable\n\s+at /, 'the stack is shown');
    assert.match(await textOf(page, '#attempts li[data-attempt="1"]', /dead/), /failure · dead/);
    assert.deepEqual(errors, []);
  } finally {
    await close();
    gate.failInvoices = false;
  }
});

test('screenshot of the overview with realistic data', async () => {
  // Work in several queues and types, some of it failing for good.
  const spread: [string, string, number][] = [
    ['mail', 'email.send', 14],
    ['reports', 'report.build', 6],
    ['billing', 'invoice.sync', 9],
    ['media', 'thumbnail.render', 21],
  ];
  for (const [queue, type, n] of spread) {
    for (let i = 0; i < n; i++)
      await enqueue(pool, type, { i }, { schema, queue, runAt: new Date(Date.now() + (i + 1) * 600_000) });
  }
  gate.failInvoices = true;
  for (let i = 0; i < 3; i++) await enqueue(pool, 'invoice.sync', { invoice: 2000 + i }, { schema, queue: 'billing' });
  // A paused queue with a backlog: oldest due and depth.
  await pauseQueue(pool, schema, 'media', 'cli:ops', 'CDN maintenance');
  for (let i = 0; i < 12; i++)
    await enqueue(
      pool,
      'thumbnail.render',
      { asset: `img-${i}.jpg` },
      { schema, queue: 'media', runAt: new Date(Date.now() - (i + 1) * 60_000) },
    );
  // Two tasks running while the picture is taken: counted under Running, not also under Waiting.
  hold.arm();
  for (let i = 0; i < 2; i++) await enqueue(pool, 'slow.job', { i }, { schema, queue: 'reports' });
  // An hour of history as the workers' heartbeats would have written it (a test cannot wait an hour).
  await pool.query(
    `INSERT INTO ${S}.outcome_counts (minute, worker_id, queue, type, outcome, count)
     SELECT date_trunc('minute', now()) - make_interval(mins => m), 'history', q.queue, q.type, o.outcome,
            greatest(0, round(q.base * (1.2 + sin(m / 7.0)) * o.share + (m % 5)))::bigint
       FROM generate_series(1, 59) m,
            (VALUES ('mail', 'email.send', 40), ('reports', 'report.build', 8), ('billing', 'invoice.sync', 15), ('media', 'thumbnail.render', 25)) q(queue, type, base),
            (VALUES ('success', 1.0), ('failure', 0.06)) o(outcome, share)
      WHERE o.outcome = 'success' OR m % 3 = 0 OR m BETWEEN 20 AND 26`,
  );
  await waitFor(
    async () =>
      (await pool.query(`SELECT count(*)::int AS n FROM ${S}.dead_letters WHERE type = 'invoice.sync'`)).rows[0].n >= 3,
    WAIT,
    'dead letters',
  );
  const { page, errors, close } = await open('overview');
  try {
    await textOf(page, 'tr[data-queue="media"] td:nth-child(2)', /^33$/);
    await textOf(page, 'tr[data-queue="reports"] td:nth-child(3)', /^2$/);
    await textOf(page, '[data-card="dead-letters"] .card-value', /^[1-9]/);
    await page.waitForSelector('figure.chart rect.bar.bad');
    // The y-axis label fits left of the axis, thousands included (it used to clip to "),000").
    const labels = await page
      .locator('figure.chart svg text.label.end')
      .evaluateAll((els) => els.map((e) => (e as SVGTextElement).getBBox().x));
    assert.ok(
      labels.every((x) => x >= 0),
      `labels start inside the chart: ${labels}`,
    );
    // The oldest-due headline leaves the paused queue (media, 12 min) out.
    assert.doesNotMatch(await textOf(page, '[data-card="oldest-due"] .card-note', /./), /media/);
    const keep = Boolean(process.env.BERTH_UPDATE_SCREENSHOT);
    const file = keep
      ? fileURLToPath(new URL('../docs/dashboard.png', import.meta.url))
      : join(tmpdir(), `berth-dashboard-${process.pid}.png`);
    await page.screenshot({ path: file });
    assert.ok(statSync(file).size > 10_000, 'a real picture');
    if (!keep) rmSync(file);
    assert.deepEqual(errors, []);
  } finally {
    hold.release();
    await close();
  }
});
