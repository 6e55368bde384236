/**
 * pg-boss 10.4.2. It has neither `localConcurrency` nor `burstWhenBatchFull` (both absent from
 * its types and source), so concurrency N is N `work()` registrations on one PgBoss instance,
 * each fetching up to `batchSize` jobs per poll. A worker waits out the rest of its polling
 * interval (default 2 s) after every fetch, even a full one.
 */
import PgBoss from 'pg-boss';
import { dropSchema } from '../db.js';
import { log } from '../util.js';
import type { AdapterContext, Producer, RunningWorker, SystemAdapter } from './types.js';

const SCHEMA = 'pgboss';
const QUEUE = 'noop';

/** Errors pg-boss emits (it emits instead of throwing from its loops); reported at the end. */
export const pgBossErrors: string[] = [];

function newBoss(connectionString: string): PgBoss {
  const boss = new PgBoss({ connectionString, schema: SCHEMA });
  boss.on('error', (err: Error) => {
    if (pgBossErrors.length < 20) pgBossErrors.push(err.message);
    if (pgBossErrors.length <= 3) log(`pg-boss error: ${err.message}`);
  });
  return boss;
}

async function ensureQueue(boss: PgBoss): Promise<void> {
  if (!(await boss.getQueue(QUEUE))) await boss.createQueue(QUEUE);
}

export function pgBossAdapter(ctx: AdapterContext, mode: 'default' | 'throughput'): SystemAdapter {
  const { connectionString } = ctx;
  const workOptions: PgBoss.WorkOptions = mode === 'throughput' ? { batchSize: 50 } : {};
  return {
    label: `pg-boss (${mode})`,
    settings:
      mode === 'default'
        ? 'new PgBoss({ connectionString, schema }); <concurrency> × work(name, handler) (batchSize 1, polling 2 s)'
        : '<concurrency> × work(name, { batchSize: 50 }, handler) (polling 2 s default; no burstWhenBatchFull in 10.x)',

    async reset() {
      await dropSchema(connectionString, SCHEMA);
      const boss = newBoss(connectionString);
      await boss.start();
      await ensureQueue(boss);
      await boss.stop({ graceful: false, wait: true });
    },

    async openProducer(): Promise<Producer> {
      const boss = newBoss(connectionString);
      await boss.start();
      await ensureQueue(boss);
      return {
        async bulk(start, count) {
          const jobs: PgBoss.JobInsert[] = [];
          for (let i = start; i < start + count; i++) jobs.push({ name: QUEUE, data: { i } });
          await boss.insert(jobs);
        },
        async single(i) {
          await boss.send(QUEUE, { i });
        },
        close: () => boss.stop({ graceful: false, wait: true }),
      };
    },

    async startWorker(concurrency, onRun): Promise<RunningWorker> {
      const boss = newBoss(connectionString);
      await boss.start();
      await ensureQueue(boss);
      const handler: PgBoss.WorkHandler<{ i: number }> = async (jobs) => {
        for (const job of jobs) onRun(job.data.i);
      };
      for (let k = 0; k < concurrency; k++) await boss.work(QUEUE, workOptions, handler);
      return { stop: () => boss.stop({ graceful: true, timeout: 10_000, wait: true }) };
    },
  };
}
