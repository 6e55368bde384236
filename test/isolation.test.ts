/**
 * Producers at REPEATABLE READ and SERIALIZABLE against the ring's rotation and prune.
 *
 * `append_ready()` (called by `enqueue()`) puts a new entry in the ring segment that is current.
 * Through migration 17 it read `ring_state.current_slot`, and looked again after its INSERT for a
 * rotation that raced it (migration 13), in its transaction's snapshot. Under READ COMMITTED each
 * statement has a new snapshot, but a transaction at REPEATABLE READ or SERIALIZABLE reads the
 * snapshot its first statement took: when the ring rotated since, the append went into the old,
 * sealed segment and its second look saw no rotation. A worker whose ring window left that
 * segment out (it was empty, or pruned, when the window was read) then claimed the lane's next
 * entry in the current segment, the lane's cursor passed the stale entry, and the next prune
 * truncated it: a task whose COMMIT had returned never ran. An independent review lost 10 of 983
 * committed tasks in 20 s that way. An application cannot be expected to enqueue only at READ
 * COMMITTED, so this file holds every level to the same promise.
 *
 * 1. Deterministic: a producer takes its snapshot, the ring rotates (and, in a variant, the old
 *    segment is settled and pruned), then it enqueues on one lane and commits, and a READ
 *    COMMITTED producer enqueues on the same lane after it. Every task must run, and the stale
 *    producer's entry must be in the segment that was current when it appended.
 * 2. Plain statements under `default_transaction_isolation` (a fresh snapshot per statement):
 *    nothing breaks while the ring rotates.
 * 3. Randomized: producers at mixed levels on two lanes, each holding its snapshot for up to
 *    400 ms before it enqueues, against a worker that rotates and prunes as fast as it can.
 *
 * A producer that gets a serialization failure (SQLSTATE 40001) rolls back and tries again, as an
 * application would; only a task whose COMMIT returned counts as committed. Losses are found, not
 * waited out: a task that has not run is lost once its entry is gone from the queue or sits
 * behind its lane's claim cursor with no lease on it (nothing ever leases behind the cursor).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { defineTask, enqueueMany, getTask, Worker } from '../src/index.js';
import { pruneSegment, rotateRing } from '../src/maintenance/ring.js';
import { quoteIdent } from '../src/sql.js';
import { laneCursor } from '../src/storage/predicates.js';
import { captureLogger, DATABASE_URL, FAST_MAINTENANCE, freshSchema, waitFor, within } from './helpers.js';

const { schema, pool } = await freshSchema('isolation');
const S = quoteIdent(schema);

type Level = 'READ COMMITTED' | 'REPEATABLE READ' | 'SERIALIZABLE';

const TYPE = 'iso';
const SERIALIZATION_FAILURE = '40001';
/** The leader rotates and prunes as fast as the ring lets it (ring-window.test.ts does the same). */
const TIGHT_RING = { ...FAST_MAINTENANCE, ringRotateAfterMs: 1, ringRotateSmallAfterMs: 1, ringIntervalMs: 20 };

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const randomInt = (n: number) => Math.floor(Math.random() * n);

function isSerializationFailure(e: unknown): boolean {
  return (e as { code?: unknown } | null)?.code === SERIALIZATION_FAILURE;
}

async function reset(): Promise<void> {
  await pool.query(
    `TRUNCATE ${S}.ready, ${S}.range_leases, ${S}.range_settlements, ${S}.tombstones, ${S}.deferred, ${S}.dedupe, ${S}.dead_letters`,
  );
  await pool.query(`UPDATE ${S}.ring_state SET current_slot = 0, rotated_at = now()`);
}

async function ringState(): Promise<{ current: number; generation: bigint }> {
  const r = await pool.query(`SELECT current_slot, generation::text AS g FROM ${S}.ring_state`);
  return { current: r.rows[0].current_slot as number, generation: BigInt(r.rows[0].g) };
}

async function segmentOf(id: string): Promise<number | undefined> {
  return (await pool.query(`SELECT slot FROM ${S}.ready WHERE id = $1`, [id])).rows[0]?.slot as number | undefined;
}

function specs(queue: string, shard: number, n: number) {
  return Array.from({ length: n }, (_, i) => ({ type: TYPE, payload: { i }, queue, shard }));
}

function ids(results: { id: string | null }[]): string[] {
  return results.map((r) => {
    assert.ok(r.id, 'a plain task is never a duplicate');
    return r.id;
  });
}

