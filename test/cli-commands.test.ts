import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { main } from '../src/cli.js';
import { enqueue, getTask, listAudit } from '../src/index.js';
import { errorDetail } from '../src/util/error-detail.js';
import { claimParams } from './claim-params.js';
import { DATABASE_URL, freshSchema, waitFor } from './helpers.js';
import { cliOn } from './support/run-cli.js';

const { schema, pool } = await freshSchema('clicmd');
const S = `"${schema}"`;
process.env.BERTH_ACTOR = 'cli:tester';

/** The CLI in this process on this file's schema: its exit code and what it printed. */
const { berth, berthJson } = cliOn(schema, DATABASE_URL);

/** The parts of the CLI's JSON output these tests read. */
interface TaskPageJson {
  tasks: { id: string }[];
  next: string | null;
}
interface DeadPageJson {
  deadLetters: unknown[];
}
interface QueueJson {
  queue: string;
  paused: boolean;
  pausedBy: string | null;
  reason: string | null;
}

async function killTask(id: string): Promise<void> {
  await pool.query(
    `WITH d AS (DELETE FROM ${S}.deferred WHERE id = $1 RETURNING *)
     INSERT INTO ${S}.dead_letters (id, type, payload, queue, priority, shard, attempts, max_attempts, last_error, created_at, last_attempted_at)
     SELECT id, type, payload, queue, priority, shard, 1, 1, 'cli fixture failure', created_at, now() FROM d`,
    [id],
  );
}

test('enqueue: JSON payload and options; bad JSON is a usage error that enqueues nothing', async () => {
  const ok = await berth('enqueue', 'cli_ok', '{"n":1}', '--queue', 'cli-q', '--priority', '2', '--json');
  assert.equal(ok.code, 0, ok.err);
  const r = JSON.parse(ok.out);
  assert.equal(r.state, 'ready');
  const t = await getTask(pool, schema, r.id);
  assert.deepEqual([t?.queue, t?.priority, t?.payload], ['cli-q', 2, { n: 1 }]);

  const later = await berth('enqueue', 'cli_ok', '{}', '--delay', '15m');
  assert.match(later.out, /enqueued task \d+ \(scheduled\)/);

  const before = await pool.query(`SELECT count(*) FROM ${S}.ready`);
  const bad = await berth('enqueue', 'cli_ok', '{n:1}');
  assert.equal(bad.code, 2);
  assert.match(bad.err, /payload is not valid JSON/);
  const badDelay = await berth('enqueue', 'cli_ok', '{}', '--delay', 'soon');
  assert.equal(badDelay.code, 2);
  assert.match(badDelay.err, /expected a duration/);
  const both = await berth('enqueue', 'cli_ok', '{}', '--delay', '5s', '--run-at', '2030-01-01T00:00:00Z');
  assert.equal(both.code, 2);
  assert.match(both.err, /--run-at or --delay, not both/);
  // What PostgreSQL would refuse is refused by the same checks as the library's enqueue.
  const nul = await berth('enqueue', 'cli_ok', '{"a":{"b":"x\\u0000"}}');
  assert.equal(nul.code, 2, nul.err);
  assert.match(nul.err, /task \(cli_ok\): payload\.a\.b contains a NUL character/);
  const longKey = await berth('enqueue', 'cli_ok', '{}', '--dedupe-key', 'k'.repeat(2700));
  assert.equal(longKey.code, 2, longKey.err);
  assert.match(longKey.err, /dedupeKey must be a non-empty string of at most 1024 UTF-8 bytes/);
  const farRunAt = await berth('enqueue', 'cli_ok', '{}', '--run-at', '+020000-01-01T00:00:00Z');
  assert.equal(farRunAt.code, 2, farRunAt.err);
  assert.match(farRunAt.err, /runAt must be a valid Date from year 1 to 9999/);
  assert.deepEqual((await pool.query(`SELECT count(*) FROM ${S}.ready`)).rows, before.rows);
  // Any name is a queue, the empty one included (seed 003-44), and so it can be paused.
  assert.equal((await berth('enqueue', 'cli_ok', '{}', '--queue', '')).code, 0);
  assert.equal((await berth('queues', 'pause', '')).code, 0);
  assert.equal((await berth('queues', 'resume', '')).code, 0);
});

