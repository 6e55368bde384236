/**
 * `berth limits list | set | clear` and the limits section of `berth stats`: audited under the
 * CLI's actor, bad input refused as one line naming the field with exit 2, and the held-back
 * count (due tasks waiting while the queue is at its limit).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { enqueueMany, listAudit, listQueueLimits, type QueueLimitStatus } from '../src/index.js';
import { claim } from '../src/processor/claim.js';
import { claimParams } from './claim-params.js';
import { DATABASE_URL, freshSchema } from './helpers.js';
import { cliOn } from './support/run-cli.js';

const { schema, pool } = await freshSchema('clilimits');
const S = `"${schema}"`;
process.env.BERTH_ACTOR = 'cli:tester';

const { berth, berthJson } = cliOn(schema, DATABASE_URL);

const oneLine = (text: string) => text.trim().split('\n').length === 1;

/** `n` tasks of `queue` due ten minutes ago; one of them leased (running) when `running`. */
async function dueWork(queue: string, n: number, running: boolean): Promise<void> {
  const runAt = new Date(Date.now() - 600_000);
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: 'cli_limit', payload: { i }, queue, runAt })),
    { schema },
  );
  // Past run times go to deferred storage: promote them, as the leader would.
  const { promoteDue } = await import('../src/maintenance-api.js');
  await promoteDue(pool, schema);
  if (!running) return;
  const lane = (await pool.query(`SELECT lane_id FROM ${S}.lanes WHERE queue = $1`, [queue])).rows[0].lane_id;
  assert.equal((await claim(pool, claimParams(schema, [lane], 1))).length, 1);
}

test('set, list, change and clear a limit; audited as the CLI actor; stats shows the section only while one exists', async () => {
  await dueWork('mail', 5, true);
  const noLimits = await berth('stats');
  assert.equal(noLimits.code, 0, noLimits.err);
  assert.doesNotMatch(noLimits.out, /MAXRUNNING/);

  const set = await berth('limits', 'set', 'mail', '--max-running', '1', '--rate', '100/1m');
  assert.equal(set.code, 0, set.err);
  assert.match(set.out, /queue "mail" limited: max 1 running, 100\/1m/);
  const [mail] = await berthJson<QueueLimitStatus[]>('limits', 'list', '--json');
  assert.deepEqual(
    {
      queue: mail?.queue,
      maxRunning: mail?.maxRunning,
      running: mail?.running,
      rateLimit: mail?.rateLimit,
      rateIntervalMs: mail?.rateIntervalMs,
      started: mail?.started,
      atLimit: mail?.atLimit,
      heldTasks: mail?.heldTasks,
      updatedBy: mail?.updatedBy,
    },
    {
      queue: 'mail',
      maxRunning: 1,
      // The task leased before the limit was set counts against it.
      running: 1,
      rateLimit: 100,
      rateIntervalMs: 60_000,
      started: 0,
      atLimit: true,
      heldTasks: 4,
      updatedBy: 'cli:tester',
    },
  );
  const list = await berth('limits', 'list');
  assert.match(list.out, /^QUEUE +MAXRUNNING +RUNNING +RATE +STARTED +HELD +UPDATEDBY +UPDATEDAT$/m);
  assert.match(list.out, /^mail +1 +1 +100\/1m +0 +4 \(at limit\) +cli:tester +\d{4}-\d\d-\d\dT/m);

  const stats = await berth('stats');
  assert.match(stats.out, /^QUEUE +MAXRUNNING +RUNNING +RATE +STARTED +HELD$/m);
  assert.match(stats.out, /^mail +1 +1 +100\/1m +0 +4 \(at limit\)$/m);
  const statsJson = await berthJson<{ limits: QueueLimitStatus[] }>('stats', '--json');
  assert.equal(statsJson.limits[0]?.heldTasks, 4);

  // A flag left out keeps its limit; --no-rate removes one; a higher max is no longer at it.
  assert.match((await berth('limits', 'set', 'mail', '--max-running', '3')).out, /max 3 running, 100\/1m/);
  const noRate = await berth('limits', 'set', 'mail', '--no-rate', '--json');
  assert.deepEqual(
    (JSON.parse(noRate.out) as { limit: { maxRunning: number; rateLimit: number | null } }).limit.rateLimit,
    null,
  );
  const [below] = await listQueueLimits(pool, schema);
  assert.deepEqual([below?.maxRunning, below?.atLimit, below?.heldTasks], [3, false, 0]);

  const cleared = await berth('limits', 'clear', 'mail');
  assert.equal(cleared.code, 0, cleared.err);
  assert.match(cleared.out, /queue "mail": limits cleared/);
  assert.deepEqual(await listQueueLimits(pool, schema), []);
  const again = await berth('limits', 'clear', 'mail');
  assert.equal(again.code, 1);
  assert.match(again.err, /^berth: queue "mail" has no limits$/m);
  assert.doesNotMatch((await berth('stats')).out, /MAXRUNNING/);

  const audit = (await listAudit(pool, schema)).filter((a) => a.action.startsWith('queue.'));
  assert.deepEqual(
    audit.reverse().map((a) => [a.actor, a.action, a.target]),
    [
      ['cli:tester', 'queue.limit', { queue: 'mail', maxRunning: 1, rate: { limit: 100, intervalMs: 60_000 } }],
      ['cli:tester', 'queue.limit', { queue: 'mail', maxRunning: 3 }],
      ['cli:tester', 'queue.limit', { queue: 'mail', rate: null }],
      ['cli:tester', 'queue.unlimit', { queue: 'mail' }],
      ['cli:tester', 'queue.unlimit', { queue: 'mail' }],
    ],
  );
});

