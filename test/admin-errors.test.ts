/**
 * Every admin action, through the library and through `berth`, answers bad input (a malformed
 * task id, a queue or type name no task can have) with a BerthInputError and a schema nobody
 * migrated with a SchemaNotMigratedError: never a bare PostgreSQL code (22P02, 22021, 3F000,
 * 42P01, 42883). The CLI prints one line and exits non-zero, with no stack.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  attemptsOf,
  BerthInputError,
  cancelTask,
  cancelTasks,
  deleteTask,
  dequeue,
  listAttempts,
  moveTask,
  pauseQueue,
  purgeDead,
  resumeQueue,
  retryDead,
  retryDeadLetters,
  retryTask,
  SchemaNotMigratedError,
  setHistorySettings,
  taskTimeline,
} from '../src/index.js';
import { quoteIdent } from '../src/sql.js';
import { DATABASE_URL, freshSchema } from './helpers.js';
import { runCli } from './support/run-cli.js';

const { schema, pool } = await freshSchema('admin_errors');
/** An empty schema (it exists, nothing in it) and one that does not exist at all. */
const empty = `${schema}_empty`;
const missing = `${schema}_missing`;
await pool.query(`DROP SCHEMA IF EXISTS ${quoteIdent(empty)} CASCADE`);
await pool.query(`CREATE SCHEMA ${quoteIdent(empty)}`);
process.env.BERTH_ACTOR = 'cli:tester';

const BAD_IDS = [
  'abc',
  '-1',
  '99999999999999999999',
  '9223372036854775808',
  '0',
  '1.5',
  '',
  ' 1',
  '+1',
  '\u0663',
  '\uff11',
  '1\u0000',
  '9'.repeat(10_240),
];
const BAD_QUEUES = ['q\u0000nul', 'q'.repeat(256), 'lone \ud800 surrogate'];
const BAD_TYPES = ['t\u0000nul', 't'.repeat(201)];
const RAW_CODE = /\b(22P02|22021|22P05|3F000|42P01|42883)\b|syntax for type|does not exist|invalid byte sequence/;

/** One action of each kind on a task id. */
const BY_ID: Record<string, (s: string, id: string) => Promise<unknown>> = {
  retryTask: (s, id) => retryTask(pool, s, id),
  cancelTask: (s, id) => cancelTask(pool, s, id, { actor: 'test' }),
  deleteTask: (s, id) => deleteTask(pool, s, id),
  moveTask: (s, id) => moveTask(pool, s, id, { priority: 1 }),
  retryDeadLetters: (s, id) => retryDeadLetters(pool, s, [id]),
  'retryDead ids': (s, id) => retryDead(pool, s, { ids: [id] }),
  'purgeDead ids': (s, id) => purgeDead(pool, s, { ids: [id] }),
  taskTimeline: (s, id) => taskTimeline(pool, s, id),
  attemptsOf: (s, id) => attemptsOf(pool, s, id),
  'dequeue unleased': (s, id) => dequeue(pool, s, id, ''),
};

/** One action of each kind on a queue name. */
const BY_QUEUE: Record<string, (s: string, queue: string) => Promise<unknown>> = {
  pauseQueue: (s, q) => pauseQueue(pool, s, q, 'test'),
  resumeQueue: (s, q) => resumeQueue(pool, s, q, 'test'),
  'moveTask to': (s, q) => moveTask(pool, s, '1', { queue: q }),
  'cancelTasks queue': (s, q) => cancelTasks(pool, s, { queue: q }),
  'retryDead queue': (s, q) => retryDead(pool, s, { queue: q }),
  'purgeDead queue': (s, q) => purgeDead(pool, s, { queue: q }),
  'listAttempts queue': (s, q) => listAttempts(pool, s, { queue: q }),
};

