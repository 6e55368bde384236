/**
 * graphile-worker 0.18: `run()` at its defaults, and with the throughput preset of its
 * performance docs (https://worker.graphile.org/docs/performance): `localQueue: { size: 500 }`,
 * `completeJobBatchDelay: 0`, `failJobBatchDelay: 0`, and a pool one larger than the
 * concurrency (the docs' preset runs `concurrentJobs: 24, maxPoolSize: 25`). In 0.18, as in
 * 0.17, the batching options exist only as preset options (`preset.worker.*`), not as
 * top-level RunnerOptions. A job's completion is recorded by deleting its row.
 */
import { Logger, makeWorkerUtils, run, runMigrations, type RunnerOptions, type Task } from 'graphile-worker';
import { dropSchema } from '../db.js';
import { RunSink } from './run-sink.js';
import type { AdapterContext, Producer, RunningWorker, SystemAdapter } from './types.js';

const SCHEMA = 'graphile_worker';
const silent = new Logger(() => () => {});

function throughputPreset(concurrency: number): NonNullable<RunnerOptions['preset']> {
  return {
    worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0, maxPoolSize: concurrency + 1 },
  };
}

export function graphileAdapter(ctx: AdapterContext, mode: 'default' | 'throughput'): SystemAdapter {
  const { connectionString } = ctx;
  const sink = new RunSink();
  const noop: Task = async (payload) => {
    sink.record((payload as { i: number }).i);
  };
  return {
    label: `graphile-worker (${mode})`,
    producerMigrates: true,
    settings:
      mode === 'default'
        ? 'run({ concurrency, taskList, noHandleSignals: true }), pollInterval/maxPoolSize default (2000 ms / 10)'
        : "as default plus the performance docs' preset: preset.worker { localQueue: { size: 500 }, " +
          'completeJobBatchDelay: 0, failJobBatchDelay: 0, maxPoolSize: concurrency + 1 }',

    async reset() {
      await dropSchema(connectionString, SCHEMA);
      await runMigrations({ connectionString, logger: silent });
    },

    async openProducer(): Promise<Producer> {
      // makeWorkerUtils() runs graphile-worker's migrate() on the pool's session before it returns
      // (its lib.js, "// Migrate"), as it does for every user: that session has read its
      // migrations table before the first addJob. Then `SELECT 1`, as berth's producer runs.
      // `migrate()` below runs it again for the "after migrate()" row, where berth runs its own.
      const utils = await makeWorkerUtils({ connectionString, logger: silent });
      await utils.withPgClient((client) => client.query('SELECT 1'));
      return {
        async bulk(start, count) {
          const specs = [];
          for (let i = start; i < start + count; i++) specs.push({ identifier: 'noop', payload: { i } });
          await utils.addJobs(specs);
        },
        async single(i) {
          await utils.addJob('noop', { i });
        },
        migrate: () => utils.migrate(),
        close: async () => {
          await utils.release();
        },
      };
    },

    async startWorker(concurrency, runs): Promise<RunningWorker> {
      sink.bind(runs);
      const runner = await run({
        connectionString,
        concurrency,
        taskList: { noop },
        noHandleSignals: true,
        logger: silent,
        ...(mode === 'throughput' ? { preset: throughputPreset(concurrency) } : {}),
      });
      // The runner's promise rejects if the pool dies; stop() surfaces that, keep it handled here.
      const done = runner.promise.catch((err: unknown) => err);
      return {
        async stop() {
          await runner.stop();
          const err = await done;
          if (err instanceof Error) throw err;
        },
      };
    },

    async pending(db) {
      const r = await db.query<{ n: string }>(`SELECT count(*)::text AS n FROM ${SCHEMA}._private_jobs`);
      return Number(r.rows[0]!.n);
    },
  };
}