test('tasks list / show / retry / cancel / delete / move, with keyset pages and meaningful exit codes', async () => {
  const ids: string[] = [];
  for (let i = 0; i < 5; i++) ids.push((await enqueue(pool, 'cli_page', { i }, { schema, queue: 'pages' })).id!);
  const first = await berthJson<TaskPageJson>('tasks', 'list', '--type', 'cli_page', '--limit', '3', '--json');
  assert.deepEqual(
    first.tasks.map((t) => t.id),
    ids.slice(2).reverse(),
  );
  const text = await berth('tasks', 'list', '--type', 'cli_page', '--limit', '3');
  assert.match(
    text.out,
    new RegExp(`more: berth tasks list --type cli_page --limit 3 --schema ${schema} --after ${first.next}$`, 'm'),
  );
  const second = await berthJson<TaskPageJson>(
    'tasks',
    'list',
    '--type',
    'cli_page',
    '--limit',
    '3',
    '--after',
    first.next!,
    '--json',
  );
  assert.deepEqual(
    second.tasks.map((t) => t.id),
    ids.slice(0, 2).reverse(),
  );
  assert.equal(second.next, null);

  const bad = await berth('tasks', 'list', '--state', 'finished');
  assert.equal(bad.code, 2);
  assert.match(bad.err, /unknown state "finished"/);

  const show = await berth('tasks', 'show', ids[0]!);
  assert.equal(show.code, 0, show.err);
  assert.match(show.out, /cli_page {2}ready/);
  assert.match(show.out, /"i": 0/);
  assert.match(show.out, /timeline:\n.*created/);

  assert.equal((await berth('tasks', 'move', ids[1]!, '--queue', 'elsewhere')).code, 0);
  assert.equal((await getTask(pool, schema, ids[1]!))?.queue, 'elsewhere');
  assert.equal((await berth('tasks', 'move', ids[1]!)).code, 2, 'move needs a target');
  assert.equal((await berth('tasks', 'cancel', ids[2]!)).code, 0);
  // It stays visible as cancelled, by the CLI's actor; a second cancel says so and changes nothing.
  const cancelled = await getTask(pool, schema, ids[2]!);
  assert.equal(cancelled?.state, 'cancelled');
  assert.equal(cancelled?.cancelled?.actor, 'cli:tester');
  const listedCancelled = await berth('tasks', 'list', '--state', 'cancelled');
  assert.equal(listedCancelled.code, 0, listedCancelled.err);
  assert.match(listedCancelled.out, new RegExp(`^${ids[2]}\\s.*cancelled.*cancelled by cli:tester`, 'm'));
  const gone = await berth('tasks', 'cancel', ids[2]!);
  assert.equal(gone.code, 1);
  assert.match(gone.err, new RegExp(`task ${ids[2]} was already cancelled, by cli:tester at `));
  assert.equal(gone.out, '', 'a failure is reported once, on stderr');
  const goneJson = await berth('tasks', 'cancel', ids[2]!, '--json');
  assert.equal(goneJson.code, 1);
  assert.deepEqual(
    JSON.parse(goneJson.out),
    { id: ids[2], result: 'already_settled' },
    '--json prints the result even when it fails',
  );
  const notRetryable = await berth('tasks', 'retry', ids[3]!);
  assert.equal(notRetryable.code, 1);
  assert.match(notRetryable.err, /already ready/);
  const badId = await berth('tasks', 'show', 'abc');
  assert.equal(badId.code, 2);
  assert.match(badId.err, /bad task id "abc"/, 'a bad id is said, not just an exit code');
  const huge = await berth('tasks', 'retry', '9999999999999999999');
  assert.equal(huge.code, 2);
  assert.match(huge.err, /up to 9223372036854775807/);
  assert.equal((await berth('tasks', 'show', '987654321')).code, 1);

  const sched = await enqueue(pool, 'cli_page', {}, { schema, delay: 3600_000 });
  await killTask(sched.id!);
  const cancelDead = await berth('tasks', 'cancel', sched.id!);
  assert.equal(cancelDead.code, 1);
  assert.match(cancelDead.err, /is a dead letter, not pending: retry or delete it/);
  assert.equal((await berth('tasks', 'retry', sched.id!)).code, 0);
  assert.equal((await getTask(pool, schema, sched.id!))?.state, 'ready');
  assert.equal((await berth('tasks', 'delete', sched.id!)).code, 0);

  const audit = await listAudit(pool, schema);
  assert.ok(audit.some((a) => a.action === 'task.cancel' && a.actor === 'cli:tester'));
  assert.ok(audit.some((a) => a.action === 'task.move'));
});

