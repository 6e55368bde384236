/**
 * Issue 13, items 2 and 3 across processes: a `berth worker` child process runs the handlers,
 * `berth tasks cancel` (another child process) cancels them, and SIGTERM stops the worker with
 * its grace period. Handlers record how each run ended in `executions` (fixtures/cancel-tasks.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { enqueue, enqueueMany, getTask } from '../src/index.js';
import { quoteIdent } from '../src/sql.js';
import { DATABASE_URL, freshSchema, waitFor, within } from './helpers.js';

const { schema, pool } = await freshSchema('mpcancel');
const S = quoteIdent(schema);
await pool.query(
  `CREATE TABLE ${S}.executions (id bigint NOT NULL, kind text NOT NULL, at timestamptz DEFAULT clock_timestamp())`,
);

const cli = fileURLToPath(new URL('../src/cli.ts', import.meta.url));
const tasksModule = fileURLToPath(new URL('./fixtures/cancel-tasks.ts', import.meta.url));
const env = { ...process.env, SCHEMA: schema, DATABASE_URL, BERTH_LOG_LEVEL: 'info' };

/** `berth worker` for the fixture module as a child process; resolves once it logged that it started. */
async function startWorker(
  ...extra: string[]
): Promise<{ child: ChildProcess; log: string[]; exited: Promise<number> }> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', cli, 'worker', '--tasks', tasksModule, '--schema', schema, '--no-maintenance', ...extra],
    { env, stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const log: string[] = [];
  let buf = '';
  child.stdout!.on('data', (d: Buffer) => {
    buf += String(d);
    const lines = buf.split('\n');
    buf = lines.pop()!;
    log.push(...lines);
  });
  const exited = new Promise<number>((r) => child.once('exit', (code, signal) => r(code ?? (signal ? 128 : -1))));
  await waitFor(() => log.some((l) => l.includes('worker started')), 30_000, 'the worker process to start');
  return { child, log, exited };
}

/** `berth …` as a one-shot child process (the operator's terminal). */
function berth(args: string[], actor: string) {
  return spawnSync(process.execPath, ['--import', 'tsx', cli, ...args, '--schema', schema], {
    encoding: 'utf8',
    env: { ...env, BERTH_ACTOR: actor },
  });
}

async function kinds(id: string): Promise<string[]> {
  return (await pool.query(`SELECT kind FROM ${S}.executions WHERE id = $1 ORDER BY at`, [id])).rows.map((r) => r.kind);
}

test('berth tasks cancel (one process) aborts a handler running in a berth worker (another): settled cancelled with the actor, audited, never run again; bulk by type too', async () => {
  const w = await startWorker('--slots', '4');
  try {
    const { id } = await enqueue(pool, 'x_block', { ms: 600_000 }, { schema });
    await waitFor(async () => (await kinds(id!)).includes('start'), 30_000, 'the handler to start');
    const r = berth(['tasks', 'cancel', id!], 'cli:carol');
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /cancelled while running/);
    await waitFor(async () => (await kinds(id!)).length === 2, 30_000, 'the handler to end');
    assert.deepEqual(await kinds(id!), ['start', 'aborted:CANCEL_ABORT']);
    const st = await pool.query(
      `SELECT x.outcome, x.actor FROM ${S}.leased_entries le
         JOIN ${S}.range_settlements x ON x.lane_id = le.lane_id AND x.lease_from = le.lease_from AND x.seqs @> le.lane_seq
        WHERE le.id = $1`,
      [id],
    );
    assert.deepEqual(st.rows, [{ outcome: 'cancelled', actor: 'cli:carol' }]);
    const audit = await pool.query(`SELECT actor, action, result FROM ${S}.audit_log WHERE target->>'id' = $1`, [id]);
    assert.deepEqual(audit.rows, [{ actor: 'cli:carol', action: 'task.cancel', result: 'cancelled' }]);
    // Not pending anywhere, and it stays visible: cancelled, by its actor (attempt history).
    const read = await getTask(pool, schema, id!);
    assert.equal(read?.state, 'cancelled');
    assert.equal(read?.cancelled?.actor, 'cli:carol');
    // A second cancel loses, and says so (exit 1).
    const again = berth(['tasks', 'cancel', id!, '--json'], 'cli:carol');
    assert.equal(again.status, 1);
    assert.deepEqual(JSON.parse(again.stdout), { id, result: 'already_settled' });

    // Bulk: three running, cancelled by filter in one command.
    const many = await enqueueMany(
      pool,
      [0, 1, 2].map(() => ({ type: 'x_block', payload: { ms: 600_000 } })),
      { schema },
    );
    const ids = many.map((m) => m.id!);
    await waitFor(
      async () => (await Promise.all(ids.map(kinds))).every((k) => k.includes('start')),
      30_000,
      'three handlers to start',
    );
    const bulk = berth(['tasks', 'cancel', '--type', 'x_block', '--json'], 'cli:dave');
    assert.equal(bulk.status, 0, bulk.stderr);
    assert.deepEqual(JSON.parse(bulk.stdout), { matched: 3, removed: 0, cancelled: 3, alreadySettled: 0 });
    await waitFor(
      async () => (await Promise.all(ids.map(kinds))).every((k) => k.includes('aborted:CANCEL_ABORT')),
      30_000,
      'the three handlers to be aborted',
    );
    assert.equal(berth(['tasks', 'cancel'], 'cli:dave').status, 2, 'neither an id nor a filter');
  } finally {
    w.child.kill('SIGTERM');
    await w.exited;
  }
});