test('bad input: one line naming the field, exit 2, and no limit set', async () => {
  await dueWork('reports', 1, false);
  const cases: [string[], RegExp][] = [
    [
      ['--max-running', '0'],
      /option '--max-running <n>' argument '0' is invalid\. expected an integer from 1 to 1000000/,
    ],
    [['--max-running', '-3'], /option '--max-running <n>' argument '-3' is invalid/],
    [['--max-running', '2.5'], /option '--max-running <n>' argument '2\.5' is invalid/],
    [['--max-running', 'many'], /option '--max-running <n>' argument 'many' is invalid/],
    [
      ['--rate', '20'],
      /option '--rate <count\/interval>' argument '20' is invalid\. rate must be a count and an interval/,
    ],
    [['--rate', '0/1s'], /rate's count must be an integer from 1 to 1000000 \(got 0\)/],
    [['--rate', '-1/1s'], /option '--rate <count\/interval>' argument '-1\/1s' is invalid/],
    [['--rate', '20/0s'], /rate's interval \(ms\) must be an integer from 1 to 86400000 \(got 0\)/],
    [['--rate', '20/25h'], /rate's interval \(ms\) must be an integer from 1 to 86400000/],
    [['--rate', '20/1'], /"1" has no unit: write 1ms, 1s, 1m or 1h/],
    [['--rate', '20/1d'], /expected a duration such as 500ms/],
    [['--frobnicate'], /unknown option '--frobnicate'/],
    [[], /limits set: give --max-running, --rate, --no-max-running or --no-rate/],
  ];
  for (const [flags, message] of cases) {
    const r = await berth('limits', 'set', 'reports', ...flags);
    assert.equal(r.code, 2, `${flags.join(' ')}: ${r.err}`);
    assert.ok(oneLine(r.err), r.err);
    assert.match(r.err, /^berth: /);
    assert.match(r.err, message, flags.join(' '));
  }
  const missing = await berth('limits', 'set', 'no-such-queue', '--max-running', '3');
  assert.equal(missing.code, 2);
  assert.ok(oneLine(missing.err), missing.err);
  assert.match(missing.err, /queue "no-such-queue" does not exist/);
  const long = await berth('limits', 'set', 'q'.repeat(300), '--max-running', '3');
  assert.equal(long.code, 2);
  assert.ok(oneLine(long.err), long.err);
  assert.match(long.err, /queue must be a string of at most 255 UTF-8 bytes \(got 300 bytes\)/);
  const unknownVerb = await berth('limits', 'raise', 'reports');
  assert.equal(unknownVerb.code, 2);
  assert.match(unknownVerb.err, /unknown command "raise" \(commands here: list, set, clear, type\)/);
  assert.deepEqual(await listQueueLimits(pool, schema), []);
});

test('limits list escapes control characters in a queue name; its JSON keeps them exact', async () => {
  const queue = `q\u001b]0;pwned\u0007-${process.pid}`;
  await dueWork(queue, 1, false);
  assert.equal((await berth('limits', 'set', queue, '--rate', '5/250ms')).code, 0);
  const text = await berth('limits', 'list');
  // biome-ignore lint/suspicious/noControlCharactersInRegex: the test looks for raw control characters
  assert.doesNotMatch(text.out, /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/);
  assert.ok(text.out.includes('q\\x1b]0;pwned\\x07'), text.out);
  assert.match(text.out, / 5\/250ms /);
  const json = await berthJson<QueueLimitStatus[]>('limits', 'list', '--json');
  assert.equal(json.find((l) => l.rateLimit === 5)?.queue, queue);
  assert.equal((await berth('limits', 'clear', queue)).code, 0);
});

test('limits type set | list | clear: a task type rate limit, audited; bad input is one line naming the field', async () => {
  const set = await berth('limits', 'type', 'set', 'partner_call', '--rate', '20/1s');
  assert.equal(set.code, 0, set.err);
  assert.match(set.out, /task type "partner_call" limited: 20\/1s/);
  const [limit] = await berthJson<Array<{ type: string; rateLimit: number; rateIntervalMs: number; started: number }>>(
    'limits',
    'type',
    'list',
    '--json',
  );
  assert.deepEqual(
    { type: limit?.type, rateLimit: limit?.rateLimit, rateIntervalMs: limit?.rateIntervalMs, started: limit?.started },
    { type: 'partner_call', rateLimit: 20, rateIntervalMs: 1000, started: 0 },
  );
  const list = await berth('limits', 'type', 'list');
  assert.match(list.out, /partner_call\s+20\/1s\s+0\s+0\s+0\s+cli:tester/);
  const stats = await berth('stats');
  assert.match(stats.out, /TYPE\s+RATE\s+STARTED\s+PACED\s+REFUSED/);
  const statsJson = await berthJson<{ typeLimits: Array<{ type: string }> }>('stats', '--json');
  assert.deepEqual(
    statsJson.typeLimits.map((l) => l.type),
    ['partner_call'],
  );
  for (const [flags, message] of [
    [['--rate', '0/1s'], /rate's count must be an integer from 1 to 1000000 \(got 0\)/],
    [['--rate', '20'], /rate must be a count and an interval/],
    [[], /required option '--rate <count\/interval>' not specified/],
  ] as [string[], RegExp][]) {
    const r = await berth('limits', 'type', 'set', 'partner_call', ...flags);
    assert.equal(r.code, 2, `${flags.join(' ')}: ${r.err}`);
    assert.ok(oneLine(r.err), r.err);
    assert.match(r.err, message);
  }
  const long = await berth('limits', 'type', 'set', 't'.repeat(201), '--rate', '1/1s');
  assert.equal(long.code, 2);
  assert.ok(oneLine(long.err), long.err);
  assert.match(long.err, /type must be a non-empty string of at most 200 characters/);
  const cleared = await berth('limits', 'type', 'clear', 'partner_call');
  assert.equal(cleared.code, 0, cleared.err);
  assert.match(cleared.out, /task type "partner_call": rate limit cleared/);
  const again = await berth('limits', 'type', 'clear', 'partner_call');
  assert.equal(again.code, 1);
  assert.match(again.err, /task type "partner_call" has no rate limit/);
  const audit = await listAudit(pool, schema);
  assert.deepEqual(
    audit
      .filter((a) => a.action.startsWith('type.'))
      .map((a) => [a.actor, a.action, a.target, (a.result as { error?: string } | null)?.error !== undefined])
      .reverse(),
    [
      ['cli:tester', 'type.limit', { type: 'partner_call', rate: { limit: 20, intervalMs: 1000 } }, false],
      // Refused by setTypeLimit's own check, inside the audited action: recorded, with its error.
      ['cli:tester', 'type.limit', { type: 't'.repeat(201), rate: { limit: 1, intervalMs: 1000 } }, true],
      ['cli:tester', 'type.unlimit', { type: 'partner_call' }, false],
      ['cli:tester', 'type.unlimit', { type: 'partner_call' }, false],
    ],
  );
});