test('dead list / retry / purge: bulk actions need a filter or --all', async () => {
  const dead: string[] = [];
  for (let i = 0; i < 4; i++) {
    const r = await enqueue(pool, i < 3 ? 'cli_dead_a' : 'cli_dead_b', {}, { schema, queue: 'deadq', delay: 3600_000 });
    await killTask(r.id!);
    dead.push(r.id!);
  }
  const list = await berthJson<DeadPageJson>('dead', 'list', '--queue', 'deadq', '--json');
  assert.equal(list.deadLetters.length, 4);
  const noFilter = await berth('dead', 'retry');
  assert.equal(noFilter.code, 2);
  assert.match(noFilter.err, /needs a filter .* \(--all on the CLI\)/);
  const emptyFilter = await berth('dead', 'purge', '--error', '');
  assert.equal(emptyFilter.code, 2, 'an empty filter is not a filter');
  assert.match(emptyFilter.err, /error filter must not be empty/);
  const hint = await berth('dead', 'list', '--type', 'cli_dead_a', '--limit', '1');
  assert.match(
    hint.out,
    new RegExp(`more: berth dead list --type cli_dead_a --limit 1 --schema ${schema} --after \\d+`),
  );
  assert.equal((await berth('dead', 'purge')).code, 2);

  const retried = await berthJson<unknown>('dead', 'retry', '--type', 'cli_dead_a', '--json');
  assert.deepEqual(retried, { matched: 3, changed: 3, duplicates: 0 });
  const one = await berth('dead', 'retry', '--id', dead[3]!);
  assert.match(one.out, /retried 1 of 1/);
  const again = await enqueue(pool, 'cli_dead_b', {}, { schema, queue: 'deadq', delay: 3600_000 });
  await killTask(again.id!);
  const purged = await berth('dead', 'purge', '--all');
  assert.match(purged.out, /purged \d+ dead letter/);
  assert.equal((await berthJson<DeadPageJson>('dead', 'list', '--json')).deadLetters.length, 0);
});

test('queues pause / list / resume; stats; leader exits 1 with no leader', async () => {
  await enqueue(pool, 'cli_ok', {}, { schema, queue: 'pq' });
  assert.equal((await berth('queues', 'pause', 'pq', '--reason', 'deploy')).code, 0);
  const list = await berthJson<QueueJson[]>('queues', 'list', '--json');
  const pq = list.find((q) => q.queue === 'pq');
  assert.equal(pq?.paused, true);
  assert.equal(pq?.pausedBy, 'cli:tester');
  assert.equal(pq?.reason, 'deploy');
  const stats = await berthJson<{ queues: QueueJson[] }>('stats', '--json');
  assert.equal(stats.queues.find((q) => q.queue === 'pq')?.paused, true);
  const table = await berth('stats');
  assert.match(table.out, /QUEUE +PENDING +RUNNING +DEAD/);
  assert.match(table.out, /LANEID +QUEUE +PRIORITY +SHARD +DEPTH +DUEDEFERRED +OLDESTDUE +RUNNING +DEAD/);
  assert.equal((await berth('queues', 'resume', 'pq')).code, 0);
  const notPaused = await berth('queues', 'resume', 'pq');
  assert.equal(notPaused.code, 1);
  assert.match(notPaused.err, /queue "pq" is not paused/);
  await enqueue(pool, 'cli_ok', {}, { schema, queue: 'future-only', delay: 3600_000 });
  const queues = (await berthJson<QueueJson[]>('queues', 'list', '--json')).map((q) => q.queue);
  assert.ok(queues.includes('future-only'), 'a queue with only scheduled work is listed (and so can be paused)');
  assert.equal((await berthJson<QueueJson[]>('queues', 'list', '--json')).find((q) => q.queue === 'pq')?.paused, false);

  const leader = await berth('leader');
  assert.equal(leader.code, 1);
  assert.match(leader.out, /no maintenance leader/);
});

