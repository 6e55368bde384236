import { execFileSync } from 'node:child_process';
/** Small async helpers shared by the scenarios and adapters. */

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Progress goes to stderr so stdout carries only the Markdown report. */
export function log(message: string): void {
  process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${message}\n`);
}

export class TimeoutError extends Error {
  constructor(label: string, ms: number) {
    super(`${label} timed out after ${ms} ms`);
    this.name = 'TimeoutError';
  }
}

/** Race `p` against a timer; the timer is cleared so it never keeps the process alive. */
export async function withTimeout<T>(p: Promise<T>, ms: number, label: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new TimeoutError(label, ms)), ms);
  });
  try {
    return await Promise.race([p, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** Poll `done()` every `everyMs` until it holds (true) or `timeoutMs` passes (false). */
export async function waitUntil(done: () => boolean, timeoutMs: number, everyMs = 5): Promise<boolean> {
  const end = performance.now() + timeoutMs;
  while (!done()) {
    if (performance.now() >= end) return false;
    await sleep(everyMs);
  }
  return true;
}

/** Set when some cleanup step had to be abandoned; run.ts then exits explicitly at the end. */
export const leaks: string[] = [];

/** Run a cleanup step with a bound; a stuck step is recorded rather than hanging the bench. */
export async function cleanup(label: string, fn: () => Promise<unknown>, ms = 30_000): Promise<void> {
  try {
    await withTimeout(Promise.resolve().then(fn), ms, label);
  } catch (err) {
    const message = `${label}: ${(err as Error).message}`;
    leaks.push(message);
    log(`cleanup problem: ${message}`);
  }
}

/** The berth commit a benchmark measured, and whether src/ had uncommitted changes. */
export function berthRevision(): string {
  try {
    const git = (...args: string[]) =>
      execFileSync('git', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
    const head = git('rev-parse', '--short', 'HEAD');
    const dirty = git('status', '--porcelain', '--', 'src').split('\n').filter(Boolean).length;
    return dirty > 0 ? `${head} + ${dirty} uncommitted file(s) in src/` : head;
  } catch {
    return 'unknown';
  }
}
