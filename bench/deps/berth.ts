/**
 * berth in `npm run bench:deps`: a fresh schema per run, a worker process at its defaults but
 * for 10 slots (it leads maintenance: the `deps` branch watches parents every 250 ms), and the
 * producer's enqueueMany calls from the driver. Each task's start and completion come from
 * attempt history (see `timings`).
 */
import pg from 'pg';
import { enqueueMany, migrate, type TaskSpec } from '../../src/index.js';
import { dropSchema } from '../db.js';
import { berthPending } from '../systems/berth-pending.js';
import { sleep } from '../util.js';
import type { TaskTiming } from './analysis.js';
import { startWorkerProcess, type WorkerProcess } from './process.js';
import { type CallMode, callRanges, type Shape } from './shapes.js';
import { DB_NOW_MS, type DepsSystem, type Enqueued, type ReleaseCounts } from './system.js';

const SCHEMA = 'deps_bench';
const TYPE = 'noop';

export function berthSystem(url: string, slots: number): DepsSystem {
  const pool = new pg.Pool({ connectionString: url, max: 2 });
  pool.on('error', () => {});
  let monitor: pg.Client | null = null;
  let worker: WorkerProcess | null = null;
  let before: ReleaseCounts = { completion: 0, leader: 0, promoted: 0 };

  const dbNow = async () => (await pool.query<{ ms: number }>(DB_NOW_MS)).rows[0]!.ms;
  const counts = async (): Promise<ReleaseCounts> => {
    const s = await worker!.stats();
    return { completion: s.releases.completion ?? 0, leader: s.releases.leader ?? 0, promoted: s.promoted };
  };
  const waitDrained = async (timeoutMs: number, what: string) => {
    const end = performance.now() + timeoutMs;
    let left = await berthPending(monitor!, SCHEMA);
    while (left > 0) {
      if (performance.now() > end) throw new Error(`${what}: ${left} tasks still pending after ${timeoutMs} ms`);
      await sleep(50);
      left = await berthPending(monitor!, SCHEMA);
    }
  };

  return {
    name: 'berth',
    settings:
      `Worker({ slots: ${slots}, maintenance: true }) in a process of its own, every other option at its default ` +
      '(the leader looks at watched parents every 250 ms); enqueueMany from the driver',
    unsupported: () => null,

    async prepare() {
      await dropSchema(url, SCHEMA);
      await migrate({ connectionString: url, schema: SCHEMA });
      monitor = new pg.Client({ connectionString: url, application_name: 'deps-bench-monitor' });
      await monitor.connect();
      worker = await startWorkerProcess({
        DEPS_SYSTEM: 'berth',
        DEPS_URL: url,
        DEPS_SCHEMA: SCHEMA,
        DEPS_SLOTS: String(slots),
        DEPS_FLOW_INTERVAL_S: '',
        DEPS_POLL_S: '',
        DEPS_QUEUE: '',
      });
      // The leader's deps branch is part of what is measured: wait until this process leads.
      const electBy = performance.now() + 60_000;
      while (!(await worker.stats()).leader) {
        if (performance.now() > electBy) throw new Error('the worker did not become the maintenance leader in 60 s');
        await sleep(50);
      }
    },

    async warmUp(n, timeoutMs) {
      for (let start = 0; start < n; start += 5000) {
        const specs: TaskSpec[] = [];
        for (let i = start; i < Math.min(n, start + 5000); i++) specs.push({ type: TYPE, payload: { i: -1 } });
        await enqueueMany(pool, specs, { schema: SCHEMA });
      }
      await waitDrained(timeoutMs, 'warm-up');
      before = await counts();
    },

    async enqueue(shape: Shape, mode: CallMode): Promise<Enqueued> {
      const n = shape.parents.length;
      const ranges = callRanges(shape, mode);
      // A ref only where a later entry of the same call names it.
      const callOf = new Int32Array(n);
      for (const [k, [a, b]] of ranges.entries()) callOf.fill(k, a, b);
      const named = new Uint8Array(n);
      for (let i = 0; i < n; i++) for (const p of shape.parents[i]!) if (callOf[p] === callOf[i]) named[p] = 1;
      const ids: string[] = new Array(n);
      const specsOf = (a: number, b: number): TaskSpec[] => {
        const specs: TaskSpec[] = [];
        for (let i = a; i < b; i++) {
          const parents = shape.parents[i]!;
          specs.push({
            type: TYPE,
            payload: { i },
            ...(named[i] ? { ref: `t${i}` } : {}),
            ...(parents.length > 0 ? { dependsOn: parents.map((p) => (p >= a ? { ref: `t${p}` } : ids[p]!)) } : {}),
          });
        }
        return specs;
      };
      const readyAtEnqueue = new Set<number>();
      // One call's specs are built before the clock starts; a call per link or layer builds its
      // own from the ids the previous call returned, as a producer would.
      const prebuilt = ranges.length === 1 ? specsOf(0, n) : null;
      const startDbMs = await dbNow();
      const t0 = performance.now();
      for (const [a, b] of ranges) {
        const res = await enqueueMany(pool, prebuilt ?? specsOf(a, b), { schema: SCHEMA });
        for (let k = 0; k < res.length; k++) {
          const r = res[k]!;
          if (r.id === null) throw new Error(`task ${a + k} was refused as a duplicate`);
          ids[a + k] = r.id;
          if (shape.parents[a + k]!.length > 0 && r.state !== 'waiting') readyAtEnqueue.add(a + k);
        }
      }
      const wallMs = performance.now() - t0;
      const doneDbMs = await dbNow();
      return { ids, readyAtEnqueue, calls: ranges.length, wallMs, startDbMs, doneDbMs };
    },

    pending: () => berthPending(monitor!, SCHEMA),

    /**
     * From attempt history: per task, the first claim's time (`claimed_at`, which the completion
     * copies from the task's range lease, `range_leases.claimed_at`) and the completion's
     * settlement time (`settled_at`, the `now()` of the statement that writes
     * `range_settlements`, so the same instant). History keeps them after the leader's prune has
     * truncated a drained segment's leases and settlements, which a run of this size outlives.
     */
    async timings(e) {
      const index = new Map<string, number>();
      let first = BigInt(e.ids[0]!);
      e.ids.forEach((id, i) => {
        index.set(id, i);
        if (BigInt(id) < first) first = BigInt(id);
      });
      const r = await pool.query<{
        id: string;
        started: number;
        completed: number | null;
        completions: number;
        attempts: number;
      }>(
        `SELECT x.id::text AS id,
                (extract(epoch FROM min(h.claimed_at)) * 1000)::float8 AS started,
                (extract(epoch FROM max(h.settled_at) FILTER (WHERE h.outcome = 'success')) * 1000)::float8 AS completed,
                count(*) FILTER (WHERE h.outcome = 'success')::int AS completions,
                count(*)::int AS attempts
           FROM "${SCHEMA}".attempt_history h CROSS JOIN LATERAL unnest(h.ids) AS x(id)
          WHERE h.bucket >= ($1::bigint >> 10) AND x.id >= $1::bigint
          GROUP BY x.id`,
        [first.toString()],
      );
      const out: TaskTiming[] = e.ids.map(() => ({ startedMs: null, completedMs: null, completions: 0, attempts: 0 }));
      for (const row of r.rows) {
        const i = index.get(row.id);
        if (i === undefined) continue;
        out[i] = {
          startedMs: row.started,
          completedMs: row.completed,
          completions: row.completions,
          attempts: row.attempts,
        };
      }
      // When each dependent was freed: its edges' latest satisfied_at (the leader's retention
      // deletes the edges of a task done for a minute, so a long run's early ones are unknown).
      const freed = await pool.query<{ id: string; released: number }>(
        `SELECT d.child_id::text AS id, (extract(epoch FROM max(d.satisfied_at)) * 1000)::float8 AS released
           FROM "${SCHEMA}".task_deps d
          WHERE d.child_id >= $1::bigint
          GROUP BY d.child_id HAVING bool_and(d.satisfied_at IS NOT NULL)`,
        [first.toString()],
      );
      for (const row of freed.rows) {
        const i = index.get(row.id);
        if (i !== undefined) out[i]!.releasedMs = row.released;
      }
      return out;
    },

    async releases() {
      const now = await counts();
      return {
        completion: now.completion - before.completion,
        leader: now.leader - before.leader,
        promoted: now.promoted - before.promoted,
      };
    },

    /**
     * The tasks whose ring segment is not pruned yet: their lease's `claimed_at` and their
     * completing settlement's `settled_at`, read where they stand (ready(id) → lane_id, slot,
     * lane_seq within the lease's [from_seq, to_seq], the settlement whose seqs hold it), against
     * what `timings` read from attempt history.
     */
    async crossCheck(e, timings) {
      const index = new Map(e.ids.map((id, i) => [id, i]));
      const first = e.ids.reduce((m, id) => (BigInt(id) < m ? BigInt(id) : m), BigInt(e.ids[0]!));
      const r = await pool.query<{ id: string; claimed: number; settled: number }>(
        `SELECT e.id::text AS id, (extract(epoch FROM l.claimed_at) * 1000)::float8 AS claimed,
                (extract(epoch FROM x.settled_at) * 1000)::float8 AS settled
           FROM "${SCHEMA}".ready e
           JOIN LATERAL (SELECT l.from_seq, l.claimed_at FROM "${SCHEMA}".range_leases l
                          WHERE l.lane_id = e.lane_id AND l.slot = e.slot
                            AND l.from_seq <= e.lane_seq AND l.to_seq >= e.lane_seq
                          ORDER BY l.from_seq DESC LIMIT 1) l ON true
           JOIN LATERAL (SELECT x.settled_at FROM "${SCHEMA}".range_settlements x
                          WHERE x.lane_id = e.lane_id AND x.slot = e.slot AND x.lease_from = l.from_seq
                            AND x.seqs @> e.lane_seq AND x.outcome = 'completed' LIMIT 1) x ON true
          WHERE e.id >= $1::bigint`,
        [first.toString()],
      );
      let inRing = 0;
      let differ = 0;
      for (const row of r.rows) {
        const i = index.get(row.id);
        if (i === undefined) continue;
        inRing++;
        const t = timings[i]!;
        if (t.startedMs !== row.claimed || t.completedMs !== row.settled) differ++;
      }
      return { inRing, tasks: e.ids.length, differ };
    },

    async finish() {
      await worker?.stop();
      worker = null;
      await monitor?.end();
      monitor = null;
      await dropSchema(url, SCHEMA);
    },

    errors: () => worker?.errors ?? [],

    close: () => pool.end(),
  };
}