test("worker --tasks <module> --drain runs the module's handlers until no due work is left", async () => {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dedupe`,
  );
  for (let i = 0; i < 20; i++) await enqueue(pool, 'cli_ok', { n: i }, { schema });
  await enqueue(pool, 'cli_fail', {}, { schema });
  const mod = fileURLToPath(new URL('./fixtures/cli-tasks.ts', import.meta.url));
  const r = await berth('worker', '--tasks', mod, '--drain', '--no-maintenance');
  assert.equal(r.code, 0, r.err);
  const left = await pool.query(
    `SELECT count(*)::int AS n FROM ${S}.ready r WHERE NOT EXISTS (SELECT 1 FROM ${S}.leased_entries s WHERE s.id = r.id AND s.lane_id = r.lane_id AND s.lane_seq = r.lane_seq AND s.slot = r.slot AND s.outcome IS NOT NULL)`,
  );
  assert.equal(left.rows[0].n, 0);
  assert.equal(
    (await pool.query(`SELECT count(*)::int AS n FROM ${S}.dead_letters WHERE type = 'cli_fail'`)).rows[0].n,
    1,
  );
});

test('completed tasks and every attempt error stay visible after the ring forgets them: tasks show/list, history list/show/set', async () => {
  // After the drain above: reclaim the ring as the leader's prune would.
  await pool.query(`TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones`);
  const completed = await berthJson<TaskPageJson>('tasks', 'list', '--state', 'completed', '--json', '--limit', '500');
  assert.equal(completed.tasks.length, 20);
  const okId = completed.tasks[0]!.id;
  const shown = await berth('tasks', 'show', okId);
  assert.equal(shown.code, 0, shown.err);
  assert.match(shown.out, /cli_ok {2}completed/);
  assert.match(shown.out, /payload: not kept/);
  assert.match(shown.out, /#1 {2}success/);
  const failed = (await pool.query(`SELECT id::text FROM ${S}.dead_letters WHERE type = 'cli_fail'`)).rows[0].id;
  const failShown = await berth('tasks', 'show', failed);
  assert.match(failShown.out, /#1 {2}failure \(dead-lettered\)/);
  assert.match(
    failShown.out,
    /error: cli fixture failure\n\s+at /,
    'the stack follows without repeating the error line',
  );
  const attempts = await berthJson<{ attempts: { id: string; outcome: string }[] }>(
    'history',
    'list',
    '--outcome',
    'failure',
    '--json',
  );
  assert.deepEqual(
    attempts.attempts.map((a) => a.id),
    [failed],
  );
  const table = await berth('history', 'list', '--type', 'cli_ok', '--limit', '5');
  assert.match(table.out, /more: berth history list --type cli_ok --limit 5 .*--after \d+:\d+$/);
  const set = await berthJson<{ enabled: boolean; retentionMs: number }>(
    'history',
    'set',
    '--off',
    '--retention',
    '48h',
    '--json',
  );
  assert.deepEqual([set.enabled, set.retentionMs], [false, 48 * 3_600_000]);
  assert.match((await berth('history', 'show')).out, /attempt history off, kept 48h/);
  assert.equal((await berth('history', 'set', '--retention', '1s')).code, 2, 'too short a retention is a usage error');
  await berthJson('history', 'set', '--on', '--retention', '24h', '--json');
  const audit = await listAudit(pool, schema, { limit: 5 });
  assert.ok(audit.some((e) => e.action === 'history.set'));
});

test('worker refuses a module that is not a task module, or a missing one, with exit 2', async () => {
  const notTasks = await berth('worker', '--tasks', fileURLToPath(new URL('./fixtures/not-tasks.ts', import.meta.url)));
  assert.equal(notTasks.code, 2);
  assert.match(notTasks.err, /tasks\[0\] is not a task definition/);
  const missing = await berth('worker', '--tasks', '/nonexistent/tasks.js');
  assert.equal(missing.code, 2);
  assert.match(missing.err, /cannot load task module/);
  const noTasks = await berth('worker');
  assert.equal(noTasks.code, 2);
  const both = await berth(
    'worker',
    '--tasks',
    fileURLToPath(new URL('./fixtures/cli-tasks.ts', import.meta.url)),
    '--queue',
    'a',
    '--all-queues',
  );
  assert.equal(both.code, 2);
  assert.match(both.err, /--queue and --all-queues exclude each other/);
  const unmigrated = await main([
    'node',
    'berth',
    'stats',
    '--schema',
    'never_migrated_here',
    '--database-url',
    DATABASE_URL,
  ]);
  assert.equal(unmigrated, 2, 'an unmigrated schema is a configuration problem with the fix in the message');
});

/** Start a long-running command in this process, wait for the line it prints, stop it with SIGINT. */
async function longRunning(
  args: string[],
  line: RegExp,
): Promise<{ match: RegExpMatchArray; stop: () => Promise<number> }> {
  const log = console.log;
  let resolveLine: (m: RegExpMatchArray) => void;
  const seen = new Promise<RegExpMatchArray>((r) => (resolveLine = r));
  console.log = (...a: unknown[]) => {
    const m = a.join(' ').match(line);
    if (m) resolveLine(m);
  };
  const done = main(['node', 'berth', ...args, '--schema', schema, '--database-url', DATABASE_URL]);
  try {
    const match = await Promise.race([
      seen,
      done.then((code) => {
        throw new Error(`exited ${code} before printing ${line}`);
      }),
    ]);
    return {
      match,
      stop: async () => {
        process.emit('SIGINT', 'SIGINT');
        return done;
      },
    };
  } finally {
    console.log = log;
  }
}

test('berth dashboard serves the dashboard until SIGINT; refuses a non-loopback host without auth', async () => {
  const { match, stop } = await longRunning(['dashboard', '--port', '0'], /berth dashboard: (http:\/\/\S+)/);
  const res = await fetch(new URL('api/queues', match[1]));
  assert.equal(res.status, 200);
  assert.ok(Array.isArray(await res.json()) || true);
  assert.equal(await stop(), 0);
  const open = await berth('dashboard', '--host', '0.0.0.0', '--port', '0');
  assert.equal(open.code, 2);
  assert.match(open.err, /no authentication/);
  const badEnv = process.env.BERTH_DASHBOARD_PORT;
  process.env.BERTH_DASHBOARD_PORT = 'eighty';
  try {
    const bad = await berth('dashboard');
    assert.equal(bad.code, 2);
    assert.match(bad.err, /BERTH_DASHBOARD_PORT must be a port number/);
  } finally {
    if (badEnv === undefined) delete process.env.BERTH_DASHBOARD_PORT;
    else process.env.BERTH_DASHBOARD_PORT = badEnv;
  }
});

test('tasks show prints each stack once: a repeated failure names the attempt that printed it, a cause inside its error is not printed again', async () => {
  const type = `cli_stacks_${process.pid}`;
  const { id } = await enqueue(pool, type, {}, { schema, maxAttempts: 5 });
  const lane = (await pool.query(`SELECT lane_id FROM ${S}.ready WHERE id = $1`, [id])).rows[0].lane_id;
  const cause = new Error('socket closed');
  // An error class that appends its cause's stack to its own, as many libraries do.
  const wrapped = new TypeError('upstream failed', { cause });
  wrapped.stack = `${wrapped.stack}\ncaused by: ${cause.stack}`;
  const other = new RangeError('out of range');
  for (const [attempt, err] of [
    [1, wrapped],
    [2, wrapped],
    [3, other],
  ] as const) {
    await pool.query(
      `INSERT INTO ${S}.attempt_history (part, bucket, outcome, lane_id, type, worker, claimed_at, ids, attempts,
                                         created_at, run_ms, error, cursor, dead)
       SELECT hs.current_part, $1::bigint >> 10, 'failure', $2, $3, 'w1', now() - (10 - $4) * interval '1 ms',
              ARRAY[$1::bigint], ARRAY[$4::integer], ARRAY[now()], ARRAY[5], $5::jsonb, NULL, false
         FROM ${S}.history_state hs`,
      [id, lane, type, attempt, JSON.stringify(errorDetail(err))],
    );
  }
  const show = await berth('tasks', 'show', id!);
  assert.equal(show.code, 0, show.err);
  const frame = cause.stack!.split('\n')[1]!.trim();
  const count = (text: string) => show.out.split(text).length - 1;
  assert.equal(count(frame), 1, `the cause's first frame is printed once, in the wrapped stack:\n${show.out}`);
  assert.equal(
    count('at '),
    other.stack!.split('\n').length - 1 + wrapped.stack!.split('\n').filter((l) => /^\s+at /.test(l)).length,
  );
  assert.match(show.out, /#1 {2}failure[^\n]*\n {4}error: TypeError: upstream failed\n {6}\s+at /);
  assert.match(show.out, /caused by: socket closed\n {6}\(stack: within the one above\)/);
  assert.match(
    show.out,
    /#2 {2}failure[^\n]*\n {4}error: TypeError: upstream failed\n {6}\(stack: as in attempt #1 above\)\n {4}caused by: socket closed\n {6}\(stack: as in attempt #1 above\)/,
  );
  assert.match(show.out, /#3 {2}failure[^\n]*\n {4}error: RangeError: out of range\n {6}\s+at /);
  assert.doesNotMatch(show.out, /^\s+(TypeError|RangeError): /m, 'no stack repeats its error line');
});

test('the attempts column reads attempts/limit in every list: tasks list, tasks show, dead list, history list', async () => {
  const type = `cli_attempts_${process.pid}`;
  const own = await enqueue(pool, type, {}, { schema, maxAttempts: 7, delay: 3_600_000 });
  const typed = await enqueue(pool, type, {}, { schema, delay: 3_600_000 });
  await pool.query(`UPDATE ${S}.deferred SET attempts = 2 WHERE id = $1`, [own.id]);
  const list = await berth('tasks', 'list', '--type', type);
  assert.match(list.out, new RegExp(`^${own.id} .* 2/7 `, 'm'), list.out);
  assert.match(list.out, new RegExp(`^${typed.id} .* 0/- `, 'm'), list.out);
  assert.match((await berth('tasks', 'show', own.id!)).out, / attempts 2\/7$/m);
  assert.match((await berth('tasks', 'show', typed.id!)).out, / attempts 0\/-$/m);
  await killTask(own.id!);
  const dead = await berth('dead', 'list', '--type', type);
  assert.match(dead.out, /^ID +TYPE +QUEUE +ATTEMPTS +DIEDAT/m);
  assert.match(dead.out, new RegExp(`^${own.id} .* 1/1 `, 'm'), dead.out);
  const history = await berth('history', 'list', '--limit', '1');
  assert.match(history.out, /^ID +ATTEMPTS +OUTCOME/m);
  assert.match(history.out, /^\d+ +\d+\/- +\w+ /m, history.out);
});

test('forged attempt-history rows (wrong types, a 3,000-deep cause chain, an unknown outcome) never stop a listing, and every output stays bounded', async () => {
  const type = `cli_forged_${process.pid}`;
  const { id } = await enqueue(pool, type, {}, { schema });
  const lane = (await pool.query(`SELECT lane_id FROM ${S}.ready WHERE id = $1`, [id])).rows[0].lane_id;
  let deep: Record<string, unknown> = { message: 'the bottom' };
  for (let i = 0; i < 3000; i++) deep = { message: `link ${i}`, cause: deep };
  const forged = [
    { outcome: 'failure', error: { message: 42, name: { not: 'a string' }, stack: ['a', 'b'], cause: deep } },
    { outcome: 'bogus', error: 'just a string' },
    { outcome: 'failure', error: { message: 'x'.repeat(100_000) } },
  ];
  // What a worker role can write: attempt_history is INSERT-able by it.
  for (const f of forged) {
    await pool.query(
      `INSERT INTO ${S}.attempt_history (part, bucket, outcome, lane_id, type, worker, claimed_at, ids, attempts,
                                         created_at, run_ms, error, cursor, dead)
       SELECT hs.current_part, $1::bigint >> 10, $2, $3, $4, $5, now(), ARRAY[$1::bigint], ARRAY[1], ARRAY[now()],
              ARRAY[NULL::integer], $6::jsonb, NULL, false
         FROM ${S}.history_state hs`,
      [id, f.outcome, lane, type, 'w\u001b[31m'.repeat(100), JSON.stringify(f.error)],
    );
  }
  const list = await berth('history', 'list', '--type', type);
  assert.equal(list.code, 0, list.err);
  assert.equal(list.out.match(/\(malformed row\)/g)?.length, 3, list.out);
  const json = await berth('history', 'list', '--type', type, '--json');
  assert.equal(json.code, 0, json.err);
  assert.ok(json.out.length < 100_000, `--json printed ${json.out.length} characters`);
  const page = JSON.parse(json.out) as { attempts: { invalid?: string[]; error: { message: string } | null }[] };
  assert.equal(page.attempts.length, 3);
  assert.ok(page.attempts.every((a) => (a.invalid?.length ?? 0) > 0));
  assert.ok(
    page.attempts.some((a) => a.invalid!.some((p) => /cause chain is longer than 4 \(2998 more left out\)/.test(p))),
  );
  const show = await berth('tasks', 'show', id!);
  assert.equal(show.code, 0, show.err);
  assert.equal(show.out.match(/malformed row, shown as far as it reads/g)?.length, 3);
  assert.match(show.out, /timeline:/, 'the listing went on to the end');
  assert.ok(show.out.length < 100_000, `tasks show printed ${show.out.length} characters`);
});

test('berth dashboard logs what a client sent (a Basic user name) with C1 and bidi controls escaped, as the worker does', async () => {
  const users = process.env.BERTH_DASHBOARD_USERS;
  process.env.BERTH_DASHBOARD_USERS = 'alice:a-long-enough-password';
  const written: string[] = [];
  const write = process.stdout.write.bind(process.stdout);
  try {
    const { match, stop } = await longRunning(['dashboard', '--port', '0'], /berth dashboard: (http:\/\/\S+)/);
    process.stdout.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
      written.push(String(chunk));
      return (write as (c: string | Uint8Array, ...r: unknown[]) => boolean)(chunk, ...rest);
    }) as typeof process.stdout.write;
    const user = 'ev\u009b31m\u202eil\u200f';
    const res = await fetch(new URL('api/queues', match[1]), {
      headers: { authorization: `Basic ${Buffer.from(`${user}:wrong`).toString('base64')}` },
    });
    assert.equal(res.status, 401);
    await waitFor(() => written.some((l) => l.includes('ev')), 10_000, 'the failed authentication logged');
    process.stdout.write = write;
    assert.equal(await stop(), 0);
    const line = written.find((l) => l.includes('ev'))!;
    assert.doesNotMatch(line, /[\u0080-\u009f\u202a-\u202e\u200e\u200f]/u, 'no raw C1 or bidi control');
    assert.ok(line.includes('\\u009b') && line.includes('\\u202e') && line.includes('\\u200f'), line);
    JSON.parse(line);
  } finally {
    process.stdout.write = write;
    if (users === undefined) delete process.env.BERTH_DASHBOARD_USERS;
    else process.env.BERTH_DASHBOARD_USERS = users;
  }
});

