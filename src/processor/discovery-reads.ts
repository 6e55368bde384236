import type { Logger } from '../logger.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import type { Queryable } from '../sql.js';
import { primaryWalPosition, replayedUpTo } from '../storage/replica.js';
import type { Storage } from '../storage/storage.js';

export interface DiscoveryReadsDeps {
  /**
   * The read replica's pool (`readConnectionString`) and `host:port, database "name"` for the log
   * lines; null: discovery reads the primary.
   */
  replica: { pool: Queryable; where: string } | null;
  /** The primary: the fetcher's own session. */
  primary: Queryable;
  storage: Storage;
  metrics: BerthMetrics;
  logger: Logger;
  /** The worker's poll interval: the lag a replica is allowed, and the pace of retries. */
  pollIntervalMs: number;
}

/** A primary WAL position and when it was read (Date.now() before the read). */
interface Mark {
  lsn: string;
  at: number;
}

/** At least this long between two retries of a replica that failed (each is one connect attempt). */
const MIN_RETRY_MS = 1_000;
/** At most one "replica is behind" line per worker in this long: lag comes and goes with load. */
const LAG_LOG_EVERY_MS = 60_000;

/**
 * Where discovery reads: the read replica when one is configured and usable, else the primary.
 * Discovery is a hint (the claim on the primary re-checks everything, seed 000), so either
 * answer is safe; what a replica can cost is pickup time, and this bounds it.
 *
 * - A replica that fails (a connect error or timeout, a terminated session, any error of the
 *   read) is left for the primary at once: that discovery runs again on the primary, one warn
 *   line says so, and `berth_discovery_on_primary` reads 1. (Before this fallback an unreachable
 *   replica failed every fetch, and with it every claim of the worker: the limit flags were read
 *   there first.) It is retried (one probe statement, in the background: a fetch never waits for a dead
 *   replica again) at most once per poll interval, and at least a second apart; the probe that
 *   answers switches discovery back, with one info line.
 * - A replica that lags does not see the tasks committed since it last replayed, and no poll
 *   would find them until it caught up (a wake names its lane, but a missed one is the poll's to
 *   find). So each discovery first asks the replica whether it has replayed the primary's WAL
 *   position read at least half a poll interval earlier; if not, that one discovery reads the
 *   primary. A task committed before one poll's discovery is thus seen by the next one, on the
 *   replica or on the primary: replica lag delays its pickup to the next poll at most. The cost
 *   is one small statement on the primary (the position) about once a poll, and one on the
 *   replica per discovery.
 *
 * Errors of the primary are the caller's (the fetch loop backs off as without a replica).
 */
export class DiscoveryReads {
  private unavailableSince: number | null = null;
  private nextRetryAt = 0;
  private retrying = false;
  private lagLoggedAt = Number.NEGATIVE_INFINITY;
  /** Primary positions, oldest first: the oldest is the newest one old enough to require. */
  private readonly marks: Mark[] = [];
  private readonly graceMs: number;
  private readonly retryMs: number;

  constructor(private readonly deps: DiscoveryReadsDeps) {
    this.graceMs = deps.pollIntervalMs / 2;
    this.retryMs = Math.max(deps.pollIntervalMs, MIN_RETRY_MS);
    // The series exists from the start where it can become 1.
    if (deps.replica !== null) deps.metrics.discoveryOnPrimary.set(0);
  }

  /** Run `read` (a discovery) where discovery reads now; see the class comment. */
  async run<T>(read: (db: Queryable) => Promise<T>): Promise<T> {
    const { primary } = this.deps;
    if (this.deps.replica === null) return read(primary);
    const replica = this.deps.replica.pool;
    if (this.unavailableSince !== null) {
      this.retry(replica);
      return this.onPrimaryFor('unavailable', read);
    }
    // The primary's errors are the caller's; only the replica's are caught.
    const required = await this.requiredPosition();
    try {
      if (required === null || (await replayedUpTo(replica, this.deps.storage, required))) return await read(replica);
    } catch (err) {
      this.fellBack(err);
      return this.onPrimaryFor('unavailable', read);
    }
    this.noteLag(required!);
    return this.onPrimaryFor('lagging', read);
  }

  private onPrimaryFor<T>(reason: 'unavailable' | 'lagging', read: (db: Queryable) => Promise<T>): Promise<T> {
    this.deps.metrics.discoveryFallbacks.inc({ reason });
    return read(this.deps.primary);
  }

  /**
   * Read the primary's position when the newest mark is half a poll old, and answer the newest
   * mark at least half a poll old (null: none yet, the first discovery after start).
   */
  private async requiredPosition(): Promise<string | null> {
    const now = Date.now();
    const newest = this.marks.at(-1);
    if (newest === undefined || now - newest.at >= this.graceMs) {
      this.marks.push({ lsn: await primaryWalPosition(this.deps.primary, this.deps.storage), at: now });
    }
    const cutoff = now - this.graceMs;
    while (this.marks.length > 1 && this.marks[1]!.at <= cutoff) this.marks.shift();
    const oldest = this.marks[0]!;
    return oldest.at <= cutoff ? oldest.lsn : null;
  }

  private fellBack(err: unknown): void {
    const now = Date.now();
    this.unavailableSince = now;
    this.nextRetryAt = now + this.retryMs;
    this.deps.metrics.discoveryOnPrimary.set(1);
    this.deps.logger.warn(
      { err: (err as Error).message, replica: this.deps.replica?.where, retryInMs: this.retryMs },
      'read replica failed; discovery reads the primary until it answers again',
    );
  }

  /** One probe of the replica in the background, when due; the one that answers ends the fallback. */
  private retry(replica: Queryable): void {
    const now = Date.now();
    if (this.retrying || now < this.nextRetryAt) return;
    this.retrying = true;
    replayedUpTo(replica, this.deps.storage, null).then(
      () => {
        this.retrying = false;
        const since = this.unavailableSince;
        if (since === null) return;
        this.unavailableSince = null;
        this.deps.metrics.discoveryOnPrimary.set(0);
        this.deps.logger.info(
          { replica: this.deps.replica?.where, onPrimaryMs: Date.now() - since },
          'read replica answers again; discovery reads it',
        );
      },
      () => {
        this.retrying = false;
        this.nextRetryAt = Date.now() + this.retryMs;
      },
    );
  }

  private noteLag(required: string): void {
    const now = Date.now();
    if (now - this.lagLoggedAt < LAG_LOG_EVERY_MS) return;
    this.lagLoggedAt = now;
    this.deps.logger.info(
      { replica: this.deps.replica?.where, requiredLsn: required, allowedLagMs: this.graceMs },
      'read replica is behind the primary; discovery reads the primary until it catches up (logged at most once a minute)',
    );
  }
}
