/**
 * The chaos suite's worker processes (test/fixtures/chaos-worker.ts): started, killed and
 * stopped by the test, each with its own run log and output file. The fleet remembers which
 * processes the test killed and when, and every exit it did not cause (a berth process that
 * crashed), with the tail of that process's output (its stack).
 */
import { fork, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const FIXTURE = fileURLToPath(new URL('../fixtures/chaos-worker.ts', import.meta.url));

export interface FleetProcess {
  id: string;
  pid: number;
  child: ChildProcess;
  runLog: string;
  outFile: string;
  /** Its Worker has started (it said so over IPC). */
  ready: boolean;
  /** Last leadership report over IPC. */
  leader: boolean;
  /** When the test sent it SIGKILL (Date.now()), if it did. */
  killedAt: number | null;
  /** Set once the test asked it to stop (SIGTERM). */
  stopping: boolean;
  exit: { code: number | null; signal: NodeJS.Signals | null } | null;
}

export interface Crash {
  id: string;
  pid: number;
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

export class Fleet {
  readonly all: FleetProcess[] = [];
  /** Exits the test did not cause. */
  readonly crashes: Crash[] = [];
  private next = 1;
  private readonly starting: Promise<FleetProcess>[] = [];

  constructor(
    private readonly env: { DATABASE_URL: string; SCHEMA: string },
    private readonly dir: string,
  ) {}

  get alive(): FleetProcess[] {
    return this.all.filter((p) => p.exit === null && p.killedAt === null);
  }

  get killedAt(): Map<number, number> {
    return new Map(this.all.filter((p) => p.killedAt !== null).map((p) => [p.pid, p.killedAt!]));
  }

  get runLogs(): string[] {
    return this.all.map((p) => p.runLog);
  }

  /** Start one worker process; resolves once its Worker has started. */
  spawn(): Promise<FleetProcess> {
    const id = `w${this.next++}`;
    const runLog = join(this.dir, `${id}.runs.jsonl`);
    const outFile = join(this.dir, `${id}.out`);
    const out = openSync(outFile, 'a');
    const env: NodeJS.ProcessEnv = { ...process.env, ...this.env, WORKER_ID: id, RUN_LOG: runLog };
    // The child is not a test file: it must not report to the test runner.
    delete env.NODE_TEST_CONTEXT;
    const child = fork(FIXTURE, [], { execArgv: ['--import', 'tsx'], env, stdio: ['ignore', out, out, 'ipc'] });
    closeSync(out);
    const p: FleetProcess = { id, pid: child.pid!, child, runLog, outFile, ready: false, leader: false, killedAt: null, stopping: false, exit: null };
    this.all.push(p);
    child.on('message', (m: { kind: string; leader?: boolean }) => {
      if (m.kind === 'leader') p.leader = m.leader === true;
    });
    child.once('exit', (code, signal) => {
      p.exit = { code, signal };
      p.leader = false;
      const expected = p.killedAt !== null || (p.stopping && code === 0);
      if (!expected) this.crashes.push({ id, pid: p.pid, code, signal, output: this.outputTail(p) });
    });
    return new Promise((resolve, reject) => {
      child.on('message', (m: { kind: string }) => {
        if (m.kind !== 'ready') return;
        p.ready = true;
        resolve(p);
      });
      child.once('exit', (code) => reject(new Error(`worker ${id} exited before it was ready (${code}):\n${this.outputTail(p)}`)));
    });
  }

  /** Start a replacement without waiting for it; ready() waits for every such start. */
  spawnInBackground(): void {
    this.starting.push(this.spawn());
  }

  /** Wait for every background start (one that exited early is already among the crashes). */
  async ready(): Promise<void> {
    await Promise.allSettled(this.starting.splice(0));
  }

  /** SIGKILL, and wait for the exit. */
  async kill(p: FleetProcess): Promise<void> {
    p.killedAt = Date.now();
    p.child.kill('SIGKILL');
    await this.exited(p);
  }

  /** The process that reports being the maintenance leader, if one does. */
  leader(): FleetProcess | undefined {
    return this.alive.find((p) => p.leader);
  }

  /** SIGTERM every process still running (graceful stop), SIGKILL after `timeoutMs`. */
  async stopAll(timeoutMs = 30_000): Promise<void> {
    const running = this.all.filter((p) => p.exit === null);
    for (const p of running) {
      p.stopping = true;
      p.child.kill('SIGTERM');
    }
    const timer = setTimeout(() => {
      for (const p of running) if (p.exit === null) p.child.kill('SIGKILL');
    }, timeoutMs);
    await Promise.all(running.map((p) => this.exited(p)));
    clearTimeout(timer);
  }

  outputTail(p: FleetProcess, lines = 40): string {
    if (!existsSync(p.outFile)) return '';
    return readFileSync(p.outFile, 'utf8').split('\n').slice(-lines).join('\n');
  }

  private exited(p: FleetProcess): Promise<void> {
    return new Promise((resolve) => {
      if (p.exit !== null) return resolve();
      p.child.once('exit', () => resolve());
    });
  }
}
