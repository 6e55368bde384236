import { z } from 'zod';
import type { Lane } from '../lane.js';

/**
 * The `maintenance` report a worker writes into its `workers` row, read back defensively: the
 * runtime role can write any JSON there, and a display (dashboard, `berth leader`) must not
 * break on it. Each part is checked on its own; a part that does not match is left out and
 * named in `invalid`, so the rest of the report still shows.
 */

const count = z.number().finite().nonnegative();
const text = z.string().max(1000);

const branch = z.object({
  runs: count,
  failures: count,
  overruns: count,
  lastMs: count,
  maxMs: count,
  lastRunAt: text.nullable(),
});

const lane = z.object({
  queue: text,
  priority: z.number().int(),
  shard: z.number().int(),
}) satisfies z.ZodType<Lane>;

const contention = lane.extend({
  handed_off: count,
  waiter_limit: count,
  waiter_timed_out: count,
  failed: count,
  lastOutcome: text,
  lastAt: text,
});

/** The leader reports at most CONTENTION_LANES (1000) lanes; more is not a real report. */
const MAX_LANES = 10_000;

const PARTS = {
  branches: z.record(text, branch),
  waitingLanes: z.array(lane).max(MAX_LANES),
  contention: z.array(contention).max(MAX_LANES),
} as const;

export type BranchRecord = z.infer<typeof branch>;
export type LaneContentionRecord = z.infer<typeof contention>;

export interface MaintenanceReport {
  branches?: Record<string, BranchRecord>;
  waitingLanes?: Lane[];
  contention?: LaneContentionRecord[];
}

/** The valid parts of a stored report, and what was left out (null when nothing was). */
export function readMaintenanceReport(raw: unknown): { report: MaintenanceReport; invalid: string | null } {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    return { report: {}, invalid: 'its maintenance report is not a JSON object' };
  }
  const report: Record<string, unknown> = {};
  const bad: string[] = [];
  for (const [key, schema] of Object.entries(PARTS)) {
    const value = (raw as Record<string, unknown>)[key];
    if (value === undefined) continue;
    const parsed = schema.safeParse(value);
    if (parsed.success) report[key] = parsed.data;
    else bad.push(key);
  }
  return {
    report: report as MaintenanceReport,
    invalid: bad.length ? `its maintenance report has a malformed ${bad.join(', ')} (left out)` : null,
  };
}
