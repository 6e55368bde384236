/** Summary statistics and cell formatting for the report. */

export function median(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

/** Nearest-rank percentile (p in 0..100) of a sample. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * s.length);
  return s[Math.min(s.length - 1, Math.max(0, rank - 1))]!;
}

/** One measurement of one metric in one repetition. */
export type Sample =
  | { kind: 'ok'; value: number }
  /** The scenario hit its timeout; `note` says how far it got. */
  | { kind: 'timeout'; note: string }
  | { kind: 'error'; note: string }
  /** Not run this repetition (an earlier repetition already timed out). */
  | { kind: 'skipped' };

export type Formatter = (x: number) => string;

export const fmtRate: Formatter = (x) => Math.round(x).toLocaleString('en-US');
export const fmtMs: Formatter = (x) => (x >= 100 ? Math.round(x).toLocaleString('en-US') : x.toFixed(1));
export const fmtBytes: Formatter = (x) => Math.round(x).toLocaleString('en-US');
export const fmtRatio: Formatter = (x) => (x !== 0 && Math.abs(x) < 0.1 ? x.toFixed(3) : x.toFixed(2));

/** "median (min–max)" over the repetitions; "timeout"/"error" if any repetition failed. */
export function formatCell(samples: readonly Sample[] | undefined, fmt: Formatter): string {
  if (!samples || samples.length === 0) return '–';
  const failed = samples.find((s) => s.kind === 'timeout' || s.kind === 'error');
  if (failed && (failed.kind === 'timeout' || failed.kind === 'error')) {
    return `${failed.kind}${failed.note ? ` (${failed.note})` : ''}`;
  }
  const values = samples.flatMap((s) => (s.kind === 'ok' ? [s.value] : []));
  if (values.length === 0) return '–';
  const m = fmt(median(values));
  if (values.length === 1) return m;
  return `${m} (${fmt(Math.min(...values))}–${fmt(Math.max(...values))})`;
}
