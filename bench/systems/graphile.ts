/**
 * graphile-worker 0.17: `run()` at its defaults, and with the batching options from its
 * performance docs. In 0.17 `localQueue`, `completeJobBatchDelay` and `failJobBatchDelay` exist
 * only as preset options (`preset.worker.*`), not as top-level RunnerOptions.
 */
import { Logger, makeWorkerUtils, run, runMigrations, type RunnerOptions, type Task } from 'graphile-worker';
import { dropSchema } from '../db.js';
import type { AdapterContext, Producer, RunningWorker, SystemAdapter } from './types.js';

const SCHEMA = 'graphile_worker';
const silent = new Logger(() => () => {});

const THROUGHPUT_PRESET = {
  worker: { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 },
} satisfies NonNullable<RunnerOptions['preset']>;

export function graphileAdapter(ctx: AdapterContext, mode: 'default' | 'throughput'): SystemAdapter {
  const { connectionString } = ctx;
  return {
    label: `graphile-worker (${mode})`,
    settings:
      mode === 'default'
        ? 'run({ concurrency, taskList, noHandleSignals: true }), pollInterval/maxPoolSize default (2000 ms / 10)'
        : 'as default plus preset.worker { localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 }',

    async reset() {
      await dropSchema(connectionString, SCHEMA);
      await runMigrations({ connectionString, logger: silent });
    },

    async openProducer(): Promise<Producer> {
      const utils = await makeWorkerUtils({ connectionString, logger: silent });
      await utils.migrate();
      return {
        async bulk(start, count) {
          const specs = [];
          for (let i = start; i < start + count; i++) specs.push({ identifier: 'noop', payload: { i } });
          await utils.addJobs(specs);
        },
        async single(i) {
          await utils.addJob('noop', { i });
        },
        close: async () => {
          await utils.release();
        },
      };
    },

    async startWorker(concurrency, onRun): Promise<RunningWorker> {
      const noop: Task = async (payload) => {
        onRun((payload as { i: number }).i);
      };
      const runner = await run({
        connectionString,
        concurrency,
        taskList: { noop },
        noHandleSignals: true,
        logger: silent,
        ...(mode === 'throughput' ? { preset: THROUGHPUT_PRESET } : {}),
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
  };
}