const BY_TYPE: Record<string, (s: string, type: string) => Promise<unknown>> = {
  'cancelTasks type': (s, t) => cancelTasks(pool, s, { type: t }),
  'retryDead type': (s, t) => retryDead(pool, s, { type: t }),
  'purgeDead type': (s, t) => purgeDead(pool, s, { type: t }),
  'listAttempts type': (s, t) => listAttempts(pool, s, { type: t }),
};

async function refused(
  what: string,
  run: () => Promise<unknown>,
  kind: abstract new (...args: never[]) => Error,
): Promise<void> {
  await assert.rejects(run, (err: Error) => {
    assert.ok(
      err instanceof kind,
      `${what}: ${err.constructor.name} ${(err as { code?: string }).code}: ${err.message}`,
    );
    assert.doesNotMatch(err.message.split(' (')[0]!, RAW_CODE, what);
    return true;
  });
}

test('library: a malformed task id is a BerthInputError for every action on a task, before any statement', async () => {
  for (const [name, run] of Object.entries(BY_ID)) {
    for (const id of BAD_IDS)
      await refused(`${name}(${JSON.stringify(id.slice(0, 24))})`, () => run(schema, id), BerthInputError);
  }
  await refused('dequeue token', () => dequeue(pool, schema, '1', 'not-a-uuid'), BerthInputError);
  // The largest id is valid: it reaches the database and finds nothing.
  const max = '9223372036854775807';
  assert.deepEqual(await taskTimeline(pool, schema, max), []);
  assert.deepEqual(await attemptsOf(pool, schema, max), []);
  assert.equal(await retryTask(pool, schema, max), 'not_found');
});

test('library: a queue or type name no task can have (NUL, a lone surrogate, too long) is a BerthInputError', async () => {
  for (const [name, run] of Object.entries(BY_QUEUE)) {
    for (const q of BAD_QUEUES)
      await refused(`${name}(${JSON.stringify(q.slice(0, 20))})`, () => run(schema, q), BerthInputError);
  }
  for (const [name, run] of Object.entries(BY_TYPE)) {
    for (const t of BAD_TYPES)
      await refused(`${name}(${JSON.stringify(t.slice(0, 20))})`, () => run(schema, t), BerthInputError);
  }
  await refused('pauseQueue reason', () => pauseQueue(pool, schema, 'q', 'test', 'why\u0000'), BerthInputError);
  await refused('pauseQueue actor', () => pauseQueue(pool, schema, 'q', 'a'.repeat(201)), BerthInputError);
  await refused('retryDead error', () => retryDead(pool, schema, { errorContains: 'x\u0000' }), BerthInputError);
  // Valid names reach the database and act as before.
  assert.deepEqual(await cancelTasks(pool, schema, { queue: 'q'.repeat(255) }), {
    matched: 0,
    removed: 0,
    cancelled: 0,
    alreadySettled: 0,
  });
});

test('library: every admin action on a schema nobody migrated is a SchemaNotMigratedError naming the fix', async () => {
  const actions: Record<string, (s: string) => Promise<unknown>> = {
    ...Object.fromEntries(Object.entries(BY_ID).map(([n, run]) => [n, (s: string) => run(s, '1')])),
    ...Object.fromEntries(Object.entries(BY_QUEUE).map(([n, run]) => [n, (s: string) => run(s, 'q')])),
    ...Object.fromEntries(Object.entries(BY_TYPE).map(([n, run]) => [n, (s: string) => run(s, 't')])),
    'cancelTasks all': (s) => cancelTasks(pool, s, { all: true }),
    'retryDead all': (s) => retryDead(pool, s, { all: true }),
    'purgeDead all': (s) => purgeDead(pool, s, { all: true }),
    setHistorySettings: (s) => setHistorySettings(pool, s, { enabled: true }),
  };
  for (const s of [empty, missing]) {
    for (const [name, run] of Object.entries(actions)) {
      await refused(`${name} on ${s}`, () => run(s), SchemaNotMigratedError);
      await assert.rejects(run(s), new RegExp(`berth migrate --schema ${s}`));
    }
  }
});

