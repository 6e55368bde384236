/**
 * Review of the start's warm-up (Fetcher.prepare's claim on lane -1, prepareSettlement's
 * completion of a lease that cannot exist): each test a repro of one doubt.
 * - The worker's start really plans the claim on the fetcher's session and the completion on the
 *   settlement session (test/worker-prepare.test.ts passes with both removed from start).
 * - A task due before start runs on its first attempt and no lease is left behind: a warm claim
 *   that leased a real entry and dropped it passes worker-prepare.test.ts (its task completes
 *   after rescue, 60 s later).
 * - Start changes no row of the schema (content, not counts) and sends no wake notification.
 * - A database fault during either step (terminated backends, statement_timeout): start
 *   resolves, nothing crashes, and the first claim and flush work.
 * - A lane -1 made by hand (OVERRIDING SYSTEM VALUE): the warm claim leases its head and drops
 *   it unless the warm claim also names no queue (it does: queues []).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueue, getTask, Worker, type WorkerOptions } from '../src/index.js';
import { wakeChannel } from '../src/sql.js';
import { captureLogger, DATABASE_URL, freshSchema, waitFor, within } from './helpers.js';

const { schema, pool } = await freshSchema('warm_review');
const S = `"${schema}"`;

const ran: { id: string; attempt: number }[] = [];
const t = defineTask<{ n: number }>({
  type: 'warm_rev',
  ceilingMs: 600_000,
  handler: async (_p, ctx) => {
    ran.push({ id: ctx.id, attempt: ctx.attempt });
  },
});

const unhandled: unknown[] = [];
process.on('unhandledRejection', (err) => unhandled.push(err));
process.on('uncaughtException', (err) => unhandled.push(err));

type Sessions = { claims: pg.Pool; settlements: pg.Pool };
/** The worker's own sessions (a pool of one each): prepared statements are per session. */
function sessions(worker: Worker): Sessions {
  return (worker as unknown as { running: Sessions }).running;
}

async function preparedNames(db: pg.Pool): Promise<string[]> {
  return (
    await db.query<{ name: string }>('SELECT name FROM pg_catalog.pg_prepared_statements ORDER BY name')
  ).rows.map((r) => r.name);
}

async function currentSegment(): Promise<number> {
  return (await pool.query<{ s: number }>(`SELECT current_slot AS s FROM ${S}.ring_state`)).rows[0]!.s;
}

/** Every table of the schema (partitioned parents with their partitions) by content hash. */
async function snapshot(except: readonly string[] = []): Promise<Record<string, string>> {
  const tables = (
    await pool.query<{ t: string }>(
      `SELECT c.relname AS t FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition ORDER BY 1`,
      [schema],
    )
  ).rows.map((r) => r.t);
  const out: Record<string, string> = {};
  for (const name of tables) {
    if (except.includes(name)) continue;
    const r = await pool.query<{ h: string | null; n: number }>(
      `SELECT md5(string_agg(x::text, '|' ORDER BY x::text)) AS h, count(*)::int AS n FROM ${S}."${name}" x`,
    );
    out[name] = `${r.rows[0]!.n}:${r.rows[0]!.h ?? ''}`;
  }
  return out;
}

function options(extra: Partial<WorkerOptions> = {}): WorkerOptions {
  return {
    connectionString: DATABASE_URL,
    schema,
    tasks: [t],
    slots: 2,
    maintenance: false,
    pollIntervalMs: 200,
    ...extra,
    logger: extra.logger ?? captureLogger().logger,
  } as WorkerOptions;
}

test('start plans the claim on the fetcher session and the completion on the settlement session', async () => {
  const worker = new Worker(options({ queues: ['warm_rev_nowhere'] }));
  await worker.start();
  try {
    // Nothing to claim in its queue: nothing but start prepared these sessions' statements.
    const { claims, settlements } = sessions(worker);
    const onClaims = await preparedNames(claims);
    const onSettlements = await preparedNames(settlements);
    assert.ok(
      onClaims.some((n) => n.startsWith('berth-claim-one-lane:')),
      `the one-lane claim planned on the fetcher session: ${onClaims.join(', ')}`,
    );
    const segment = await currentSegment();
    assert.ok(
      onSettlements.some((n) => n.startsWith(`berth-complete:${schema}:${segment}@`)),
      `the completion planned on the settlement session: ${onSettlements.join(', ')}`,
    );
    assert.ok(onSettlements.some((n) => n.startsWith(`berth-current-segment:${schema}@`)));
    // Each session only what it runs: the window's read (named alike on every session that reads
    // it: 42P05 behind a one-session transaction pooler) stays off the settlement session.
    assert.ok(!onSettlements.some((n) => n.startsWith('berth-ring-window')), onSettlements.join(', '));
    assert.ok(!onClaims.some((n) => n.startsWith('berth-complete')), onClaims.join(', '));
  } finally {
    await worker.stop();
  }
});

