/**
 * The chaos suite's evidence: every handler run, as the worker processes wrote it to their
 * JSONL run logs (a `start` line, then an `end` line if the handler returned), and what follows
 * from it: which tasks never completed, which ran more than once and whether each repeat is
 * explained by the fault, and how soon completions resumed after it.
 */
import { appendFileSync, closeSync, existsSync, openSync, readSync, statSync } from 'node:fs';

/** The one task type the chaos workers run. */
export const CHAOS_TASK = 'chaos_step';

export interface RunRecord {
  /** `abort`: the handler's signal fired (its deadline passed, or the worker stopped). */
  ev: 'start' | 'end' | 'abort';
  id: string;
  attempt: number;
  pid: number;
  worker: string;
  t: number;
  /** On `start`: the handler's deadline (epoch ms), lease expiry minus the margin. */
  deadline?: number;
}

/** Append one record (synchronously: a SIGKILL right after loses nothing written). */
export function appendRun(file: string, rec: RunRecord): void {
  appendFileSync(file, `${JSON.stringify(rec)}\n`);
}

/** One handler run: its start, and its end if the handler returned. */
export interface Run {
  id: string;
  attempt: number;
  pid: number;
  start: number;
  end: number | null;
  deadline: number;
  /** When its signal aborted it, if it did. */
  aborted: number | null;
}

/**
 * Every run in a set of run logs, read incrementally: each refresh reads only what was appended
 * since the last one (the suite polls it while thousands of runs accumulate). A line cut short
 * by a SIGKILL is never completed, so it is never parsed.
 */
export class RunLog {
  private readonly offsets = new Map<string, number>();
  private readonly open = new Map<string, Run>();
  private readonly all: Run[] = [];

  /** Every run so far in `files`, in the order written (per file). */
  read(files: readonly string[]): readonly Run[] {
    for (const file of files) this.readFile(file);
    return this.all;
  }

  private readFile(file: string): void {
    if (!existsSync(file)) return;
    const from = this.offsets.get(file) ?? 0;
    const size = statSync(file).size;
    if (size <= from) return;
    const buf = Buffer.alloc(size - from);
    const fd = openSync(file, 'r');
    try {
      readSync(fd, buf, 0, buf.length, from);
    } finally {
      closeSync(fd);
    }
    const text = buf.toString('utf8');
    const complete = text.lastIndexOf('\n') + 1;
    this.offsets.set(file, from + Buffer.byteLength(text.slice(0, complete)));
    for (const line of text.slice(0, complete).split('\n')) {
      if (line) this.add(JSON.parse(line) as RunRecord);
    }
  }

  private add(rec: RunRecord): void {
    const key = `${rec.pid}:${rec.id}:${rec.attempt}`;
    if (rec.ev === 'start') {
      const run: Run = {
        id: rec.id,
        attempt: rec.attempt,
        pid: rec.pid,
        start: rec.t,
        end: null,
        deadline: rec.deadline ?? Infinity,
        aborted: null,
      };
      this.open.set(key, run);
      this.all.push(run);
      return;
    }
    const run = this.open.get(key);
    if (!run) return;
    if (rec.ev === 'abort') {
      run.aborted = rec.t;
      return;
    }
    run.end = rec.t;
    this.open.delete(key);
  }
}

/** The fault's window: from the first injected fault to the moment it was over. */
export interface FaultWindow {
  start: number;
  end: number;
}

/** The chaos task's ceiling and the workers' lease margin: a lease lasts their sum (4 s). */
export const CHAOS_CEILING_MS = 3000;
export const CHAOS_MARGIN_MS = 1000;

/**
 * How long after a handler returned its completion may still be unwritten: a flush that fails
 * because the server is unreachable is retried until the lease expires (settlement-batcher.ts),
 * at most a lease after the run started; plus a second for a flush that began just before.
 */
export const SETTLE_GRACE_MS = CHAOS_CEILING_MS + CHAOS_MARGIN_MS + 1000;

export interface DuplicateReport {
  /** Tasks that ran more than once. */
  tasks: number;
  /** Earlier runs that were repeated, explained or not. */
  repeated: number;
  /**
   * Repeats explained only because the earlier run overran its deadline (returned after it, or
   * was aborted at it): its lease may have lapsed before the completion was written, and seed 000
   * has the task run again. The machine, not the fault, made it late; counted apart.
   */
  late: number;
  unexplained: { id: string; run: Run; next: Run }[];
}

/**
 * A repeated run is explained when the earlier run's process was killed by the test while that
 * run (or its settlement) was in flight (`kills`: per pid, from the SIGKILL sent to the exit
 * seen; on a loaded machine a process can run on for a while in between), or the earlier run straddled the fault window (started
 * before the fault ended, and had not finished settling before it began), or it overran its
 * deadline (`late`). Pass a null window when the fault was only the kills: then the window
 * explains nothing.
 */
export function explainDuplicates(
  runs: readonly Run[],
  window: FaultWindow | null,
  kills: ReadonlyMap<number, FaultWindow>,
): DuplicateReport {
  const byTask = new Map<string, Run[]>();
  for (const r of runs) {
    const list = byTask.get(r.id);
    if (list) list.push(r);
    else byTask.set(r.id, [r]);
  }
  const report: DuplicateReport = { tasks: 0, repeated: 0, late: 0, unexplained: [] };
  // Started before the window ended, and not done settling before it began.
  const straddles = (r: Run, w: FaultWindow) =>
    r.start <= w.end && (r.end === null || r.end + SETTLE_GRACE_MS >= w.start);
  for (const [id, list] of byTask) {
    if (list.length < 2) continue;
    list.sort((a, b) => a.start - b.start);
    report.tasks++;
    for (let i = 0; i < list.length - 1; i++) {
      const run = list[i]!;
      report.repeated++;
      const kill = kills.get(run.pid);
      const byKill = kill !== undefined && straddles(run, kill);
      const byFault = window !== null && straddles(run, window);
      if (byKill || byFault) continue;
      if (run.aborted !== null || (run.end !== null && run.end > run.deadline)) report.late++;
      else report.unexplained.push({ id, run, next: list[i + 1]! });
    }
  }
  return report;
}

/** Tasks (of `ids`) with no run that returned. */
export function uncompleted(runs: readonly Run[], ids: Iterable<string>): string[] {
  const done = new Set(runs.filter((r) => r.end !== null).map((r) => r.id));
  return [...ids].filter((id) => !done.has(id));
}

/**
 * Seconds from the fault's end until `n` runs that started after it had returned: completions
 * have resumed. null when fewer than `n` have.
 */
export function recoverySeconds(runs: readonly Run[], faultEnd: number, n: number): number | null {
  const ends = runs
    .filter((r) => r.start >= faultEnd && r.end !== null)
    .map((r) => r.end!)
    .sort((a, b) => a - b);
  return ends.length >= n ? (ends[n - 1]! - faultEnd) / 1000 : null;
}
