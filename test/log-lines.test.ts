/**
 * Issue 12, item 9: no log line berth writes repeats a key. A worker (with maintenance, the
 * heartbeat and handlers that log) and the `berth worker` command are run at debug level, and
 * every line they write is parsed by a strict parser that refuses a repeated key; the logger a
 * caller passes in may bind berth's own keys (`component`, `worker`, `task_id`) without a clash.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { defineTask, enqueue, PermanentError, Worker } from '../src/index.js';
import { childLogger, createLogger } from '../src/logger.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, waitFor } from './helpers.js';
import { parseStrictJson } from './support/strict-json.js';

const { schema, pool } = await freshSchema('loglines');

/** Every raw line written to the stream, unparsed. */
function rawSink(): { stream: Writable; lines: string[] } {
  const lines: string[] = [];
  let partial = '';
  const stream = new Writable({
    write(chunk, _enc, cb) {
      const parts = (partial + String(chunk)).split('\n');
      partial = parts.pop() ?? '';
      lines.push(...parts.filter(Boolean));
      if (process.env.BERTH_LOG_LEVEL) process.stdout.write(chunk);
      cb();
    },
  });
  return { stream, lines };
}

function strictly(lines: readonly string[]): Record<string, unknown>[] {
  return lines.map((l) => {
    try {
      return parseStrictJson(l) as Record<string, unknown>;
    } catch (err) {
      throw new Error(`a log line is not strict JSON: ${(err as Error).message}`);
    }
  });
}

test('the strict parser refuses a repeated key (JSON.parse does not) and reads everything else as JSON.parse does', () => {
  const dup = '{"component":"berth-worker","worker":"w","component":"maintenance"}';
  assert.equal((JSON.parse(dup) as { component: string }).component, 'maintenance');
  assert.throws(() => parseStrictJson(dup), /duplicate key "component"/);
  assert.throws(() => parseStrictJson('{"a":{"b":1,"b":2}}'), /duplicate key "b"/);
  const ok = '{"a":[1,-2.5e3,"x\\"y\\u00e9",{"b":null}],"c":true,"d":{"a":false}}';
  assert.deepEqual(parseStrictJson(ok), JSON.parse(ok));
  assert.throws(() => parseStrictJson('{"a":1} x'), /trailing text/);
});

test('childLogger keeps the parent value of a key it already binds and writes the child value beside it', () => {
  const { stream, lines } = rawSink();
  const root = pino({ level: 'info' }, stream).child({ component: 'billing', worker: 'web-1' });
  const child = childLogger(childLogger(root, { component: 'maintenance' }), {
    component: 'promote',
    lane: 'x',
    hostname: 'mine',
  });
  child.info('hello');
  const [line] = strictly(lines);
  assert.equal(line!.component, 'billing');
  assert.equal(line!.berth_component, 'maintenance');
  assert.equal(line!.berth_component_2, 'promote');
  assert.equal(line!.lane, 'x');
  assert.equal(line!.berth_hostname, 'mine', "pino's own keys count as bound");
});

test('a worker with maintenance, heartbeat and logging handlers writes no line with a repeated key, under a logger that binds berth keys', async () => {
  const { stream, lines } = rawSink();
  // A caller's logger that already binds the keys berth binds itself.
  const logger = createLogger({ component: 'billing', worker: 'pod-7', task_id: 'n/a' }, stream, 'debug');
  const tasks = [
    defineTask<{ n: number }>({
      type: 'log_ok',
      ceiling: 10_000,
      handler: async (p, ctx) => {
        ctx.logger.info({ n: p.n, task_type: 'shadowed', component: 'handler' }, 'handler says hello');
      },
    }),
    defineTask<Record<string, never>>({
      type: 'log_fail',
      ceiling: 10_000,
      maxAttempts: 2,
      backoff: { baseMs: 10, maxMs: 10 },
      handler: async () => {
        throw new Error('transient');
      },
    }),
    defineTask<Record<string, never>>({
      type: 'log_dead',
      ceiling: 10_000,
      handler: async () => {
        throw new PermanentError('no retry helps');
      },
    }),
  ];
  const worker = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks,
    logger,
    maintenance: FAST_MAINTENANCE,
    heartbeatIntervalMs: 100,
    workerId: `${schema}-w`,
  });
  await worker.start();
  try {
    for (let n = 0; n < 5; n++) await enqueue(pool, 'log_ok', { n }, { schema });
    await enqueue(pool, 'log_fail', {}, { schema });
    await enqueue(pool, 'log_dead', {}, { schema });
    await waitFor(() => worker.isLeader, 30_000, 'maintenance leadership');
    await waitFor(
      () => lines.filter((l) => l.includes('task failed; dead-lettered')).length >= 2,
      30_000,
      'both failing tasks dead-lettered',
    );
    await waitFor(() => lines.filter((l) => l.includes('task done')).length >= 5, 30_000, 'five tasks done');
  } finally {
    await worker.stop();
  }
  const parsed = strictly(lines);
  const msgs = parsed.map((l) => l.msg);
  for (const m of ['worker started', 'became maintenance leader', 'handler says hello', 'worker stopped'])
    assert.ok(msgs.includes(m), `logged "${m}"`);
  const hello = parsed.find((l) => l.msg === 'handler says hello')!;
  assert.equal(hello.task_type, 'log_ok', "a log call cannot overwrite the task's own fields");
  assert.equal(hello.log_task_type, 'shadowed');
  assert.equal(hello.log_component, 'handler');
  assert.equal(hello.component, 'billing');
  assert.equal(hello.berth_worker, `${schema}-w`);
});

test('`berth worker` writes strict JSON lines on stdout', () => {
  const cli = fileURLToPath(new URL('../src/cli.ts', import.meta.url));
  const mod = fileURLToPath(new URL('./fixtures/cli-tasks.ts', import.meta.url));
  const r = spawnSync(
    process.execPath,
    ['--import', 'tsx', cli, 'worker', '--tasks', mod, '--drain', '--schema', schema, '--database-url', DATABASE_URL],
    { encoding: 'utf8', env: { ...process.env, BERTH_LOG_LEVEL: 'debug' }, timeout: 120_000 },
  );
  assert.equal(r.status, 0, r.stderr);
  const json = r.stdout.split('\n').filter((l) => l.startsWith('{'));
  const parsed = strictly(json);
  assert.ok(
    parsed.some((l) => l.msg === 'worker started' && l.service === 'berth-worker'),
    r.stdout,
  );
});
