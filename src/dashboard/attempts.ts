import type { TimelineEvent } from '../admin/tasks.js';

/**
 * One attempt as the task page shows it. The page draws whatever of this it is given: an
 * attempt history read (one row per claim, with the error and stack of a failed one) fills every
 * field; the ring's timeline, all there is without one, fills the claim and settlement only.
 */
export interface AttemptView {
  /** The history row's id; null when the attempt is read off the timeline. */
  id: string | null;
  attempt: number | null;
  claimedAt: Date | null;
  worker: string | null;
  /** How the attempt ended, as storage records it; null while it runs (or when not retained). */
  outcome: string | null;
  settledAt: Date | null;
  durationMs: number | null;
  error: { message: string; stack: string | null } | null;
}

/** Where a task page's attempts came from: the attempt history, or the ring's timeline. */
export type AttemptSource = 'history' | 'timeline';

function numberOr(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}

function textOr(value: unknown): string | null {
  return typeof value === 'string' ? value : null;
}

/** Milliseconds from `from` to `to` when both are finite times, else null. */
function between(from: Date | null, to: Date | null): number | null {
  if (!from || !to) return null;
  const ms = Number(to) - Number(from);
  return Number.isFinite(ms) && ms >= 0 ? ms : null;
}

/**
 * The attempts a timeline shows: each claim, paired with the settlement of the same attempt that
 * follows it. The ring keeps no error per attempt (only the task's last error), and forgets an
 * entry when its segment is reclaimed, so this is the retained part of the history, errors left
 * null.
 */
export function attemptsFromTimeline(timeline: readonly TimelineEvent[]): AttemptView[] {
  const attempts: AttemptView[] = [];
  for (const e of timeline) {
    if (e.event === 'claimed') {
      attempts.push({
        id: null,
        attempt: numberOr(e.detail.attempt),
        claimedAt: e.at,
        worker: textOr(e.detail.worker),
        outcome: null,
        settledAt: null,
        durationMs: null,
        error: null,
      });
    } else if (e.event === 'settled') {
      const attempt = numberOr(e.detail.attempt);
      let open: AttemptView | undefined;
      for (const a of attempts) if (a.settledAt === null && a.attempt === attempt) open = a;
      if (!open) continue;
      open.outcome = textOr(e.detail.outcome);
      open.settledAt = e.at;
      open.durationMs = between(open.claimedAt, e.at);
    }
  }
  return attempts;
}
