/**
 * `worker.stopOnSignals`: the first SIGTERM stops with the grace, a second within a second is the
 * same request relayed and changes nothing, a second after that skips the grace, and every lease
 * is released before the process exits (no task left running under a dead worker). Each worker
 * is a child process of its own; the schema is this file's.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { enqueueMany, Worker } from '../src/index.js';
import { DATABASE_URL, freshSchema, scaled, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('signals');
const S = `"${schema}"`;
const FIXTURE = fileURLToPath(new URL('./fixtures/signal-worker.ts', import.meta.url));

function startWorker(env: Record<string, string>): {
  child: ChildProcess;
  out: () => string;
  exited: Promise<number | null>;
} {
  const child = spawn(process.execPath, ['--import', 'tsx', FIXTURE], {
    env: { ...process.env, DATABASE_URL, SCHEMA: schema, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const exited = new Promise<number | null>((res) => child.once('exit', (code) => res(code)));
  return { child, out: () => out, exited };
}

/** Entries under a lease nobody has settled: tasks a worker holds. */
async function held(): Promise<number> {
  const r = await pool.query(`SELECT count(*)::int AS n FROM ${S}.leased_entries WHERE outcome IS NULL`);
  return r.rows[0].n;
}

async function runningTasks(n: number): Promise<void> {
  await pool.query(`DELETE FROM ${S}.deferred`);
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: 'sig_long', payload: { i } })),
    { schema },
  );
  await waitFor(async () => (await held()) === n, 30_000, `${n} tasks running`);
}

test('two SIGTERMs 200 ms apart: the worker stops with its grace, aborts its handlers and releases every lease before it exits', async () => {
  const w = startWorker({ GRACE_MS: '300' });
  await waitFor(() => w.out().includes('started'), 30_000, 'the worker to start');
  await runningTasks(4);
  w.child.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 200));
  w.child.kill('SIGTERM');
  const code = await Promise.race([w.exited, new Promise<'hung'>((r) => setTimeout(() => r('hung'), scaled(60_000)))]);
  if (code === 'hung') w.child.kill('SIGKILL');
  assert.equal(code, 0, 'exited by itself, not killed by the second signal');
  assert.match(w.out(), /stopped/, 'stopOnSignals resolved after the stop');
  assert.equal(await held(), 0, 'no lease left held by the dead worker');
  const due = await pool.query(`SELECT count(*)::int AS n FROM ${S}.deferred WHERE type = 'sig_long'`);
  assert.equal(due.rows[0].n, 4, 'every task handed back to run again');
});

test('a second SIGTERM after the first second skips the grace: a stop with an hour of grace ends at once', async () => {
  const w = startWorker({ GRACE_MS: '3600000' });
  await waitFor(() => w.out().includes('started'), 30_000, 'the worker to start');
  await runningTasks(2);
  w.child.kill('SIGTERM');
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(w.child.exitCode, null, 'still in its grace after the first signal');
  w.child.kill('SIGTERM');
  const code = await Promise.race([w.exited, new Promise<'hung'>((r) => setTimeout(() => r('hung'), scaled(60_000)))]);
  if (code === 'hung') w.child.kill('SIGKILL');
  assert.equal(code, 0);
  assert.equal(await held(), 0, 'every lease released');
});

test('stopOnSignals refuses unknown options and bad values before it listens', () => {
  const worker = new Worker({ connectionString: DATABASE_URL, schema, tasks: [] });
  assert.throws(() => void worker.stopOnSignals({ grace: 5 } as never), /unknown .*"grace".*graceMs/);
  assert.throws(() => void worker.stopOnSignals({ graceMs: -1 }), /graceMs/);
  assert.throws(() => void worker.stopOnSignals({ signals: ['TERM' as NodeJS.Signals] }), /signal names/);
  assert.equal(process.listenerCount('SIGTERM'), 0, 'nothing left listening');
});
