import type { Storage } from '../storage/storage.js';
import { isConnectionError } from '../db/connections.js';
import type { Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import type { Queryable } from '../sql.js';
import { abortableSleep } from '../util/abortable-sleep.js';
import { anchorShape } from '../util/shape-anchor.js';
import { type CompletableRef, completeBatch } from '../storage/complete.js';
import type { ResultJson } from '../storage/results.js';
import { recordFailures, type FailureInput } from '../storage/fail.js';
import { entryKey, type AttemptRef } from '../storage/attempt.js';
import { settledWith } from '../storage/settled.js';
import { releaseCompleted } from '../storage/deps.js';
import { inTransactionOn } from '../db/connections.js';

/**
 * What became of one settlement handed to the batcher:
 * - `settled`: written; for a failure, whether the task will be retried or went to the dead letters;
 * - `refused`: the fence refused it, because the token no longer owns the lease (the only case counted `lost`);
 * - `unwritten`: the statement could not be written (the database was unreachable until the
 *   lease's own expiry, or kept failing). The lease lapses and rescue runs the task again.
 */
export type CompleteResult = { kind: 'settled' } | { kind: 'refused' } | { kind: 'unwritten'; error: string };
/** A completion's answers without a detail: one frozen object each, not one per task. */
const SETTLED: CompleteResult = Object.freeze({ kind: 'settled' });
const REFUSED: CompleteResult = Object.freeze({ kind: 'refused' });
export type FailResult =
  | { kind: 'settled'; dead: boolean }
  | { kind: 'refused' }
  | { kind: 'unwritten'; error: string };

type Waiter<T> = { resolve: (v: T) => void };
/** A lease to settle; `expiresAt` (epoch ms, the database's stamp) bounds how long a write is retried. */
type Settleable = AttemptRef & { leaseExpiresAt: number };
/**
 * A lease to complete; its dedupe key (if any) is released with it, its identity goes to attempt
 * history; `hasDependents` (the claim's mark) makes its completion release the tasks waiting on it.
 */
type CompletableLease = Settleable & CompletableRef & { id?: string; hasDependents?: boolean };

/**
 * A completion handed in (`completion()`): its `answer` is set once its flush is over, when
 * `flushed` (shared by every completion of that flush) resolves.
 */
export interface Completion {
  readonly flushed: Promise<void>;
  /** Set before `flushed` resolves. */
  answer: CompleteResult | undefined;
}

/** A write withRetry made, or gave up on. */
type Retried<T> = { ok: true; value: T } | { ok: false; error: string };

/**
 * A completion handed in by a caller that is told when its flush is over (`enlist`: the engine,
 * per task), rather than one that awaits it: the caller's own object is the batch's entry, so a
 * task costs no promise, no await and no entry object of its own.
 */
export interface CompletionOwner {
  readonly ref: CompletableLease;
  /** The handler's run time, for attempt history. */
  readonly runMs: number | null;
  /** The handler's result (JSON, checked), stored only if the completion wins the fence. */
  readonly result: ResultJson | null;
  /** Set by the batcher before `flushed()` is called. */
  answer: CompleteResult | undefined;
  /**
   * The flush is over and `answer` set: called once, for every owner of the flush, in one
   * microtask after it (where an `await` of the flush would have resumed). A throw is logged,
   * and the flush's other owners are still told.
   */
  flushed(): void;
}

/** A completion waiting for its flush. */
interface PendingComplete {
  ref: CompletableLease;
  runMs: number | null;
  result: ResultJson | null;
  answer: CompleteResult | undefined;
}

/** The completions one flush takes: one promise for all of them, not one per task. */
class Round {
  readonly flushed: Promise<void>;
  resolve: () => void = () => {};
  /** The round's enlisted completions, told once it is over; null while none. */
  owners: CompletionOwner[] | null = null;

  constructor() {
    this.flushed = new Promise((resolve) => {
      this.resolve = resolve;
    });
  }
}
/** A round's shape outlives every batcher (util/shape-anchor.ts). */
anchorShape('Round', new Round());

/**
 * The most result JSON (UTF-16 code units, about bytes) one completion statement carries. Results
 * are capped per task (`resultMaxBytes`, at most 16 MiB), but a flush holds one completion per
 * slot: without a bound on the flush, many slots returning large results would make one
 * statement of gigabytes, past what PostgreSQL (1 GB a value) or Node (a string's length) takes,
 * and every task in it would fail.
 */
const FLUSH_RESULT_CHARS = 32 * 1024 * 1024;

/**
 * The most completions one completion statement carries. A statement's time grows with its
 * entries (about 4 µs of server time each, docs/benchmarks-journal.md), and a flush takes every
 * completion handed in while the one before it ran: at 5,000 a statement stays within tens of
 * milliseconds, far from `statementTimeoutMs`, whatever the backlog. Without the bound, a worker
 * draining two million queued no-op tasks against a busy server built one flush of over a
 * million completions, which the statement timeout cancelled on every retry while the leases
 * behind it lapsed (`npm run bench:growth`, "Issue 35's fourteenth round"). Normal drains flush
 * a few hundred at a time and never reach it.
 */
export const FLUSH_MAX_COMPLETIONS = 5_000;

/**
 * A completion batch in parts of at most `maxCount` completions whose results together stay
 * within FLUSH_RESULT_CHARS (the batch itself when it is within both, always when it is small and
 * carries no results), in batch order. A part may pass the result bound only when one result alone
 * does. One range lease's entries may land in two parts: each statement settles the entries it
 * names with a settlement row of its own, as a cancel of one entry beside its lease-mates'
 * completion does (the exclusion constraint fences each entry).
 */
export function flushParts<T extends { result: string | null }>(
  batch: T[],
  limit = FLUSH_RESULT_CHARS,
  maxCount = FLUSH_MAX_COMPLETIONS,
): T[][] {
  let total = 0;
  for (const b of batch) total += b.result?.length ?? 0;
  if (total <= limit && batch.length <= maxCount) return [batch];
  const parts: T[][] = [];
  let part: T[] = [];
  let chars = 0;
  for (const b of batch) {
    const n = b.result?.length ?? 0;
    if (part.length > 0 && (chars + n > limit || part.length >= maxCount)) {
      parts.push(part);
      part = [];
      chars = 0;
    }
    part.push(b);
    chars += n;
  }
  if (part.length > 0) parts.push(part);
  return parts;
}

/** Why a part of a flush was not written: the stop's give-up time came first (stoppedRetrying). */
const STOP_GAVE_UP = 'the worker stopped before it could be written';

/** Retries of a statement that failed for a reason other than the connection (a bug, a bad row). */
const OTHER_ERROR_ATTEMPTS = 4;
/** Backoff between retries: doubling from this, capped so a recovered database is seen within about a second. */
const RETRY_BASE_MS = 100;
const RETRY_MAX_MS = 1000;

/** A failure handed in (`fail`), waiting for its flush. */
type PendingFailure = { input: FailureInput & { ref: Settleable }; w: Waiter<FailResult> };

/**
 * Coalesces settlements: while one flush is in flight, every completion and failure handed in
 * waits for the next, which writes them all in one fenced statement per kind. There is no timer:
 * at low load each settlement flushes alone and at once; under load batches form by themselves.
 *
 * A flush that fails because the database is unreachable is retried until the last lease in it
 * expires: before then the write is still this worker's to make (after it, rescue may already
 * have handed the task on, and the fence would refuse it anyway). So a clean restart of the
 * server (or a connection cut) costs no re-run when it is shorter than the lease, and an outage is
 * never reported as a lost lease: `lost` means only that the token was refused.
 *
 * A crash of the server is different. The claim commits asynchronously (src/processor/claim.ts,
 * ASYNC_COMMIT), so a crash within the WAL writer's delay of a claim (at most three times
 * `wal_writer_delay`, 600 ms by default) can take its lease row back while the handler runs: the
 * entry is claimable again, another worker may run the task at the same time (a second
 * concurrent run, which at-least-once allows), and this flush is refused once the server is back.
 * The refused path (settle-task.ts) then finds no lease at all and counts the run's attempt
 * (countLostClaim: the task goes back to deferred with it, or to the dead letters at its limit;
 * attempt history records it `lost`), unless another claim took the entry first, which then runs
 * under the same attempt number.
 *
 * Safety: a task is only ever settled by its own fenced row. A crash of the worker after a
 * handler returned but before its flush leaves the lease unsettled, so it lapses and the task is
 * re-run: a duplicate run, never a loss.
 */
export class SettlementBatcher {
  private completes: PendingComplete[] = [];
  /** The round `completes` will be flushed in (null while `completes` is empty). */
  private round: Round | null = null;
  private failures: PendingFailure[] = [];
  private flushing: Promise<void> | null = null;
  /** Set by `drain(giveUpAfterMs)`: retries stop at this time (epoch ms) whatever the leases say. */
  private giveUpAt = Infinity;
  private readonly stopRetrying = new AbortController();

  private readonly storage: Storage;

  constructor(
    private readonly db: Queryable,
    storage: Storage,
    private readonly metrics: BerthMetrics,
    private readonly logger: Logger,
  ) {
    this.storage = storage;
  }

  /**
   * `runMs`: the handler's run time, for attempt history; `result`: the handler's result (JSON,
   * checked), stored by the completion only if it wins the fence.
   */
  complete(
    ref: CompletableLease,
    runMs: number | null = null,
    result: ResultJson | null = null,
  ): Promise<CompleteResult> {
    const c = this.completion(ref, runMs, result);
    return c.flushed.then(() => c.answer as CompleteResult);
  }

  /**
   * `complete` for a caller that awaits `flushed` itself and then reads `answer` (the engine, per
   * task): no promise, resolving functions and executor of its own per task.
   */
  completion(ref: CompletableLease, runMs: number | null = null, result: ResultJson | null = null): Completion {
    this.round ??= new Round();
    const c: PendingComplete & Completion = { ref, runMs, result, flushed: this.round.flushed, answer: undefined };
    this.completes.push(c);
    this.kick();
    return c;
  }

  /**
   * A completion whose owner is told (`owner.flushed()`) once its flush is over, its `answer`
   * set: always, whatever became of the flush (settled, refused or unwritten).
   */
  enlist(owner: CompletionOwner): void {
    this.round ??= new Round();
    if (this.round.owners === null) this.round.owners = [owner];
    else this.round.owners.push(owner);
    this.completes.push(owner);
    this.kick();
  }

  fail(input: FailureInput & { ref: Settleable }): Promise<FailResult> {
    return new Promise((resolve) => {
      this.failures.push({ input, w: { resolve } });
      this.kick();
    });
  }

  get pending(): number {
    return this.completes.length + this.failures.length;
  }

  /**
   * Wait until everything handed in so far has been written (or given up on). With
   * `giveUpAfterMs`, retries against an unreachable database stop after that long (a stopping
   * worker does not wait out whole leases).
   */
  async drain(giveUpAfterMs?: number): Promise<void> {
    let giveUp: NodeJS.Timeout | undefined;
    if (giveUpAfterMs !== undefined) {
      this.giveUpAt = Date.now() + giveUpAfterMs;
      giveUp = setTimeout(() => this.stopRetrying.abort(), giveUpAfterMs);
      giveUp.unref();
    }
    try {
      while (this.flushing || this.pending > 0) {
        this.kick();
        await this.flushing;
      }
    } finally {
      // Cleared once drained: an armed timer holds this batcher, and through it the stopped
      // worker's engine and metrics, for the whole `giveUpAfterMs` (a process that starts and
      // stops workers, as tests and benchmarks do, kept every one of the last 10 s).
      clearTimeout(giveUp);
    }
  }

  private kick(): void {
    if (this.flushing !== null) return;
    if (this.pending === 0) return;
    // flush() answers every caller itself, even on a fault (flushCompletes, flushFailures): a
    // rejection left here has no one to tell, and must not become an unhandled rejection.
    this.flushing = this.flush()
      .catch(() => undefined)
      .finally(() => {
        this.flushing = null;
        this.kick();
      });
  }

  private async flush(): Promise<void> {
    const completes = this.completes;
    const round = this.round;
    this.round = null;
    const failures = this.failures;
    this.completes = [];
    this.failures = [];
    await Promise.all([this.flushCompletes(completes, round), this.flushFailures(failures)]);
  }

  private async flushCompletes(batch: PendingComplete[], round: Round | null): Promise<void> {
    if (batch.length === 0) return;
    try {
      const parts = flushParts(batch);
      for (let i = 0; i < parts.length; i++) {
        const part = parts[i]!;
        if (i > 0 && this.stoppedRetrying('complete', part.length)) {
          for (const b of part) b.answer = { kind: 'unwritten', error: STOP_GAVE_UP };
        } else await this.flushCompletePart(part);
      }
    } catch (err) {
      // Only a fault outside withRetry's reach gets here (a logger whose call throws): every
      // caller is still answered, none waits forever; an unwritten completion's lease lapses and
      // rescue runs the task again.
      const error = `settlement flush failed: ${(err as Error)?.message ?? String(err)}`;
      for (const b of batch) b.answer ??= { kind: 'unwritten', error };
    } finally {
      // Every answer is set: the batch's callers read them now (a batch in parts, over 32 MiB of
      // results, answers once its last part is written).
      round?.resolve();
      const owners = round?.owners;
      if (owners) void round.flushed.then(() => this.tell(owners));
    }
  }

  /** Tell a round's enlisted completions that their answers are set; one throwing stops none of the rest. */
  private tell(owners: readonly CompletionOwner[]): void {
    for (const o of owners) {
      try {
        o.flushed();
      } catch (err) {
        try {
          this.logger.error({ err: (err as Error)?.message ?? String(err) }, 'a completion owner threw when told');
        } catch {
          // A logger that throws too: the round's other owners are told all the same.
        }
      }
    }
  }

  private async flushCompletePart(batch: PendingComplete[]): Promise<void> {
    // Made here at their length and filled by index, not by map() (why: groupValues in
    // storage/complete.ts).
    const refs = new Array<CompletableLease>(batch.length);
    const runMs = new Array<number | null>(batch.length);
    let withResult = false;
    for (let i = 0; i < batch.length; i++) {
      const b = batch[i]!;
      refs[i] = b.ref;
      runMs[i] = b.runMs;
      if (b.result !== null) withResult = true;
    }
    // Only a batch that carries a result sends the completion that stores them.
    const results = withResult ? batch.map((b) => b.result) : undefined;
    // A task with dependents waiting on it: the completion and their release are one transaction,
    // so a dependent is freed exactly when its parent's completion commits (never before, and
    // never lost to a crash between the two). A flush without one sends what it always did.
    const parents = refs.filter((x) => x.hasDependents === true && x.id !== undefined);
    const r = await this.withRetry('complete', refs, async (retry) => {
      // By position (won[i] for refs[i]): no key string per task to build and look up.
      const won =
        parents.length === 0
          ? await completeBatch(this.db, this.storage, refs, runMs, results)
          : await inTransactionOn(this.db, async (tx) => {
              const won = await completeBatch(tx, this.storage, refs, runMs, results);
              const freed = await releaseCompleted(tx, this.storage, wonParents(refs, won));
              if (freed > 0) this.metrics.dependencyReleases.inc({ path: 'completion' }, freed);
              return won;
            });
      if (retry) {
        // An earlier attempt may have committed unseen: its entries are settled by now.
        const unseen = refs.filter((_, i) => !won[i]);
        const settled = await settledWith(this.db, this.storage, unseen, 'completed');
        for (let i = 0; i < refs.length; i++) if (!won[i] && settled.has(entryKey(refs[i]!))) won[i] = true;
      }
      return won;
    });
    for (let i = 0; i < batch.length; i++) {
      const b = batch[i]!;
      if (!r.ok) b.answer = { kind: 'unwritten', error: r.error };
      else b.answer = r.value[i] ? SETTLED : REFUSED;
    }
  }

  /** The failures in statements of at most FLUSH_MAX_COMPLETIONS each (see there), one after another. */
  private async flushFailures(batch: PendingFailure[]): Promise<void> {
    for (let i = 0; i < batch.length; i += FLUSH_MAX_COMPLETIONS) {
      const part = batch.length <= FLUSH_MAX_COMPLETIONS ? batch : batch.slice(i, i + FLUSH_MAX_COMPLETIONS);
      if (i > 0 && this.stoppedRetrying('fail', part.length)) {
        for (const b of part) b.w.resolve({ kind: 'unwritten', error: STOP_GAVE_UP });
      } else await this.flushFailurePart(part);
    }
  }

  /**
   * Whether a stop's give-up time has passed (`drain(giveUpAfterMs)`): a flush in parts then writes
   * no part after the one in flight, which would each wait out the statement timeout against a
   * database that is not answering (a stopping worker does not wait out whole leases). Their
   * leases lapse and rescue runs those tasks again.
   */
  private stoppedRetrying(kind: string, tasks: number): boolean {
    if (!this.stopRetrying.signal.aborted) return false;
    this.logger.error({ kind, tasks }, `settlement not written: ${STOP_GAVE_UP}; rescue will run the tasks again`);
    return true;
  }

  private async flushFailurePart(batch: PendingFailure[]): Promise<void> {
    if (batch.length === 0) return;
    const inputs = batch.map((b) => b.input);
    let r: Retried<Map<string, 'dead' | 'retry'>>;
    try {
      r = await this.withRetry(
        'fail',
        inputs.map((i) => i.ref),
        async (retry) => {
          const recorded = await recordFailures(this.db, this.storage, inputs);
          if (retry) {
            const missing = inputs.map((i) => i.ref).filter((x) => !recorded.has(entryKey(x)));
            for (const [k, v] of await settledWith(this.db, this.storage, missing, 'failed'))
              recorded.set(k, v.dead ? 'dead' : 'retry');
          }
          return recorded;
        },
      );
    } catch (err) {
      // As for completions: a fault outside withRetry's reach still answers every caller.
      r = { ok: false, error: `settlement flush failed: ${(err as Error)?.message ?? String(err)}` };
    }
    for (const b of batch) {
      if (!r.ok) {
        b.w.resolve({ kind: 'unwritten', error: r.error });
        continue;
      }
      const got = r.value.get(entryKey(b.input.ref));
      b.w.resolve(got === undefined ? { kind: 'refused' } : { kind: 'settled', dead: got === 'dead' });
    }
  }

  /**
   * Connection faults are retried until the batch's last lease expires (or `drain` gives up);
   * any other error a few times. Backoff doubles to a cap of a second, so a database that comes
   * back is written to within about a second.
   */
  private async withRetry<T>(
    kind: string,
    refs: readonly Settleable[],
    /** `retry` is true after a failed attempt: an earlier attempt may have committed unseen. */
    fn: (retry: boolean) => Promise<T>,
  ): Promise<Retried<T>> {
    // Read on the first failure only: the batch's last lease expiry.
    let until = Number.NaN;
    for (let attempt = 1; ; attempt++) {
      const started = performance.now();
      try {
        const value = await fn(attempt > 1);
        this.metrics.settlementFlushSeconds.observe({ kind }, (performance.now() - started) / 1000);
        if (attempt > 1)
          this.logger.info(
            { kind, attempts: attempt, tasks: refs.length },
            'settlement written after the database came back',
          );
        return { ok: true, value };
      } catch (err) {
        const message = (err as Error).message;
        const connection = isConnectionError(err);
        if (Number.isNaN(until)) until = Math.min(latestExpiry(refs), this.giveUpAt);
        const delay = Math.min(RETRY_BASE_MS * 2 ** (attempt - 1), RETRY_MAX_MS);
        const giveUp = connection
          ? Date.now() + delay >= Math.min(until, this.giveUpAt)
          : attempt >= OTHER_ERROR_ATTEMPTS;
        if (giveUp || this.stopRetrying.signal.aborted) {
          this.logger.error(
            { err: message, kind, tasks: refs.length, attempts: attempt, database_unreachable: connection },
            connection
              ? 'settlement could not be written: the database stayed unreachable until the leases expired; rescue will run the tasks again'
              : 'settlement could not be written; the leases will lapse and rescue will run the tasks again',
          );
          return { ok: false, error: message };
        }
        if (attempt === 1 || !connection) {
          this.logger.warn(
            { err: message, kind, attempt, database_unreachable: connection },
            'settlement flush failed; retrying',
          );
        }
        await abortableSleep(delay, this.stopRetrying.signal);
      }
    }
  }
}

/** The ids of the batch's tasks with dependents whose completion won. */
function wonParents(refs: readonly CompletableLease[], won: readonly boolean[]): string[] {
  const ids: string[] = [];
  for (let i = 0; i < refs.length; i++) {
    const x = refs[i]!;
    if (won[i] && x.hasDependents === true && x.id !== undefined) ids.push(x.id);
  }
  return ids;
}

function latestExpiry(refs: readonly Settleable[]): number {
  let latest = Number.NEGATIVE_INFINITY;
  for (const r of refs) if (r.leaseExpiresAt > latest) latest = r.leaseExpiresAt;
  return latest;
}
