/** The driver's side of a bench/deps/worker.ts process: fork it, ask it for its counters, stop it. */
import { type ChildProcess, fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { FromWorker, ToWorker, WorkerEnv, WorkerStats } from './protocol.js';
import { log } from '../util.js';

export interface WorkerProcess {
  stats(): Promise<WorkerStats>;
  /** Graceful stop; SIGKILL after 30 s. Idempotent. */
  stop(): Promise<void>;
  /** Errors the worker reported (pg-boss emits them instead of throwing). */
  readonly errors: string[];
}

const WORKER_FILE = fileURLToPath(new URL('./worker.ts', import.meta.url));

export async function startWorkerProcess(env: WorkerEnv): Promise<WorkerProcess> {
  const child: ChildProcess = fork(WORKER_FILE, [], {
    execArgv: ['--import', 'tsx'],
    env: { ...process.env, ...env },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const errors: string[] = [];
  const waiting: ((m: FromWorker) => boolean)[] = [];
  child.on('message', (m: FromWorker) => {
    if (m.kind === 'error') {
      if (errors.length < 20) errors.push(m.message);
      if (errors.length <= 3) log(`worker error: ${m.message}`);
      return;
    }
    const at = waiting.findIndex((w) => w(m));
    if (at >= 0) waiting.splice(at, 1);
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const next = <K extends FromWorker['kind']>(kind: K, timeoutMs: number) =>
    new Promise<Extract<FromWorker, { kind: K }>>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`the worker process sent no "${kind}" in ${timeoutMs} ms`)),
        timeoutMs,
      );
      void exited.then(() => {
        clearTimeout(timer);
        reject(new Error(`the worker process exited (code ${child.exitCode}) before sending "${kind}"`));
      });
      waiting.push((m) => {
        if (m.kind !== kind) return false;
        clearTimeout(timer);
        resolve(m as Extract<FromWorker, { kind: K }>);
        return true;
      });
    });
  const request = (m: ToWorker) => child.send(m);
  await next('ready', 60_000);
  let stopping: Promise<void> | null = null;
  return {
    errors,
    stats: () => {
      const answer = next('stats', 30_000);
      request({ kind: 'stats' });
      return answer;
    },
    stop: () => {
      stopping ??= (async () => {
        if (child.exitCode !== null || child.signalCode !== null) return;
        const kill = setTimeout(() => child.kill('SIGKILL'), 30_000);
        request({ kind: 'stop' });
        await exited;
        clearTimeout(kill);
      })();
      return stopping;
    },
  };
}