/** A worker handling TYPE, recording each task id it ran. */
async function startWorker(opts: { maintenance: typeof TIGHT_RING | false; pollIntervalMs?: number }) {
  const seen = new Set<string>();
  const def = defineTask<{ i: number }>({
    type: TYPE,
    ceilingMs: 60_000,
    handler: async (_payload, ctx) => void seen.add(ctx.id),
  });
  const worker = new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: [def],
    queues: 'all',
    slots: 4,
    logger: captureLogger().logger,
    ...opts,
  });
  await worker.start();
  return { worker, seen };
}

/**
 * Of `pending` (committed, not yet run), the tasks that can no longer run: the entry is gone (it
 * was never deferred or dead-lettered here, so it went with a pruned segment) or it sits at or
 * below its lane's claim cursor without a lease of its own segment over it (passed over).
 */
async function lostAmong(pending: string[]): Promise<string[]> {
  const r = await pool.query<{ id: string }>(
    `SELECT r.id::text AS id FROM ${S}.ready r
      WHERE r.id = ANY ($1::bigint[])
        AND r.lane_seq <= ${laneCursor(S, 'r.lane_id')}
        AND NOT EXISTS (SELECT 1 FROM ${S}.range_leases l
                         WHERE l.lane_id = r.lane_id AND l.slot = r.slot AND r.lane_seq BETWEEN l.from_seq AND l.to_seq)
        AND NOT EXISTS (SELECT 1 FROM ${S}.tombstones t
                         WHERE t.lane_id = r.lane_id AND t.lane_seq = r.lane_seq AND t.slot = r.slot)
     UNION
     SELECT x.id::text FROM unnest($1::bigint[]) AS x(id)
      WHERE NOT EXISTS (SELECT 1 FROM ${S}.ready r WHERE r.id = x.id)
        AND NOT EXISTS (SELECT 1 FROM ${S}.deferred d WHERE d.id = x.id)
        AND NOT EXISTS (SELECT 1 FROM ${S}.dead_letters d WHERE d.id = x.id)`,
    [pending],
  );
  return r.rows.map((x) => x.id);
}

/**
 * Wait (a liveness bound) until every committed task has run or is found lost; the lost ones.
 * A task that ran in the meantime is not lost: its handler recorded it before it completed, so
 * before its segment could be pruned.
 */
async function drain(committed: ReadonlySet<string>, seen: ReadonlySet<string>): Promise<string[]> {
  let lost: string[] = [];
  let pending: string[] = [];
  try {
    await waitFor(
      async () => {
        pending = [...committed].filter((id) => !seen.has(id));
        if (pending.length === 0) return true;
        lost = (await lostAmong(pending)).filter((id) => !seen.has(id));
        return lost.length === pending.length;
      },
      60_000,
      'every committed task to run or be found lost',
    );
  } catch (e) {
    throw new Error(`${(e as Error).message}: ${pending.length} still pending (${pending.slice(0, 20).join(', ')})`);
  }
  return lost.sort((a, b) => Number(a) - Number(b));
}

/** Wait for every one of `running`, then fail with the first failure among them. */
async function allOf(running: Promise<unknown>[]): Promise<void> {
  const failed = (await Promise.allSettled(running)).find((r) => r.status === 'rejected');
  if (failed) throw failed.reason;
}

function lossMessage(lost: string[], committed: number, extra = ''): string {
  return `${lost.length} of ${committed} committed tasks never ran (lost: ${lost.join(', ')})${extra}`;
}

async function connect(options?: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: DATABASE_URL, options: options ?? '-c jit=off' });
  await c.connect();
  return c;
}

/**
 * One producer transaction at `level` on client `c`: BEGIN, a first statement (which takes the
 * snapshot at REPEATABLE READ and SERIALIZABLE), `between` (first attempt only), the enqueue,
 * COMMIT. Retried on a serialization failure. The ids once COMMIT returned, and the retries.
 */
async function producerTransaction(
  c: pg.Client,
  level: Level,
  tasks: ReturnType<typeof specs>,
  between: () => Promise<void>,
): Promise<{ ids: string[]; retries: number }> {
  for (let attempt = 1; ; attempt++) {
    await c.query(`BEGIN ISOLATION LEVEL ${level}`);
    try {
      await c.query(`SELECT 1 FROM ${S}.lanes LIMIT 1`);
      if (attempt === 1) await between();
      const got = ids(await enqueueMany(c, tasks, { schema }));
      await c.query('COMMIT');
      return { ids: got, retries: attempt - 1 };
    } catch (e) {
      await c.query('ROLLBACK').catch(() => undefined);
      if (!isSerializationFailure(e) || attempt >= 10) throw e;
    }
  }
}

