/**
 * The chaos suite's worker processes (test/fixtures/chaos-worker.ts, or another fixture that
 * speaks the same protocol: test/support/fleet-worker.ts): started, killed and
 * stopped by the test, each with its own run log and output file. The fleet remembers which
 * processes the test killed and when, and every exit it did not cause (a berth process that
 * crashed), with the tail of that process's output (its stack).
 *
 * Loading the modules is most of a process start (about 1.5 s of CPU under tsx, and 20-45 s of
 * wall time measured at load averages of 45-80 on 2 cores), so the fleet keeps spares: processes
 * that have loaded and wait, with no database session, until a start makes them workers.
 */
import assert from 'node:assert/strict';
import { fork, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** A fixture of test/fixtures/ by file name. */
export function fixturePath(name: string): string {
  return fileURLToPath(new URL(`../fixtures/${name}`, import.meta.url));
}

export interface FleetProcess {
  /** Also its berth worker id. */
  id: string;
  pid: number;
  child: ChildProcess;
  runLog: string;
  outFile: string;
  /** It was told to start a Worker (a spare until then). */
  activated: boolean;
  /** Its Worker has started (it said so over IPC). */
  ready: boolean;
  /** Last leadership report over IPC. */
  leader: boolean;
  /** When the test sent it SIGKILL (Date.now()), if it did. */
  killedAt: number | null;
  /** Set once the test asked it to stop (SIGTERM). */
  stopping: boolean;
  exit: { code: number | null; signal: NodeJS.Signals | null } | null;
  /** When its exit was seen (Date.now()). */
  exitedAt: number | null;
  /** Resolves once it has loaded its modules (rejects if it exits first). */
  loaded: Promise<void>;
}

export interface Crash {
  id: string;
  pid: number;
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
}

type Message = { kind: string; leader?: boolean };

export class Fleet {
  /** Every process forked, spares included. */
  readonly all: FleetProcess[] = [];
  /** Processes made workers, in the order they were. */
  readonly workers: FleetProcess[] = [];
  /** Exits the test did not cause. */
  readonly crashes: Crash[] = [];
  private next = 1;
  private readonly starting: Promise<unknown>[] = [];

  /** Where workers connect, sent with each start (spares load before the cluster exists). */
  target: { databaseUrl: string; schema: string } | null = null;

  constructor(
    private readonly dir: string,
    /** Spares kept loaded. */
    private readonly spareCount = 1,
    /** The worker script every process runs. */
    private readonly fixture = fixturePath('chaos-worker.ts'),
  ) {}

  /** Workers running or starting, not killed. */
  get alive(): FleetProcess[] {
    return this.workers.filter((p) => p.exit === null && p.killedAt === null);
  }

  /** Per killed pid: from the SIGKILL sent to the exit seen. */
  get kills(): Map<number, { start: number; end: number }> {
    return new Map(
      this.all
        .filter((p) => p.killedAt !== null)
        .map((p) => [p.pid, { start: p.killedAt!, end: p.exitedAt ?? Infinity }]),
    );
  }

  get runLogs(): string[] {
    return this.workers.map((p) => p.runLog);
  }

  /** Fork spares up to `n` (they load in the background). */
  warm(n = this.spareCount): void {
    const spares = this.all.filter((p) => !p.activated && p.exit === null).length;
    for (let i = spares; i < n; i++) this.fork();
  }

  /** Make a spare (or a new process) a worker; resolves once its Worker has started. */
  async spawn(): Promise<FleetProcess> {
    const p = this.all.find((x) => !x.activated && x.exit === null) ?? this.fork();
    p.activated = true;
    this.workers.push(p);
    this.warm();
    await p.loaded;
    const ready = new Promise<FleetProcess>((resolve, reject) => {
      p.child.on('message', (m: Message) => m.kind === 'ready' && resolve(p));
      p.child.once('exit', (code) =>
        reject(new Error(`worker ${p.id} exited before it was ready (${code}):\n${this.outputTail(p)}`)),
      );
    });
    if (!this.target) throw new Error('fleet.target is not set');
    p.child.send({ kind: 'start', ...this.target });
    await ready;
    p.ready = true;
    return p;
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

  /** The worker that reports being the maintenance leader, if one does. */
  leader(): FleetProcess | undefined {
    return this.alive.find((p) => p.leader);
  }

  /** SIGTERM every process still running, spares too (graceful stop), SIGKILL after `timeoutMs`. */
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

  private fork(): FleetProcess {
    const id = `w${this.next++}`;
    const runLog = join(this.dir, `${id}.runs.jsonl`);
    const outFile = join(this.dir, `${id}.out`);
    const out = openSync(outFile, 'a');
    const env: NodeJS.ProcessEnv = { ...process.env, WORKER_ID: id, RUN_LOG: runLog };
    // The child is not a test file: it must not report to the test runner.
    delete env.NODE_TEST_CONTEXT;
    const child = fork(this.fixture, [], { execArgv: ['--import', 'tsx'], env, stdio: ['ignore', out, out, 'ipc'] });
    closeSync(out);
    const p: FleetProcess = {
      id,
      pid: child.pid!,
      child,
      runLog,
      outFile,
      activated: false,
      ready: false,
      leader: false,
      killedAt: null,
      stopping: false,
      exit: null,
      exitedAt: null,
      loaded: new Promise((resolve, reject) => {
        child.on('message', (m: Message) => m.kind === 'loaded' && resolve());
        child.once('exit', (code) =>
          reject(new Error(`process ${id} exited while loading (${code}):\n${this.outputTail(p)}`)),
        );
      }),
    };
    // Awaited by spawn(); a spare that dies unused is reported among the crashes instead.
    p.loaded.catch(() => undefined);
    this.all.push(p);
    child.on('message', (m: Message) => {
      if (m.kind === 'leader') p.leader = m.leader === true;
    });
    child.once('exit', (code, signal) => {
      p.exit = { code, signal };
      p.exitedAt = Date.now();
      p.leader = false;
      // A spare still loading has no SIGTERM handler yet, and never ran berth.
      const expected = p.killedAt !== null || (p.stopping && (code === 0 || (!p.activated && signal === 'SIGTERM')));
      if (!expected) this.crashes.push({ id, pid: p.pid, code, signal, output: this.outputTail(p) });
    });
    return p;
  }

  private exited(p: FleetProcess): Promise<void> {
    return new Promise((resolve) => {
      if (p.exit !== null) return resolve();
      p.child.once('exit', () => resolve());
    });
  }
}

/** Fails, with each process's output, when a fleet process exited that the test did not kill. */
export function assertNoCrashes(crashes: readonly Crash[]): void {
  assert.deepEqual(
    crashes.map((c) => `${c.id} (pid ${c.pid}) exited ${c.code ?? c.signal}:\n${c.output}`),
    [],
    'a berth process exited that the test did not kill (or it did not stop cleanly)',
  );
}