test('start changes no row of the schema and sends no wake notification', async () => {
  // Work the start could reach: a due task, a lane with a tombstone-free head, a dedupe key.
  await enqueue(pool, t, { n: 0 }, { schema, queue: 'warm_rev_other', dedupeKey: 'warm-rev-key' });
  const listener = new pg.Client({ connectionString: DATABASE_URL });
  listener.on('error', () => undefined);
  await listener.connect();
  const heard: string[] = [];
  listener.on('notification', (n) => heard.push(n.payload ?? ''));
  const channel = wakeChannel(schema);
  await listener.query(`LISTEN "${channel}"`);
  try {
    // The worker's own registration rows are the only writes a start makes.
    const before = await snapshot(['workers']);
    const worker = new Worker(options({ queues: ['warm_rev_nowhere'], heartbeatIntervalMs: false }));
    await worker.start();
    try {
      assert.deepEqual(await snapshot(['workers']), before);
      // A marker after start resolved: a notification sent by the start (committed before it)
      // is delivered before it.
      await pool.query('SELECT pg_notify($1, $2)', [channel, 'marker']);
      await waitFor(() => heard.includes('marker'), 20_000, 'the marker');
      assert.deepEqual(heard, ['marker'], 'no wake notification from the start');
    } finally {
      await worker.stop();
    }
  } finally {
    await listener.end();
  }
});