for (const level of ['REPEATABLE READ', 'SERIALIZABLE'] as const) {
  for (const prune of [false, true]) {
    const what = prune ? 'a rotation and the prune of the old segment' : 'a rotation';
    test(`${level}: a producer whose snapshot predates ${what} appends to the current segment, and every task runs`, async () => {
      await reset();
      const queue = `wb_${level === 'SERIALIZABLE' ? 'ser' : 'rr'}_${prune ? 'prune' : 'rot'}`;
      const shard = 3;
      // No leader (the test rotates and prunes) and no poll tick (a tick re-reads the window):
      // the worker reads its ring window when a claim finds it stale, and only then.
      const { worker, seen } = await startWorker({ maintenance: false, pollIntervalMs: 600_000 });
      const committed = new Set<string>();
      const stale = await connect();
      try {
        // A: the lane's first entry, in segment 0; run and settled.
        const [a] = ids(await enqueueMany(pool, specs(queue, shard, 1), { schema }));
        committed.add(a!);
        await waitFor(async () => (await getTask(pool, schema, a!))?.state === 'completed', 20_000, 'A completed');
        const start = await ringState();

        const between = async () => {
          // The snapshot is taken; the ring moves on while the producer is busy elsewhere.
          assert.equal(await rotateRing(pool, schema, 0), 'rotated');
          if (prune) {
            await waitFor(
              async () => (await pruneSegment(pool, schema, start.current, 1000)).result === 'pruned',
              20_000,
              'the old segment pruned',
            );
          }
          // B: a READ COMMITTED producer's entry in the new segment. The worker's claim of it
          // finds its window stale (the generation moved) and reads the window again.
          const [b] = ids(await enqueueMany(pool, specs(queue, shard, 1), { schema }));
          committed.add(b!);
          await waitFor(() => seen.has(b!), 20_000, 'B run');
        };
        // C: the stale producer's tasks.
        const c = await producerTransaction(stale, level, specs(queue, shard, 2), between);
        for (const id of c.ids) committed.add(id);
        const staleSegment = await segmentOf(c.ids[0]!);
        const currentAtCommit = (await ringState()).current;
        // D: a READ COMMITTED producer after it, on the same lane.
        for (const id of ids(await enqueueMany(pool, specs(queue, shard, 1), { schema }))) committed.add(id);

        const lost = await drain(committed, seen);
        assert.equal(
          lost.length,
          0,
          lossMessage(
            lost,
            committed.size,
            `; the stale producer's entry was in segment ${staleSegment}, ` +
              `the current segment ${currentAtCommit}, serialization failures retried: ${c.retries}`,
          ),
        );
        assert.equal(
          staleSegment,
          currentAtCommit,
          `the append sees the current segment: a ${level} producer whose snapshot predates ${what} appends to ` +
            `segment ${currentAtCommit} (current when it appended), not the sealed segment ${start.current}`,
        );
      } finally {
        await stale.end();
        await worker.stop();
      }
    });
  }
}

for (const level of ['repeatable read', 'serializable'] as const) {
  test(`plain statements under default_transaction_isolation = ${level} run through rotations and prunes`, async () => {
    await reset();
    const queue = `plain_${level === 'serializable' ? 'ser' : 'rr'}`;
    const producers = new pg.Pool({
      connectionString: DATABASE_URL,
      max: 3,
      options: `-c jit=off -c default_transaction_isolation=${level.replace(' ', '\\ ')}`,
    });
    const { worker, seen } = await startWorker({ maintenance: TIGHT_RING });
    const committed = new Set<string>();
    let retries = 0;
    try {
      assert.equal((await producers.query('SHOW transaction_isolation')).rows[0].transaction_isolation, level);
      const g0 = (await ringState()).generation;
      let stop = false;
      const loop = async () => {
        while (!stop) {
          try {
            const got = await enqueueMany(producers, specs(queue, randomInt(2), 1 + randomInt(3)), { schema });
            for (const id of ids(got)) committed.add(id);
          } catch (e) {
            if (!isSerializationFailure(e)) throw e;
            retries++;
          }
          await sleep(randomInt(20));
        }
      };
      const loops = [loop(), loop(), loop()].map((p) =>
        p.catch((e) => {
          stop = true;
          throw e;
        }),
      );
      try {
        await waitFor(
          async () => stop || (await ringState()).generation - g0 >= 10n,
          30_000,
          '10 rotations under load',
        );
      } finally {
        stop = true;
        await allOf(loops);
      }
      const lost = await drain(committed, seen);
      assert.equal(lost.length, 0, lossMessage(lost, committed.size, `; serialization failures retried: ${retries}`));
    } finally {
      await worker.stop();
      await producers.end();
    }
  });
}

