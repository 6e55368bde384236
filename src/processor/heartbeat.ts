import type { Storage } from '../storage/storage.js';
import { hostname } from 'node:os';
import type { Queryable, Schema } from '../sql.js';
import { positional } from '../statement.js';
import type { Logger } from '../logger.js';
import { DEFAULT_HEARTBEAT_MS } from '../storage/live-workers.js';

/** What a heartbeat reports about its process, read at each beat. */
export interface HeartbeatSource {
  workerId: string;
  queues: readonly string[] | null;
  /** The names of the schedules this worker declares (the leader marks the others stale). */
  schedules?: readonly string[];
  slots: number;
  startedAt: Date;
  busy(): number;
  prefetched(): number;
  leader(): boolean;
  /** Branch statistics and promoter waiters while this process leads; `{}` otherwise. */
  maintenance(): Record<string, unknown>;
}

interface CountKey {
  minute: number;
  queue: string;
  type: string;
  outcome: string;
}

/**
 * Handler outcomes counted per (minute, queue, type, outcome) in memory until the next beat.
 * Kept when a flush fails (added back), so a database blip delays the charts, not loses counts.
 */
export class OutcomeTally {
  private counts = new Map<string, { key: CountKey; n: number }>();
  /**
   * The entry the last record went to: the next one usually has the same key (a drain is one
   * type, one queue, one outcome), and comparing four values is cheaper than building the key.
   */
  private last: { key: CountKey; n: number } | null = null;

  record(queue: string, type: string, outcome: string, at = Date.now()): void {
    const minute = at - (at % 60_000);
    const last = this.last;
    if (
      last !== null &&
      last.key.minute === minute &&
      last.key.queue === queue &&
      last.key.type === type &&
      last.key.outcome === outcome
    ) {
      last.n++;
      return;
    }
    const k = `${minute}\u0000${queue}\u0000${type}\u0000${outcome}`;
    let cur = this.counts.get(k);
    if (cur) cur.n++;
    else {
      cur = { key: { minute, queue, type, outcome }, n: 1 };
      this.counts.set(k, cur);
    }
    this.last = cur;
  }

  take(): { key: CountKey; n: number }[] {
    const out = [...this.counts.values()];
    this.counts = new Map();
    this.last = null;
    return out;
  }

  restore(rows: { key: CountKey; n: number }[]): void {
    for (const r of rows) {
      const k = `${r.key.minute}\u0000${r.key.queue}\u0000${r.key.type}\u0000${r.key.outcome}`;
      const cur = this.counts.get(k);
      if (cur) cur.n += r.n;
      else this.counts.set(k, { key: r.key, n: r.n });
    }
  }
}

/**
 * Writes the worker's row in `workers` and flushes its outcome counts, in one statement per
 * beat. The row is what `berth leader`, `berth stats` and the dashboard's worker and
 * maintenance views read; the counts are what their throughput charts read. Each worker only
 * ever writes its own rows, so beats never contend. A failed beat is logged and retried at the
 * next one: nothing on the task path depends on it.
 */
export class Heartbeat {
  private timer: NodeJS.Timeout | null = null;
  private inFlight: Promise<void> | null = null;

  private readonly storage: Storage;

  constructor(
    private readonly db: Queryable,
    storage: Storage,
    private readonly source: HeartbeatSource,
    private readonly logger: Logger,
    private readonly intervalMs = DEFAULT_HEARTBEAT_MS,
    /** The outcome counts it flushes (the worker's engine records into it). */
    readonly tally = new OutcomeTally(),
  ) {
    this.storage = storage;
  }

  start(): void {
    if (this.timer) return;
    void this.beat();
    this.timer = setInterval(() => void this.beat(), this.intervalMs);
    this.timer.unref();
  }

  /** One beat now (also what the timer runs). Concurrent calls share the beat in flight. */
  beat(): Promise<void> {
    this.inFlight ??= this.write().finally(() => {
      this.inFlight = null;
    });
    return this.inFlight;
  }

  /** Final beat (flushes the last counts), then remove the row: a clean stop is not a death. */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.inFlight;
    await this.write();
    try {
      await this.db.query(
        this.storage
          .statement('remove-worker', ({ q: s }) =>
            positional(`DELETE FROM ${s}.workers WHERE worker_id = $1`, ['workerId']),
          )
          .query({ workerId: this.source.workerId }),
      );
    } catch (err) {
      this.logger.warn({ err: (err as Error).message }, 'could not remove the worker heartbeat row');
    }
  }

  private async write(): Promise<void> {
    const src = this.source;
    const rows = this.tally.take();
    try {
      await this.db.query(
        this.storage.statement('heartbeat', heartbeatStatement).query({
          workerId: src.workerId,
          host: hostname(),
          pid: process.pid,
          queues: src.queues,
          slots: src.slots,
          busy: src.busy(),
          prefetched: src.prefetched(),
          leader: src.leader(),
          maintenance: JSON.stringify(src.maintenance()),
          startedAt: src.startedAt,
          minutes: rows.map((r) => r.key.minute),
          countQueues: rows.map((r) => r.key.queue),
          types: rows.map((r) => r.key.type),
          outcomes: rows.map((r) => r.key.outcome),
          counts: rows.map((r) => r.n),
          schedules: src.schedules ?? [],
          heartbeatMs: Math.min(Math.round(this.intervalMs), 2_147_483_647),
        }),
      );
    } catch (err) {
      this.tally.restore(rows);
      this.logger.warn({ err: (err as Error).message }, 'worker heartbeat failed; retrying at the next beat');
    }
  }
}

function heartbeatStatement({ q: s }: Schema) {
  return positional(
    `WITH beat AS (
           INSERT INTO ${s}.workers AS w (worker_id, host, pid, queues, slots, busy, prefetched, leader,
                                          maintenance, started_at, last_seen_at, schedules, heartbeat_ms)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now(), $16, $17)
           ON CONFLICT (worker_id) DO UPDATE
             SET busy = excluded.busy, prefetched = excluded.prefetched, leader = excluded.leader,
                 maintenance = excluded.maintenance, last_seen_at = excluded.last_seen_at,
                 schedules = excluded.schedules, heartbeat_ms = excluded.heartbeat_ms
           RETURNING 1
         ), counted AS (
           INSERT INTO ${s}.outcome_counts AS c (minute, worker_id, queue, type, outcome, count)
           SELECT to_timestamp(m / 1000.0), $1, q, t, o, n
             FROM unnest($11::float8[], $12::text[], $13::text[], $14::text[], $15::bigint[]) AS x(m, q, t, o, n)
           ON CONFLICT (minute, worker_id, queue, type, outcome) DO UPDATE SET count = c.count + excluded.count
           RETURNING 1
         )
         SELECT (SELECT count(*) FROM beat) + (SELECT count(*) FROM counted) AS written`,
    [
      'workerId',
      'host',
      'pid',
      'queues',
      'slots',
      'busy',
      'prefetched',
      'leader',
      'maintenance',
      'startedAt',
      'minutes',
      'countQueues',
      'types',
      'outcomes',
      'counts',
      'schedules',
      'heartbeatMs',
    ],
  );
}