function berth(s: string, ...args: string[]) {
  return runCli([...args, '--schema', s, '--database-url', DATABASE_URL]);
}

/** Exit non-zero with one line on stderr: no stack, no SQLSTATE, nothing on stdout. */
function oneLine(what: string, r: { code: number; out: string; err: string }, message: RegExp): void {
  assert.notEqual(r.code, 0, `${what}: exit ${r.code}`);
  const lines = r.err.trim().split('\n');
  assert.equal(lines.length, 1, `${what}: ${r.err}`);
  assert.doesNotMatch(r.err, /^\s+at /m, what);
  assert.doesNotMatch(r.err, RAW_CODE, what);
  assert.match(r.err, message, what);
}

test('CLI: each admin command refuses a malformed id, a bad name, and a schema nobody migrated, with one line', async () => {
  const idCommands = [
    ['tasks', 'retry'],
    ['tasks', 'cancel'],
    ['tasks', 'delete'],
    ['tasks', 'move', '--queue', 'other'],
    ['dead', 'retry', '--id'],
    ['dead', 'purge', '--id'],
  ];
  for (const cmd of idCommands) {
    for (const id of ['abc', '99999999999999999999', '0']) {
      const args = cmd.includes('--id') ? [...cmd, id] : [cmd[0]!, cmd[1]!, id, ...cmd.slice(2)];
      oneLine(args.join(' '), await berth(schema, ...args), /positive integer up to 9223372036854775807/);
    }
    // `-1` reads as an option: a usage error, still one line and exit 2.
    const minus = cmd.includes('--id') ? [...cmd, '-1'] : [cmd[0]!, cmd[1]!, '-1', ...cmd.slice(2)];
    const r = await berth(schema, ...minus);
    assert.equal(r.code, 2, `${minus.join(' ')}: ${r.err}`);
    assert.doesNotMatch(r.err, /^\s+at /m);
  }

  const nameCommands = [
    (q: string) => ['queues', 'pause', q],
    (q: string) => ['queues', 'resume', q],
    (q: string) => ['tasks', 'move', '1', '--queue', q],
    (q: string) => ['tasks', 'cancel', '--queue', q],
    (q: string) => ['dead', 'retry', '--queue', q],
    (q: string) => ['dead', 'purge', '--queue', q],
    (t: string) => ['tasks', 'cancel', '--type', t.replace(/^q/, 't')],
    (t: string) => ['dead', 'retry', '--type', t.replace(/^q/, 't')],
    (t: string) => ['dead', 'purge', '--type', t.replace(/^q/, 't')],
  ];
  for (const cmd of nameCommands) {
    for (const name of ['q\u0000nul', 'q'.repeat(256)]) {
      const args = cmd(name);
      const r = await berth(schema, ...args);
      oneLine(args.join(' ').slice(0, 60), r, /(queue|type) (must be|contains)|not paused/);
      assert.equal(r.code, /not paused/.test(r.err) ? 1 : 2);
    }
  }

  const unmigrated = [
    ['tasks', 'retry', '1'],
    ['tasks', 'cancel', '1'],
    ['tasks', 'cancel', '--all'],
    ['tasks', 'delete', '1'],
    ['tasks', 'move', '1', '--queue', 'other'],
    ['dead', 'retry', '--all'],
    ['dead', 'purge', '--all'],
    ['queues', 'pause', 'q'],
    ['queues', 'resume', 'q'],
    ['history', 'set', '--on'],
  ];
  for (const s of [empty, missing]) {
    for (const args of unmigrated) {
      const r = await berth(s, ...args);
      oneLine(`${args.join(' ')} on ${s}`, r, new RegExp(`berth migrate --schema ${s}`));
      assert.equal(r.code, 2, `${args.join(' ')}: ${r.err}`);
    }
  }
});