test('a rotation does not wait for an open producer transaction at any level', async () => {
  await reset();
  // The lanes exist first: a producer opening a new lane holds its queue's lock to commit.
  for (const shard of [0, 1, 2, 3]) await enqueueMany(pool, specs('open_tx', shard, 1), { schema });
  const clients = await Promise.all(
    (['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE'] as const).map(() => connect()),
  );
  try {
    // Three producers, one per level, each with its enqueue written and its transaction left open.
    for (const [i, level] of (['READ COMMITTED', 'REPEATABLE READ', 'SERIALIZABLE'] as const).entries()) {
      await clients[i]!.query(`BEGIN ISOLATION LEVEL ${level}`);
      await enqueueMany(clients[i]!, specs('open_tx', 1 + i, 2), { schema });
    }
    const before = await ringState();
    assert.equal(await within(rotateRing(pool, schema, 0), 10_000, 'the rotation, with producers open'), 'rotated');
    assert.equal((await ringState()).current, (before.current + 1) % 16);
    for (const c of clients) await c.query('COMMIT');
    const committed = await pool.query(`SELECT count(*)::int AS n FROM ${S}.ready WHERE slot = $1`, [before.current]);
    assert.equal(committed.rows[0].n, 10, 'their entries committed in the segment current when they appended');
  } finally {
    for (const c of clients) {
      await c.query('ROLLBACK').catch(() => undefined);
      await c.end();
    }
  }
});

test('randomized: producers at mixed isolation levels holding snapshots across rotations lose no committed task', async (t) => {
  await reset();
  const queue = 'mixed';
  const shards = [0, 1];
  const levels: Level[] = ['READ COMMITTED', 'REPEATABLE READ', 'REPEATABLE READ', 'SERIALIZABLE', 'READ COMMITTED'];
  const WORKLOAD_MS = 8_000;
  // The lanes exist before any snapshot is taken.
  const committed = new Set<string>();
  const seeded = await enqueueMany(
    pool,
    shards.map((shard) => ({ type: TYPE, payload: { i: 0 }, queue, shard })),
    { schema },
  );
  for (const id of ids(seeded)) committed.add(id);
  const { worker, seen } = await startWorker({ maintenance: TIGHT_RING });
  const stats = new Map<Level, { commits: number; tasks: number; retries: number }>(
    levels.map((l) => [l, { commits: 0, tasks: 0, retries: 0 }]),
  );
  const origin = new Map<string, Level>();
  const clients: pg.Client[] = [];
  try {
    const g0 = (await ringState()).generation;
    let stop = false;
    const producer = async (level: Level) => {
      const c = await connect();
      clients.push(c);
      const st = stats.get(level)!;
      // READ COMMITTED producers pause briefly (their entries are the later ones on the lane);
      // the others hold their snapshot for up to 400 ms before they enqueue.
      const pauseMs = level === 'READ COMMITTED' ? 50 : 400;
      while (!stop) {
        const tasks = specs(queue, shards[randomInt(shards.length)]!, 1 + randomInt(3));
        await c.query(`BEGIN ISOLATION LEVEL ${level}`);
        try {
          await c.query(`SELECT 1 FROM ${S}.lanes LIMIT 1`);
          await sleep(randomInt(pauseMs + 1));
          const got = ids(await enqueueMany(c, tasks, { schema }));
          await c.query('COMMIT');
          for (const id of got) {
            committed.add(id);
            origin.set(id, level);
          }
          st.commits++;
          st.tasks += got.length;
        } catch (e) {
          await c.query('ROLLBACK').catch(() => undefined);
          if (!isSerializationFailure(e)) throw e;
          st.retries++;
        }
      }
    };
    const running = levels.map((level) =>
      producer(level).catch((e) => {
        stop = true;
        throw e;
      }),
    );
    // The workload's length, not an expectation (cut short when a producer fails).
    const end = Date.now() + WORKLOAD_MS;
    while (!stop && Date.now() < end) await sleep(50);
    stop = true;
    await allOf(running);
    const rotations = (await ringState()).generation - g0;

    const summary = [...stats].map(([l, s]) => `${l}: ${s.commits} commits, ${s.tasks} tasks, ${s.retries} retries`);
    t.diagnostic(`${committed.size} tasks committed, ${rotations} rotations; ${summary.join('; ')}`);
    const lost = await drain(committed, seen);
    assert.ok(rotations > 0n, 'the ring rotated during the workload');
    const byLevel = [...new Set(levels)].map((l) => `${l} ${lost.filter((id) => origin.get(id) === l).length}`);
    assert.equal(
      lost.length,
      0,
      lossMessage(
        lost,
        committed.size,
        ` (by producer: ${byLevel.join(', ')}); ${rotations} rotations; ${summary.join('; ')}`,
      ),
    );
  } finally {
    await Promise.all(clients.map((c) => c.end().catch(() => undefined)));
    await worker.stop();
  }
});