test('berth worker --http-port serves /metrics (and the dashboard with --dashboard)', async () => {
  const mod = fileURLToPath(new URL('./fixtures/cli-tasks.ts', import.meta.url));
  const { match, stop } = await longRunning(
    ['worker', '--tasks', mod, '--no-maintenance', '--http-port', '0', '--dashboard'],
    /metrics at (http:\/\/\S+\/metrics), dashboard at (http:\/\/\S+)/,
  );
  try {
    const metrics = await fetch(match[1]!);
    assert.equal(metrics.status, 200);
    assert.match(await metrics.text(), /berth_task_slots 4/);
    const page = await fetch(match[2]!);
    assert.equal(page.status, 200);
  } finally {
    assert.equal(await stop(), 0);
  }
  assert.equal((await berth('worker', '--tasks', mod, '--dashboard')).code, 2, '--dashboard needs --http-port');
});

test('nothing from the database reaches the terminal raw: ANSI, OSC, C1 CSI, CR and friends are escaped; --json stays exact', async () => {
  const { claim } = await import('../src/processor/claim.js');
  // Every control a terminal acts on (DEL, C1 and U+2028 included), in every column printed.
  // biome-ignore lint/suspicious/noControlCharactersInRegex: the test looks for raw control characters
  const RAW = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u2028\u2029\u202e]/u;
  const type = 'esc\u001b[31mRED\u001b[0m';
  const queue = `q\u001b]0;pwned\u0007\u009b2J-${process.pid}`;
  const dedupeKey = 'k\u009b31m\r\u0008over';
  const payload = { s: '\u001b[2J\u009b31m\u2028\u0007\u0008x', t: 'ünïcode stays' };
  const lastError = 'boom\u001b]8;;http://evil.example\u0007link\u001b]8;;\u0007\r\nsecond line\u202e';
  const ready = await enqueue(pool, type, payload, { schema, queue, dedupeKey });
  const dead = await enqueue(pool, type, payload, { schema, queue, delay: 3600_000 });
  await killTask(dead.id!);
  await pool.query(`UPDATE ${S}.dead_letters SET last_error = $2 WHERE id = $1`, [dead.id, lastError]);
  const lane = (await pool.query(`SELECT lane_id FROM ${S}.ready WHERE id = $1`, [ready.id])).rows[0].lane_id as number;
  const leased = await claim(pool, claimParams(schema, [lane], 1, { workerId: 'w\u001b[5mblink\u009d' }));
  assert.equal(leased.length, 1);

  const runs = {
    tasksList: await berth('tasks', 'list', '--queue', queue),
    tasksShowReady: await berth('tasks', 'show', ready.id!),
    tasksShowDead: await berth('tasks', 'show', dead.id!),
    deadList: await berth('dead', 'list', '--queue', queue),
    queuesList: await berth('queues', 'list'),
    stats: await berth('stats'),
    resume: await berth('queues', 'resume', queue),
  };
  for (const [name, r] of Object.entries(runs)) {
    assert.doesNotMatch(r.out, RAW, `${name}: stdout`);
    assert.doesNotMatch(r.err, RAW, `${name}: stderr`);
  }
  assert.equal(runs.resume.code, 1);
  assert.ok(runs.resume.err.includes('\\x1b]0;pwned\\x07\\x9b2J'), runs.resume.err);
  // Escaped, not dropped: the text is still there to read.
  assert.ok(runs.tasksList.out.includes('esc\\x1b[31mRED\\x1b[0m'), runs.tasksList.out);
  assert.ok(runs.tasksShowReady.out.includes('dedupe key k\\x9b31m\\r\\x08over'), runs.tasksShowReady.out);
  assert.ok(runs.tasksShowReady.out.includes('worker w\\x1b[5mblink\\x9d'), runs.tasksShowReady.out);
  assert.ok(runs.tasksShowReady.out.includes('ünïcode stays'));
  assert.ok(runs.tasksShowDead.out.includes('link\\x1b]8;;\\x07\\r\nsecond line\\u202e'), runs.tasksShowDead.out);
  assert.ok(runs.queuesList.out.includes('\\x1b]0;pwned'), runs.queuesList.out);

  // --json: valid JSON, the exact values, and no raw control either (C1 and U+2028 as \u escapes).
  const json = await berth('tasks', 'show', dead.id!, '--json');
  assert.doesNotMatch(json.out, RAW);
  const task = JSON.parse(json.out).task;
  assert.deepEqual(
    { type: task.type, queue: task.queue, payload: task.payload, lastError: task.lastError },
    { type, queue, payload, lastError },
  );
  for (const args of [['tasks', 'list'], ['dead', 'list'], ['queues', 'list'], ['stats']]) {
    const r = await berth(...args, '--json');
    assert.doesNotMatch(r.out, RAW, args.join(' '));
    JSON.parse(r.out);
  }
});

