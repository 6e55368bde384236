import type { Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics.js';
import type { Queryable } from '../sql.js';
import type { LeaseRef } from './claim.js';
import { completeLeases, leaseKey, recordFailures, type FailureInput } from './settlement.js';

type Waiter<T> = { resolve: (v: T) => void };
/** A lease to complete; its dedupe key (if any) is released with it. */
type CompletableLease = LeaseRef & { dedupeKey?: string | null };

/**
 * Coalesces settlements: while one flush is in flight, every completion and failure handed in
 * waits for the next, which writes them all in one fenced statement per kind. There is no timer:
 * at low load each settlement flushes alone and at once; under load batches form by themselves.
 *
 * Safety: a task is only ever settled by its own fenced row. A crash after a handler returned
 * but before its flush leaves the lease unsettled, so it lapses and the task is re-run: a
 * duplicate run, never a loss.
 */
export class SettlementBatcher {
  private completes: { ref: CompletableLease; w: Waiter<boolean> }[] = [];
  private failures: { input: FailureInput; w: Waiter<'retry' | 'dead' | null> }[] = [];
  private flushing: Promise<void> | null = null;

  constructor(
    private readonly db: Queryable,
    private readonly schema: string,
    private readonly metrics: BerthMetrics,
    private readonly logger: Logger,
  ) {}

  /** Resolves true when settled, false when the fence refused (the lease was lost). */
  complete(ref: CompletableLease): Promise<boolean> {
    return new Promise((resolve) => {
      this.completes.push({ ref, w: { resolve } });
      this.kick();
    });
  }

  /** Resolves 'retry' | 'dead' when recorded, null when refused. */
  fail(input: FailureInput): Promise<'retry' | 'dead' | null> {
    return new Promise((resolve) => {
      this.failures.push({ input, w: { resolve } });
      this.kick();
    });
  }

  get pending(): number {
    return this.completes.length + this.failures.length;
  }

  /** Wait until everything handed in so far has been written (or given up on). */
  async drain(): Promise<void> {
    while (this.flushing || this.pending > 0) {
      this.kick();
      await this.flushing;
    }
  }

  private kick(): void {
    if (this.flushing) return;
    if (this.pending === 0) return;
    this.flushing = this.flush().finally(() => {
      this.flushing = null;
      this.kick();
    });
  }

  private async flush(): Promise<void> {
    const completes = this.completes;
    const failures = this.failures;
    this.completes = [];
    this.failures = [];
    await Promise.all([this.flushCompletes(completes), this.flushFailures(failures)]);
  }

  private async flushCompletes(batch: { ref: CompletableLease; w: Waiter<boolean> }[]): Promise<void> {
    if (batch.length === 0) return;
    const settled = await this.withRetry('complete', () => completeLeases(this.db, this.schema, batch.map((b) => b.ref)));
    for (const b of batch) b.w.resolve(settled?.has(leaseKey(b.ref)) ?? false);
  }

  private async flushFailures(batch: { input: FailureInput; w: Waiter<'retry' | 'dead' | null> }[]): Promise<void> {
    if (batch.length === 0) return;
    const recorded = await this.withRetry('fail', () => recordFailures(this.db, this.schema, batch.map((b) => b.input)));
    for (const b of batch) b.w.resolve(recorded?.get(leaseKey(b.input.ref)) ?? null);
  }

  /**
   * A flush that errors (connection dropped) is retried a few times with backoff; past that the
   * leases are left to lapse and be rescued, so the tasks re-run rather than vanish.
   */
  private async withRetry<T>(kind: string, fn: () => Promise<T>): Promise<T | null> {
    for (let attempt = 1; ; attempt++) {
      const started = performance.now();
      try {
        const r = await fn();
        this.metrics.settlementFlushSeconds.observe({ kind }, (performance.now() - started) / 1000);
        return r;
      } catch (err) {
        if (attempt >= 4) {
          this.logger.error({ err: (err as Error).message, kind }, 'settlement flush failed; leases will lapse and the tasks re-run');
          return null;
        }
        this.logger.warn({ err: (err as Error).message, kind, attempt }, 'settlement flush failed; retrying');
        await new Promise((r) => setTimeout(r, 100 * 2 ** attempt));
      }
    }
  }
}
