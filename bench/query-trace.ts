/**
 * For bench/cold-drain-probe.ts --trace: every pg client's connects and queries of this process
 * written to stderr as they start, and as they end when the call returns a promise (a query
 * made with a callback or a submittable shows its start only): `T <event> <epoch ms> <first words>`, so a new
 * process's start can be read as a timeline (which session opened when, which statement waited).
 * A bench aid only: it wraps pg.Client's prototype methods of this process.
 */
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
  wrap('query', (args) => {
    const c = args[0] as { text?: string } | string | undefined;
    const text = typeof c === 'string' ? c : (c?.text ?? '');
    return text.replace(/\s+/g, ' ').slice(0, 60);
  });
}