test('a task due before start runs on its first attempt; no lease is left unsettled', async () => {
  const r = await enqueue(pool, t, { n: 1 }, { schema, queue: 'warm_rev_due' });
  const lane = (await pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.ready WHERE id = $1`, [r.id!])).rows[0]!
    .lane_id;
  const worker = new Worker(options({ queues: ['warm_rev_due'] }));
  await worker.start();
  try {
    // A lease on the lane: the engine's (or one the start took and dropped).
    await waitFor(
      async () => (await pool.query(`SELECT 1 FROM ${S}.range_leases WHERE lane_id = $1`, [lane])).rowCount,
      30_000,
      'a lease on the lane',
    );
  } finally {
    // Graceful: a lease the engine holds is completed or handed back; one it never knew stays.
    await worker.stop({ graceMs: 30_000 });
  }
  const open = await pool.query(`SELECT lane_seq FROM ${S}.leased_entries WHERE lane_id = $1 AND outcome IS NULL`, [
    lane,
  ]);
  assert.equal(open.rowCount, 0, 'every lease on the lane settled by the worker that took it');
  const mine = ran.filter((x) => x.id === r.id);
  if (mine.length > 0) assert.deepEqual(mine, [{ id: r.id!, attempt: 1 }]);
  else assert.equal((await getTask(pool, schema, r.id!))?.attempts ?? 0, 0, 'handed back unstarted');
});

/** The statements' first words (pg_stat_activity cuts a text at track_activity_query_size). */
const CLAIM = 'WITH locked AS MATERIALIZED%';
const COMPLETION = 'WITH u AS (%';

/** Wait for `n` backends of this schema's statements matching `pattern` to wait on a lock; their pids. */
async function blocked(pattern: string, n: number): Promise<number[]> {
  return waitFor(
    async () => {
      const r = await pool.query<{ pid: number }>(
        `SELECT pid FROM pg_stat_activity
          WHERE wait_event_type = 'Lock' AND query LIKE $1 AND query LIKE $2 AND pid <> pg_backend_pid()`,
        [`%${schema}%`, pattern],
      );
      return r.rows.length >= n ? r.rows.map((x) => x.pid) : null;
    },
    30_000,
    `a blocked ${pattern}`,
  );
}

/** A transaction holding SHARE locks on the leases and settlements (reads pass, inserts wait). */
async function holdInsertLocks(): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  c.on('error', () => undefined);
  await c.connect();
  await c.query('BEGIN');
  await c.query(`LOCK TABLE ${S}.range_leases, ${S}.range_settlements IN SHARE MODE`);
  return c;
}

async function drainsOne(worker: Worker, n: number): Promise<void> {
  const r = await enqueue(pool, t, { n }, { schema, queue: 'warm_rev_fault' });
  await waitFor(async () => (await getTask(pool, schema, r.id!))?.state === 'completed', 30_000, 'the task completed');
  assert.deepEqual(
    ran.filter((x) => x.id === r.id),
    [{ id: r.id!, attempt: 1 }],
  );
  void worker;
}

test('backends terminated during the warm claim and completion: start resolves, the worker claims and settles', async () => {
  const locks = await holdInsertLocks();
  const { logger, lines } = captureLogger();
  const worker = new Worker(options({ queues: ['warm_rev_fault'], logger }));
  const starting = worker.start();
  try {
    const claim = await blocked(CLAIM, 1);
    const completion = await blocked(COMPLETION, 1);
    for (const pid of [...claim, ...completion]) await pool.query('SELECT pg_terminate_backend($1)', [pid]);
    await within(starting, 60_000, 'start() after its sessions were terminated');
  } finally {
    await locks.query('ROLLBACK').catch(() => undefined);
    await locks.end();
  }
  try {
    await drainsOne(worker, 2);
    assert.deepEqual(unhandled, [], 'no unhandled rejection or exception');
    const loud = lines.filter((l) => (l.level as number) >= 50);
    assert.deepEqual(loud, [], 'nothing logged at error level');
  } finally {
    await worker.stop();
  }
});

test('statement_timeout during the warm claim and completion: start resolves, the worker claims and settles', async () => {
  const locks = await holdInsertLocks();
  const { logger, lines } = captureLogger();
  const worker = new Worker(options({ queues: ['warm_rev_fault'], logger, statementTimeoutMs: 3_000 }));
  try {
    const starting = worker.start();
    // Both wait on the locks until their statement_timeout cancels them.
    await blocked(CLAIM, 1);
    await blocked(COMPLETION, 1);
    await within(starting, 60_000, 'start() after its statements timed out');
  } finally {
    await locks.query('ROLLBACK').catch(() => undefined);
    await locks.end();
  }
  try {
    await drainsOne(worker, 3);
    assert.deepEqual(unhandled, []);
    assert.deepEqual(
      lines.filter((l) => (l.level as number) >= 50),
      [],
    );
  } finally {
    await worker.stop();
  }
});

test('a lane -1 made by hand: the warm claim must not lease its head', async () => {
  const own = await freshSchema('warm_review_neg');
  const N = `"${own.schema}"`;
  {
    await own.pool.query(
      `INSERT INTO ${N}.lanes (lane_id, queue, priority, shard) OVERRIDING SYSTEM VALUE VALUES (-1, 'neg', 0, 0)`,
    );
    await own.pool.query(`CREATE SEQUENCE ${N}."lane_seq_-1"`);
    const r = await enqueue(own.pool, t, { n: 9 }, { schema: own.schema, queue: 'neg', shard: 0 });
    const lane = (await own.pool.query<{ lane_id: number }>(`SELECT lane_id FROM ${N}.ready WHERE id = $1`, [r.id!]))
      .rows[0]!.lane_id;
    assert.equal(lane, -1, 'the task sits in lane -1');
    const worker = new Worker(options({ schema: own.schema, queues: ['neg'] }));
    await worker.start();
    try {
      await waitFor(
        async () => (await own.pool.query(`SELECT 1 FROM ${N}.range_leases WHERE lane_id = -1`)).rowCount,
        30_000,
        'a lease on lane -1',
      );
    } finally {
      await worker.stop({ graceMs: 30_000 });
    }
    const open = await own.pool.query(`SELECT 1 FROM ${N}.leased_entries WHERE lane_id = -1 AND outcome IS NULL`);
    assert.equal(open.rowCount, 0, 'a lease nobody runs: the warm claim leased the head and dropped it');
  }
});
