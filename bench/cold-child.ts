/**
 * One cold measurement of `npm run bench` (bench/cold.ts), in a process that has run nothing
 * before: it loads the systems' modules, says it is ready, and only then runs the one thing the
 * parent asks for, so the worker (or the producer) is the first code of the process to run.
 * The parent enqueues, probes the database and keeps the clock; this process only reports the
 * instants it saw, as epoch milliseconds (`performance.timeOrigin + performance.now()`, the same
 * clock in both processes to well under a millisecond).
 *
 * Messages (process.send / 'message'), parent → child: `go`, then `stop`. Child → parent:
 * `ready`; for a drain `started` (every task's handler has started); for a pickup `run` per
 * handler start; for an enqueue `enqueued`; `stopped` once the worker has stopped.
 */
import { benchSystems } from './systems/all.js';
import { traceQueries } from './query-trace.js';
import type { RunningWorker } from './systems/types.js';

// bench/cold-drain-probe.ts --trace: this process's connects and queries as a timeline on stderr.
if (process.env.BENCH_TRACE) traceQueries();

export type ColdJob =
  | { kind: 'drain'; label: string; url: string; concurrency: number; n: number }
  | { kind: 'pickup'; label: string; url: string; concurrency: number }
  | {
      kind: 'enqueue';
      label: string;
      url: string;
      calls: number;
      /** Run the system's migrate() on the producer's session before the first enqueue (Producer.migrate). */
      migrateFirst: boolean;
    };

export type ChildMessage =
  | { type: 'ready' }
  | {
      type: 'started';
      t0: number;
      /** When the worker's start() resolved, and when the first handler ran (epoch ms). */
      up: number;
      firstRun: number;
      lastFirstRun: number;
      duplicates: number;
    }
  | { type: 'workerStarted' }
  | { type: 'run'; i: number; at: number }
  | { type: 'enqueued'; firstMs: number; laterMs: number[] }
  | { type: 'stopped' }
  | { type: 'failed'; note: string };

export type ParentMessage = { type: 'go' } | { type: 'stop' };

const epoch = (): number => performance.timeOrigin + performance.now();

function send(msg: ChildMessage): void {
  process.send?.(msg);
}

function nextMessage(type: ParentMessage['type']): Promise<void> {
  return new Promise((resolve) => {
    const on = (msg: ParentMessage) => {
      if (msg.type !== type) return;
      process.off('message', on);
      resolve();
    };
    process.on('message', on);
  });
}

async function run(job: ColdJob): Promise<void> {
  const adapter = benchSystems({ connectionString: job.url }, []).find((a) => a.label === job.label);
  if (!adapter) throw new Error(`no system labelled ${job.label}`);
  const go = nextMessage('go');
  send({ type: 'ready' });
  await go;
  if (job.kind === 'enqueue') {
    const producer = await adapter.openProducer();
    try {
      if (job.migrateFirst) {
        if (!producer.migrate) throw new Error(`${job.label} has no migrate step of its own`);
        await producer.migrate();
      }
      let at = performance.now();
      await producer.single(0);
      const firstMs = performance.now() - at;
      const laterMs: number[] = [];
      for (let i = 1; i <= job.calls; i++) {
        at = performance.now();
        await producer.single(i);
        laterMs.push(performance.now() - at);
      }
      send({ type: 'enqueued', firstMs, laterMs });
    } finally {
      await producer.close();
    }
    return;
  }
  const stop = nextMessage('stop');
  let worker: RunningWorker;
  let up = Number.NaN;
  if (job.kind === 'drain') {
    const seen = new Uint8Array(job.n);
    let distinct = 0;
    let duplicates = 0;
    let firstRun = Number.NaN;
    const t0 = epoch();
    if (process.env.BENCH_TRACE) process.stderr.write(`T t0 ${t0.toFixed(1)}\n`);
    worker = await adapter.startWorker(job.concurrency, {
      record(i) {
        if (!(i >= 0 && i < job.n)) return;
        if (seen[i]) {
          duplicates++;
          return;
        }
        seen[i] = 1;
        if (distinct === 0) firstRun = epoch();
        if (++distinct === job.n) send({ type: 'started', t0, up, firstRun, lastFirstRun: epoch(), duplicates });
      },
    });
    up = epoch();
  } else {
    // Every handler start, repeats included: the parent takes each task's first and counts the rest.
    worker = await adapter.startWorker(job.concurrency, {
      record(i) {
        const at = epoch();
        if (process.env.BENCH_TRACE) process.stderr.write(`T run ${at.toFixed(1)} ${i}\n`);
        send({ type: 'run', i, at });
      },
    });
    send({ type: 'workerStarted' });
  }
  await stop;
  await worker.stop();
  send({ type: 'stopped' });
}

const job = JSON.parse(process.argv[2] ?? '{}') as ColdJob;
run(job).then(
  () => process.disconnect?.(),
  (err: unknown) => {
    send({ type: 'failed', note: (err instanceof Error ? err.message : String(err)).split('\n')[0]!.slice(0, 200) });
    process.exitCode = 1;
    process.disconnect?.();
  },
);
