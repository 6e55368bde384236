/**
 * The inside of a fleet process (test/support/fleet.ts): what every worker fixture the fleet
 * forks (test/fixtures/chaos-worker.ts, test/fixtures/deps-chaos-worker.ts) does the same way.
 *
 * It loads, says so over IPC, and waits as a standby until the parent tells it to start (no
 * database session before that: loading the modules is most of a start on a busy machine, so
 * the suite keeps a spare loaded and a replacement starts at once). Then it reports when its
 * Worker runs, and whenever it becomes or stops being the maintenance leader, so the leader can
 * be the one killed. SIGTERM stops it gracefully; the parent's exit (IPC disconnect) ends it.
 *
 * Its handlers record their runs with `recordRun` in the process's own JSONL run log (RUN_LOG,
 * read by test/support/run-log.ts).
 */
import { pino } from 'pino';
import type { TaskContext, Worker, WorkerOptions } from '../../src/index.js';
import { appendRun, CHAOS_MARGIN_MS, type RunRecord } from './run-log.js';
import { FAST_MAINTENANCE } from './settings.js';

/** Where a start tells the process to connect. */
export interface FleetTarget {
  databaseUrl: string;
  schema: string;
}

const runLog = process.env.RUN_LOG!;
/** The process's berth worker id (the fleet's name for it). */
export const fleetWorkerId = process.env.WORKER_ID!;

/**
 * A fleet worker's settings but its tasks: short on purpose, so a lease is its type's ceiling +
 * a 1 s margin (what a killed worker held comes back within seconds), and maintenance runs on the
 * test cadence.
 */
export function fleetWorkerOptions(target: FleetTarget): Omit<WorkerOptions, 'tasks'> {
  return {
    connectionString: target.databaseUrl,
    schema: target.schema,
    slots: 4,
    leaseMarginMs: CHAOS_MARGIN_MS,
    pollIntervalMs: 250,
    heartbeatIntervalMs: 1000,
    listenReconnectBaseMs: 100,
    stopTimeoutMs: 5000,
    workerId: fleetWorkerId,
    logger: pino({ level: process.env.BERTH_LOG_LEVEL ?? 'info' }),
    maintenance: FAST_MAINTENANCE,
  };
}

/**
 * Append one event of a handler run to the run log (synchronously: a SIGKILL right after loses
 * nothing written). `extra` fields ride along on the line; the run log's reader ignores them.
 */
export function recordRun(
  ev: RunRecord['ev'],
  ctx: Pick<TaskContext<unknown>, 'id' | 'attempt'>,
  deadline?: Date,
  extra: Record<string, unknown> = {},
): void {
  const rec: RunRecord = {
    ...extra,
    ev,
    id: ctx.id,
    attempt: ctx.attempt,
    pid: process.pid,
    worker: fleetWorkerId,
    t: Date.now(),
    deadline: deadline?.getTime(),
  };
  appendRun(runLog, rec);
}

/**
 * A handler's work: `ms` of waiting, cut short when the run's signal aborts (its deadline
 * passed, or the worker stops), which is recorded as `abort` and rejects with the reason.
 */
export function workFor(ms: number, ctx: TaskContext<unknown>): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    ctx.signal.addEventListener(
      'abort',
      () => {
        clearTimeout(t);
        recordRun('abort', ctx);
        reject(ctx.signal.reason);
      },
      { once: true },
    );
  });
}

/** Run the fleet protocol around the Worker `create` makes once the parent says where. */
export async function serveFleet(create: (target: FleetTarget) => Worker): Promise<void> {
  const send = (msg: unknown) => {
    if (process.connected) process.send?.(msg);
  };
  let worker: Worker | null = null;
  // The suite is gone (its runner was killed): do not outlive it.
  process.on('disconnect', () => process.exit(0));
  process.on('SIGTERM', async () => {
    await worker?.stop();
    process.exit(0);
  });
  const target = await new Promise<FleetTarget>((resolve) => {
    process.on('message', (m: { kind?: string } & FleetTarget) => m.kind === 'start' && resolve(m));
    send({ kind: 'loaded' });
  });
  const running = create(target);
  worker = running;
  await running.start();
  send({ kind: 'ready' });

  let leader = false;
  setInterval(() => {
    if (running.isLeader === leader) return;
    leader = running.isLeader;
    send({ kind: 'leader', leader });
  }, 50).unref();
}
