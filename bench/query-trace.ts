/**
 * For bench/cold-drain-probe.ts and bench/cold-pickup-probe.ts --trace: every pg client's
 * connects and queries of this process written to stderr as they start, and as they end when the
 * call returns a promise (a query made with a callback or a submittable shows its start only):
 * `T <event> <epoch ms> <first words>`; each wake notification's arrival (`T notify`); and each
 * garbage collection with its pause (`T gc <epoch ms> <ms> <kind>`, kind 1 a scavenge, 4 a
 * mark-compact), so a new process's start and its slow pickups can be read as a timeline (which
 * session opened when, which statement waited, what the process was collecting meanwhile).
 * A bench aid only: it wraps pg.Client's prototype methods of this process.
 */
import { PerformanceObserver } from 'node:perf_hooks';
import pg from 'pg';

type Method = (this: unknown, ...args: unknown[]) => unknown;

const epoch = (): string => (performance.timeOrigin + performance.now()).toFixed(1);

function wrap(name: 'query' | 'connect', label: (args: unknown[]) => string): void {
  const proto = pg.Client.prototype as unknown as Record<string, Method>;
  const original = proto[name]!;
  let n = 0;
  proto[name] = function (this: unknown, ...args: unknown[]) {
    const id = `${name}${++n}`;
    process.stderr.write(`T ${id}> ${epoch()} ${label(args)}\n`);
    const result = original.apply(this, args);
    if (result instanceof Promise)
      result.then(
        () => process.stderr.write(`T ${id}< ${epoch()}\n`),
        () => process.stderr.write(`T ${id}! ${epoch()}\n`),
      );
    return result;
  };
}

export function traceQueries(): void {
  wrap('connect', () => '');
  // A notification's arrival (LISTEN): the wake a pickup waits for.
  const proto = pg.Client.prototype as unknown as { emit: (event: string, ...args: unknown[]) => boolean };
  const emit = proto.emit;
  proto.emit = function (this: unknown, event: string, ...args: unknown[]) {
    if (event === 'notification') process.stderr.write(`T notify ${epoch()}\n`);
    return emit.call(this, event, ...args);
  };
  // Each garbage collection, with its pause: `T gc <epoch ms at its start> <ms> <kind>`.
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      const kind = (e as PerformanceEntry & { detail?: { kind?: number } }).detail?.kind ?? 0;
      process.stderr.write(
        `T gc ${(performance.timeOrigin + e.startTime).toFixed(1)} ${e.duration.toFixed(2)} ${kind}\n`,
      );
    }
  }).observe({ entryTypes: ['gc'] });
  wrap('query', (args) => {
    const c = args[0] as { text?: string } | string | undefined;
    const text = typeof c === 'string' ? c : (c?.text ?? '');
    return text.replace(/\s+/g, ' ').slice(0, 60);
  });
}
