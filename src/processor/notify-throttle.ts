/**
 * How long a fetch woken by a wake notification waits before it runs, so that a flood of
 * notifications costs a bounded number of claims. The wake channel takes a NOTIFY from anyone
 * who can connect (NOTIFY needs no privilege), and every notification that names a lane made
 * this worker claim from it, and discover when that came back empty: a 10 s flood cost an idle
 * worker 6,900 transactions.
 *
 * Work a notification announces is there when it arrives (the NOTIFY is delivered at the
 * enqueue's commit), so a woken fetch that finds nothing was woken for nothing: a forged notice,
 * or a task another worker claimed first. Such fetches draw on a budget (a token bucket of
 * EMPTY_PER_SECOND tokens, refilled at EMPTY_PER_SECOND a second); once it is spent, the next
 * woken fetch waits for a token (at most 1 / EMPTY_PER_SECOND s), and the notifications that
 * arrive meanwhile are taken by that one fetch. A woken fetch that finds work costs nothing and
 * gives back WIN_CREDIT tokens: in a fleet sharing a trickle of tasks each worker wins some of
 * the races it runs (with three workers, one in three), and its wins pay for its losses, so it
 * is not held back; a worker picking up a steady stream alone never is. A flood of forged
 * notices finds nothing and earns nothing: it costs a worker at most EMPTY_PER_SECOND woken
 * fetches a second (each a claim, a discovery and a claim of what it found), plus WIN_CREDIT for
 * each real task it picks up meanwhile.
 *
 * An earlier version waited 5 ms after an empty woken fetch, doubling to 200 ms: a review found
 * that, in a fleet sharing slow tasks, every idle worker had lost a race lately and waited, while
 * the busy winner claimed the next task into its prefetch buffer (pickup p50 9 → 65 ms, three
 * one-slot workers, 100 ms handlers, a task every 50 ms).
 */
export const EMPTY_PER_SECOND = 20;
/** Tokens a woken fetch that found work gives back. */
export const WIN_CREDIT = 2;

export class NotifyThrottle {
  private tokens = EMPTY_PER_SECOND;
  private at = 0;

  constructor(private readonly perSecond = EMPTY_PER_SECOND) {
    this.tokens = perSecond;
  }

  private refill(now: number): void {
    if (this.at !== 0) this.tokens = Math.min(this.perSecond, this.tokens + ((now - this.at) * this.perSecond) / 1000);
    this.at = now;
  }

  /** How long a fetch woken by a notification waits now (ms). */
  waitMs(now: number): number {
    this.refill(now);
    return this.tokens >= 1 ? 0 : Math.ceil(((1 - this.tokens) * 1000) / this.perSecond);
  }

  /** A fetch ran: `woken` when a notification woke it, `found` when it claimed anything. */
  fetched(woken: boolean, found: boolean, now: number): void {
    if (!woken) return;
    this.refill(now);
    this.tokens = found
      ? Math.min(this.perSecond, this.tokens + WIN_CREDIT)
      : Math.max(this.tokens - 1, -this.perSecond);
  }
}
