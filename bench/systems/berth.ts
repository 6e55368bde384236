/** berth at its defaults: only `slots` is set (to the scenario's concurrency). */
import pg from 'pg';
import { pino } from 'pino';
import type { TaskSpec } from '../../src/index.js';
import { dropSchema } from '../db.js';
import { berthPending } from './berth-pending.js';
import type { AdapterContext, Producer, RunningWorker, SystemAdapter } from './types.js';

/**
 * berth as users run it: tsc's build in dist/ (`npm run bench` builds it first), as the peers run
 * their published, compiled packages. src/ under tsx costs more per task (tsx's `keepNames`
 * renames every closure through a helper: 8.7 % of a profile's busy samples, docs/benchmarks.md
 * "Worker CPU per task"). BENCH_BERTH_SRC=1 runs src/ instead. The path is a variable so that
 * typechecking never needs dist/.
 */
const entry = process.env.BENCH_BERTH_SRC ? '../../src/index.js' : '../../dist/index.js';
export const berthBuild = process.env.BENCH_BERTH_SRC ? 'src/ under tsx' : 'dist/ (tsc build)';
const { defineTask, enqueue, enqueueMany, migrate, Worker } = (await import(
  entry
)) as typeof import('../../src/index.js');

const SCHEMA = 'berth_bench';
const silent = pino({ level: 'silent' });

export function berthAdapter(ctx: AdapterContext): SystemAdapter {
  const { connectionString } = ctx;
  return {
    label: 'berth (default)',
    settings: `Worker({ slots: <concurrency>, logger: silent }), everything else default; schema \`${SCHEMA}\`; ${berthBuild}`,

    async reset() {
      await dropSchema(connectionString, SCHEMA);
      await migrate({ connectionString, schema: SCHEMA });
    },

    async openProducer(): Promise<Producer> {
      const pool = new pg.Pool({ connectionString });
      pool.on('error', () => {});
      await pool.query('SELECT 1');
      return {
        async bulk(start, count) {
          const specs: TaskSpec[] = [];
          for (let i = start; i < start + count; i++) specs.push({ type: 'noop', payload: { i } });
          await enqueueMany(pool, specs, { schema: SCHEMA });
        },
        async single(i) {
          await enqueue(pool, 'noop', { i }, { schema: SCHEMA });
        },
        close: () => pool.end(),
      };
    },

    async startWorker(concurrency, onRun): Promise<RunningWorker> {
      const noop = defineTask<{ i: number }>({
        type: 'noop',
        ceilingMs: 60_000,
        handler: async (payload) => {
          onRun(payload.i);
        },
      });
      const worker = new Worker({
        connectionString,
        schema: SCHEMA,
        tasks: [noop],
        slots: concurrency,
        logger: silent,
      });
      await worker.start();
      return { stop: () => worker.stop() };
    },

    pending: (db) => berthPending(db, SCHEMA),
  };
}
