/**
 * A duration written with its unit (500ms, 30s, 15m, 2h), as the CLI's options and a rate
 * limit's interval take it (`20/1s`). A bare number is refused: `30` could mean 30 ms or 30 s,
 * and reading it either way silently is how a task runs a thousand times too early.
 */
const UNITS: Readonly<Record<string, number>> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** The duration in ms, or why `value` is not one. */
export function parseDuration(value: string): { ms: number } | { error: string } {
  const m = /^(\d+)(ms|s|m|h)$/.exec(value.trim());
  if (m) return { ms: Number(m[1]) * UNITS[m[2]!]! };
  const v = value.trim();
  return {
    error: /^\d+$/.test(v)
      ? `"${value}" has no unit: write ${v}ms, ${v}s, ${v}m or ${v}h`
      : `expected a duration such as 500ms, 30s, 15m or 2h, got "${value}"`,
  };
}

/** `ms` in the largest unit that writes it whole: 3600000 → 1h, 1500 → 1500ms. */
export function durationText(ms: number): string {
  for (const unit of ['h', 'm', 's'] as const) {
    if (ms >= UNITS[unit]! && ms % UNITS[unit]! === 0) return `${ms / UNITS[unit]!}${unit}`;
  }
  return `${ms}ms`;
}
