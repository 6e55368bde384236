/** berth at its defaults: only `slots` is set (to the scenario's concurrency). */
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';
import pg from 'pg';
import { pino } from 'pino';
import type { TaskSpec } from '../../src/index.js';
import { dropSchema } from '../db.js';
import { berthPending } from './berth-pending.js';
import { RunSink } from './run-sink.js';
import type { AdapterContext, Producer, RunningWorker, SystemAdapter } from './types.js';

/**
 * berth as users run it: tsc's build in dist/ (`npm run bench` builds it first), as the peers run
 * their published, compiled packages. src/ under tsx costs more per task (tsx's `keepNames`
 * renames every closure through a helper: 8.7 % of a profile's busy samples, docs/benchmarks-journal.md
 * "Worker CPU per task"). BENCH_BERTH_SRC=1 runs src/ instead. The path is a variable so that
 * typechecking never needs dist/.
 */
const entry = process.env.BENCH_BERTH_SRC ? '../../src/index.js' : '../../dist/index.js';
export const berthBuild = process.env.BENCH_BERTH_SRC ? 'src/ under tsx' : 'dist/ (tsc build)';
type Berth = typeof import('../../src/index.js');
const current = (await import(entry)) as Berth;

/**
 * A second berth build to compare in the same run (`BENCH_BERTH_BASE`: the `dist/index.js` of
 * another checkout, built there, e.g. a `git worktree` of the commit before a change): its row,
 * `berth (base)`, runs every scenario interleaved with the others, in a schema of its own, so a
 * change to the hot path is measured before and after under the same load and on the same cluster.
 */
export const berthBasePath = process.env.BENCH_BERTH_BASE ? resolve(process.env.BENCH_BERTH_BASE) : null;
const base = berthBasePath ? ((await import(pathToFileURL(berthBasePath).href)) as Berth) : null;

const silent = pino({ level: 'silent' });

export function berthAdapter(ctx: AdapterContext): SystemAdapter {
  return adapter(ctx, current, 'berth (default)', 'berth_bench', berthBuild);
}

/** The `berth (base)` row, when BENCH_BERTH_BASE names a build; else null. */
export function berthBaseAdapter(ctx: AdapterContext): SystemAdapter | null {
  return base && berthBasePath ? adapter(ctx, base, 'berth (base)', 'berth_bench_base', berthBasePath) : null;
}

function adapter(ctx: AdapterContext, berth: Berth, label: string, schema: string, build: string): SystemAdapter {
  const { defineTask, enqueue, enqueueMany, migrate, Worker } = berth;
  const { connectionString } = ctx;
  const sink = new RunSink();
  const noop = defineTask<{ i: number }>({
    type: 'noop',
    ceilingMs: 60_000,
    handler: async (payload) => {
      sink.record(payload.i);
    },
  });
  return {
    label,
    producerMigrates: true,
    settings: `Worker({ slots: <concurrency>, logger: silent }), everything else default; schema \`${schema}\`; ${build}`,

    async reset() {
      await dropSchema(connectionString, schema);
      await migrate({ connectionString, schema });
    },

    async openProducer(): Promise<Producer> {
      const pool = new pg.Pool({ connectionString });
      pool.on('error', () => {});
      await pool.query('SELECT 1');
      return {
        async bulk(start, count) {
          const specs: TaskSpec[] = [];
          for (let i = start; i < start + count; i++) specs.push({ type: 'noop', payload: { i } });
          await enqueueMany(pool, specs, { schema });
        },
        async single(i) {
          await enqueue(pool, 'noop', { i }, { schema });
        },
        async migrate() {
          // On the pool's one session (the one `SELECT 1` opened), as graphile-worker's `migrate()` runs on its.
          const client = await pool.connect();
          try {
            await migrate({ client, schema });
          } finally {
            client.release();
          }
        },
        close: () => pool.end(),
      };
    },

    async startWorker(concurrency, runs): Promise<RunningWorker> {
      sink.bind(runs);
      const worker = new Worker({
        connectionString,
        schema,
        tasks: [noop],
        slots: concurrency,
        logger: silent,
      });
      await worker.start();
      return { stop: () => worker.stop() };
    },

    pending: (db) => berthPending(db, schema),
  };
}
