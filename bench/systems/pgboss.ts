/**
 * pg-boss 12. Concurrency N is `work(name, { localConcurrency: N }, handler)`: N pollers on one
 * PgBoss instance, each fetching up to `batchSize` jobs (default 1) and handing them to the
 * handler as one array. After every fetch a poller waits out the rest of its polling interval
 * (default 2 s) unless `burstWhenBatchFull` is set and the fetch came back full.
 *
 * - default: `new PgBoss({ connectionString, schema })`, `createQueue(name)`, `localConcurrency: N`.
 * - batched: `batchSize: 50` with `burstWhenBatchFull: true` (pg-boss's own way to keep fetching
 *   while there is a backlog), plus its LISTEN/NOTIFY wake-up (`useListenNotify: true` on the
 *   instance, `notify: true` on the queue), so pickup is not bound to the 2 s poll.
 *
 * A job's completion is recorded as `state = 'completed'` on its row (retained, not deleted).
 */
import { PgBoss, type ConstructorOptions, type JobInsert, type WorkOptions } from 'pg-boss';
import { dropSchema } from '../db.js';
import { log } from '../util.js';
import { RunSink } from './run-sink.js';
import type { AdapterContext, Producer, RunningWorker, SystemAdapter } from './types.js';

const SCHEMA = 'pgboss';
const QUEUE = 'noop';
const BATCH_SIZE = 50;

/** Errors pg-boss emits (it emits instead of throwing from its loops); reported at the end. */
export const pgBossErrors: string[] = [];

function newBoss(connectionString: string, extra: Partial<ConstructorOptions> = {}): PgBoss {
  const boss = new PgBoss({ connectionString, schema: SCHEMA, ...extra });
  boss.on('error', (err: Error) => {
    if (pgBossErrors.length < 20) pgBossErrors.push(err.message);
    if (pgBossErrors.length <= 3) log(`pg-boss error: ${err.message}`);
  });
  return boss;
}

export function pgBossAdapter(ctx: AdapterContext, mode: 'default' | 'batched'): SystemAdapter {
  const { connectionString } = ctx;
  const batched = mode === 'batched';
  const instanceOptions: Partial<ConstructorOptions> = batched ? { useListenNotify: true } : {};
  const workOptions = (concurrency: number): WorkOptions =>
    batched
      ? { localConcurrency: concurrency, batchSize: BATCH_SIZE, burstWhenBatchFull: true }
      : { localConcurrency: concurrency };

  const sink = new RunSink();
  const handler = async (jobs: { data: { i: number } }[]): Promise<void> => {
    for (const job of jobs) sink.record(job.data.i);
  };

  async function ensureQueue(boss: PgBoss): Promise<void> {
    if (!(await boss.getQueue(QUEUE))) await boss.createQueue(QUEUE, batched ? { notify: true } : {});
  }

  return {
    label: `pg-boss (${mode})`,
    settings: batched
      ? `new PgBoss({ connectionString, schema, useListenNotify: true }); createQueue(name, { notify: true }); ` +
        `work(name, { localConcurrency: <concurrency>, batchSize: ${BATCH_SIZE}, burstWhenBatchFull: true }, handler)`
      : 'new PgBoss({ connectionString, schema }); createQueue(name); work(name, { localConcurrency: <concurrency> }, handler) ' +
        '(batchSize 1, polling every 2 s, no LISTEN/NOTIFY)',

    async reset() {
      await dropSchema(connectionString, SCHEMA);
      const boss = newBoss(connectionString);
      await boss.start();
      await ensureQueue(boss);
      await boss.stop({ graceful: false });
    },

    async openProducer(): Promise<Producer> {
      const boss = newBoss(connectionString, instanceOptions);
      await boss.start();
      await ensureQueue(boss);
      return {
        async bulk(start, count) {
          const jobs: JobInsert[] = [];
          for (let i = start; i < start + count; i++) jobs.push({ data: { i } });
          await boss.insert(QUEUE, jobs);
        },
        async single(i) {
          await boss.send(QUEUE, { i });
        },
        close: () => boss.stop({ graceful: false }),
      };
    },

    async startWorker(concurrency, runs): Promise<RunningWorker> {
      sink.bind(runs);
      const boss = newBoss(connectionString, instanceOptions);
      await boss.start();
      await ensureQueue(boss);
      await boss.work<{ i: number }>(QUEUE, workOptions(concurrency), handler);
      return { stop: () => boss.stop({ graceful: true, timeout: 10_000 }) };
    },

    async pending(db) {
      const r = await db.query<{ n: string }>(
        `SELECT count(*)::text AS n FROM ${SCHEMA}.job WHERE name = $1 AND state <> 'completed'`,
        [QUEUE],
      );
      return Number(r.rows[0]!.n);
    },
  };
}