test('SIGTERM: claiming stops, a handler finishing within --grace completes; past the grace it is aborted and released (attempt kept)', async () => {
  const w = await startWorker('--grace', '60s');
  const quick = await enqueue(pool, 'x_block', { ms: 1500 }, { schema });
  await waitFor(async () => (await kinds(quick.id!)).includes('start'), 30_000, 'the handler to start');
  w.child.kill('SIGTERM');
  assert.equal(await within(w.exited, 60_000, 'the worker to exit'), 0);
  assert.deepEqual(await kinds(quick.id!), ['start', 'done']);
  assert.equal((await getTask(pool, schema, quick.id!))?.state ?? 'gone', 'completed');

  const slow = await enqueue(pool, 'x_block', { ms: 600_000 }, { schema });
  const w2 = await startWorker('--grace', '300ms');
  await waitFor(async () => (await kinds(slow.id!)).includes('start'), 30_000, 'the handler to start');
  w2.child.kill('SIGTERM');
  assert.equal(await within(w2.exited, 60_000, 'the worker to exit'), 0);
  assert.deepEqual(await kinds(slow.id!), ['start', 'aborted:SHUTDOWN_ABORT']);
  const t = await getTask(pool, schema, slow.id!);
  assert.equal(t?.state, 'retryable');
  assert.equal(t?.attempts, 1, 'not refunded');
  assert.ok(w2.log.some((l) => l.includes('grace period over')));
  await pool.query(`SELECT ${S}.cancel_tasks(ARRAY[$1::bigint], 'test')`, [slow.id]);
});

test('a second SIGTERM skips the grace: the handler is aborted at once and the worker exits', async () => {
  const w = await startWorker('--grace', '1h');
  const { id } = await enqueue(pool, 'x_block', { ms: 600_000 }, { schema });
  await waitFor(async () => (await kinds(id!)).includes('start'), 30_000, 'the handler to start');
  w.child.kill('SIGTERM');
  await waitFor(() => w.log.some((l) => l.includes('within the grace period')), 30_000, 'the grace to begin');
  // A signal within a second of the previous one is the same request relayed (npm, tsx): wait past it.
  await new Promise((r) => setTimeout(r, 1200));
  w.child.kill('SIGTERM');
  assert.equal(await within(w.exited, 60_000, 'the worker to exit'), 0);
  assert.deepEqual(await kinds(id!), ['start', 'aborted:SHUTDOWN_ABORT']);
  assert.equal((await getTask(pool, schema, id!))?.state, 'retryable');
});