test('escapeControl / jsonSafe: every C0 and C1 control, DEL, U+2028/9, bidi overrides and direction marks; text and JSON values otherwise unchanged', async () => {
  const { escapeControl, escapeControlKeepLines, jsonSafe } = await import('../src/cli/terminal.js');
  const all =
    Array.from({ length: 0x20 }, (_, i) => String.fromCharCode(i)).join('') +
    '\u007f' +
    Array.from({ length: 0x20 }, (_, i) => String.fromCharCode(0x80 + i)).join('') +
    '\u2028\u2029\u202a\u202e\u2066\u2069\u200e\u200f\u061c';
  const escaped = escapeControl(all);
  assert.doesNotMatch(escaped, /[^\x20-\x7e]/, 'only printable ASCII left');
  assert.ok(escaped.startsWith('\\x00\\x01'));
  assert.ok(escaped.includes('\\x07\\x08\\t\\n\\x0b\\x0c\\r'));
  assert.ok(
    escaped.includes('\\x1b') && escaped.includes('\\x7f') && escaped.includes('\\x9b') && escaped.includes('\\u2028'),
  );
  assert.ok(escaped.endsWith('\\u200e\\u200f\\u061c'), 'the direction marks too');
  assert.equal(escapeControlKeepLines('a\nb\r\n'), 'a\nb\\r\n');
  assert.equal(escapeControl('plain, ünï 漢字 🙂 text'), 'plain, ünï 漢字 🙂 text');
  const value = { s: all, k: 'ok' };
  const safe = jsonSafe(JSON.stringify(value));
  assert.doesNotMatch(safe, /[^\x20-\x7e]/);
  assert.deepEqual(JSON.parse(safe), value);
});
