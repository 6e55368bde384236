/**
 * How many tasks to lease ahead of free slots: about 25 ms of work at the recent completion
 * rate, at most `prefetch`. Fast tasks get big claims (few round trips); slow tasks are never
 * hoarded away from other workers.
 */
export class PrefetchRate {
  private completionRate = 0;
  private completedSinceSample = 0;
  private rateSampledAt = performance.now();

  constructor(private readonly prefetch: number) {}

  /** A slot came free. */
  completed(): void {
    this.completedSinceSample++;
  }

  /** `now` is given only by the engine's shape donor, to take a rate through a sample (Engine.ripenDonor). */
  target(now = performance.now()): number {
    if (this.prefetch === 0) return 0;
    const dt = now - this.rateSampledAt;
    if (dt >= 10) {
      const rate = (this.completedSinceSample * 1000) / dt;
      // Up at once, down slowly. The rate seen is bounded by what the last target let the worker
      // lease, so a smoothed rise took ~10 windows to let a drain of fast tasks claim in
      // batches of its size (the first ~100 ms of a drain in claims of a few dozen tasks); a
      // fall is smoothed so a pause between bursts does not shrink the next claim.
      this.completionRate = rate >= this.completionRate ? rate : this.completionRate * 0.7 + rate * 0.3;
      this.completedSinceSample = 0;
      this.rateSampledAt = now;
    }
    // Rounded down: when tasks are slow (fewer than one per 25 ms, or the rate is unknown)
    // nothing is leased ahead, so a task never waits in this process behind long handlers while
    // other workers sit idle. Rounded up, 10 completions a second leased one ahead: in a fleet
    // sharing 100 ms tasks the busy worker took each new task into its buffer (a review's
    // pickup p95 of 61-68 ms, against 15 ms without prefetch).
    return Math.min(this.prefetch, Math.floor(this.completionRate * 0.025));
  }
}
