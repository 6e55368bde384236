/**
 * pg-boss in `npm run bench:deps`, for the shapes it can express: its `flow()` writes a graph of
 * jobs whose `dependsOn` name refs of the same call (12.x); a job cannot name a job sent earlier,
 * so the one-call-per-link and per-layer variants have no pg-boss row. A dependent is unblocked
 * by the flow resolver, a background pass every `flowIntervalSeconds` (default 5, at least 1),
 * not by its parent's completion, and the unblock sends no notification: the worker finds it at
 * its next poll (with LISTEN/NOTIFY on, `notifyPollingIntervalSeconds`, default 30 s).
 *
 * Configured as the main bench's `pg-boss (batched)` row (bench/systems/pgboss.ts): LISTEN/NOTIFY
 * on, `work(name, { localConcurrency, batchSize: 50, burstWhenBatchFull: true })`, plus both poll
 * intervals and the flow interval set as given (by default their minimums, 0.5 s and 1 s: at the
 * batched row's 30 s backstop poll each level of a graph waited 30 s); the worker process
 * supervises (so it runs the flow resolver), the driver's producer instance does not.
 */
import pg from 'pg';
import { type FlowJob, type JobInsert, PgBoss } from 'pg-boss';
import { dropSchema } from '../db.js';
import { sleep } from '../util.js';
import type { TaskTiming } from './analysis.js';
import { startWorkerProcess, type WorkerProcess } from './process.js';
import type { CallMode, Shape } from './shapes.js';
import { DB_NOW_MS, type DepsSystem, type Enqueued } from './system.js';
import { PGBOSS_BATCH_SIZE } from './protocol.js';

const SCHEMA = 'deps_pgboss';
const QUEUE = 'noop';

export function pgBossSystem(url: string, slots: number, o: { flowIntervalS: number; pollS: number }): DepsSystem {
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  pool.on('error', () => {});
  let producer: PgBoss | null = null;
  let worker: WorkerProcess | null = null;
  const producerErrors: string[] = [];

  const dbNow = async () => (await pool.query<{ ms: number }>(DB_NOW_MS)).rows[0]!.ms;
  const pending = async () =>
    Number(
      (
        await pool.query<{ n: string }>(
          `SELECT count(*)::text AS n FROM "${SCHEMA}".job WHERE name = $1 AND state <> 'completed'`,
          [QUEUE],
        )
      ).rows[0]!.n,
    );

  return {
    name: 'pg-boss',
    settings:
      `pg-boss as the main bench's batched row: useListenNotify, createQueue(name, { notify: true }), ` +
      `work(name, { localConcurrency: ${slots}, batchSize: ${PGBOSS_BATCH_SIZE}, burstWhenBatchFull: true, ` +
      `pollingIntervalSeconds: ${o.pollS}, notifyPollingIntervalSeconds: ${o.pollS} }) in a process of its own ` +
      `with flowIntervalSeconds: ${o.flowIntervalS}; flow() (insert() for the baseline) ` +
      'from a producer instance with supervise: false',
    unsupported: (mode) =>
      mode === 'one call'
        ? null
        : "flow() dependencies name refs of the same call only; a job cannot name an earlier job's id",

    async prepare() {
      producerErrors.length = 0;
      await dropSchema(url, SCHEMA);
      producer = new PgBoss({
        connectionString: url,
        schema: SCHEMA,
        supervise: false,
        schedule: false,
        useListenNotify: true,
      });
      producer.on('error', (err: Error) => {
        if (producerErrors.length < 20) producerErrors.push(err.message);
      });
      await producer.start();
      await producer.createQueue(QUEUE, { notify: true });
      worker = await startWorkerProcess({
        DEPS_SYSTEM: 'pg-boss',
        DEPS_URL: url,
        DEPS_SCHEMA: SCHEMA,
        DEPS_SLOTS: String(slots),
        DEPS_FLOW_INTERVAL_S: String(o.flowIntervalS),
        DEPS_POLL_S: String(o.pollS),
        DEPS_QUEUE: QUEUE,
      });
    },

    async warmUp(n, timeoutMs) {
      for (let start = 0; start < n; start += 5000) {
        const jobs: JobInsert[] = [];
        for (let i = start; i < Math.min(n, start + 5000); i++) jobs.push({ data: { i: -1 } });
        await producer!.insert(QUEUE, jobs);
      }
      const end = performance.now() + timeoutMs;
      for (let left = await pending(); left > 0; left = await pending()) {
        if (performance.now() > end) throw new Error(`warm-up: ${left} jobs still pending after ${timeoutMs} ms`);
        await sleep(50);
      }
    },

    async enqueue(shape: Shape, mode: CallMode): Promise<Enqueued> {
      if (mode !== 'one call') throw new Error(`pg-boss: ${mode} is not supported`);
      const n = shape.parents.length;
      const hasDeps = shape.parents.some((p) => p.length > 0);
      const jobs: FlowJob[] | JobInsert[] = hasDeps
        ? shape.parents.map((parents, i) => ({
            ref: `t${i}`,
            name: QUEUE,
            data: { i },
            ...(parents.length > 0 ? { dependsOn: parents.map((p) => `t${p}`) } : {}),
          }))
        : shape.parents.map((_, i) => ({ data: { i } }));
      const startDbMs = await dbNow();
      const t0 = performance.now();
      let ids: string[];
      if (hasDeps) {
        const refToId = await producer!.flow(jobs as FlowJob[]);
        ids = Array.from({ length: n }, (_, i) => refToId[`t${i}`]!);
      } else {
        const inserted = await producer!.insert(QUEUE, jobs as JobInsert[], { returnId: true });
        if (!inserted || inserted.length !== n)
          throw new Error(`insert returned ${inserted?.length ?? 'no'} ids for ${n} jobs`);
        ids = inserted;
      }
      const wallMs = performance.now() - t0;
      const doneDbMs = await dbNow();
      return { ids, readyAtEnqueue: new Set(), calls: 1, wallMs, startDbMs, doneDbMs };
    },

    pending,

    /** From the job rows: `started_on` (its latest fetch) and `completed_on`, both pg-boss's `now()`. */
    async timings(e) {
      const index = new Map(e.ids.map((id, i) => [id, i]));
      const r = await pool.query<{
        id: string;
        started: number | null;
        completed: number | null;
        state: string;
        retries: number;
      }>(
        `SELECT id::text AS id, (extract(epoch FROM started_on) * 1000)::float8 AS started,
                (extract(epoch FROM completed_on) * 1000)::float8 AS completed, state::text AS state,
                retry_count AS retries
           FROM "${SCHEMA}".job WHERE name = $1 AND id = ANY ($2::uuid[])`,
        [QUEUE, e.ids],
      );
      const out: TaskTiming[] = e.ids.map(() => ({ startedMs: null, completedMs: null, completions: 0, attempts: 0 }));
      for (const row of r.rows) {
        const i = index.get(row.id);
        if (i === undefined) continue;
        const done = row.state === 'completed';
        out[i] = {
          startedMs: row.started,
          completedMs: done ? row.completed : null,
          completions: done ? 1 : 0,
          attempts: row.started === null ? 0 : row.retries + 1,
        };
      }
      return out;
    },

    releases: async () => null,
    crossCheck: async () => null,

    async finish() {
      await worker?.stop();
      await producer?.stop({ graceful: false });
      producer = null;
      await dropSchema(url, SCHEMA);
    },

    errors: () => [...producerErrors, ...(worker?.errors ?? [])],

    close: () => pool.end(),
  };
}
