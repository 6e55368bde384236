import type pg from 'pg';
import { newClient, type DatabaseTarget } from '../db/connections.js';
import type { Logger } from '../logger.js';
import { followerApplicationName, LEADER_LOCK, leaderApplicationName, schemaLockKey } from '../storage/locks.js';

/**
 * Reconnect delays after a lost or refused session: the leader poll, doubling per consecutive
 * failure up to 10 s (or the poll, if longer), each scaled by a random factor in [0.5, 1). An
 * outage thus costs a fleet of N workers at most N/5 connection attempts a second (N/10 to N/5
 * once backed off), spread out rather than in lockstep, and a leader is back within about 10 s
 * of the server.
 */
export const RECONNECT_MAX_MS = 10_000;

export function reconnectDelayMs(pollMs: number, failures: number): number {
  const capped = Math.min(pollMs * 2 ** Math.min(Math.max(failures - 1, 0), 20), Math.max(RECONNECT_MAX_MS, pollMs));
  return capped * (0.5 + Math.random() / 2);
}

/** How long a process whose leader session was lost waits before it reconnects: 2–3 polls. */
export function leaderHoldOffMs(pollMs: number): number {
  return pollMs * (2 + Math.random());
}

/**
 * Try the lock and, only if it was granted, rename the session to the leader's name, in one
 * statement: the session is never named like a leader without holding the lock, and the lock is
 * never held for a round trip under a follower's name. CASE fixes the order (an AND would not).
 * Neither change is undone by a rollback of this statement's transaction (the lock is
 * session-level and set_config is not local), and every error ends the session anyway.
 */
const TRY_LEAD = `SELECT CASE WHEN pg_try_advisory_lock($1, $2) THEN set_config('application_name', $3, false) END AS name`;

export interface ElectionOptions {
  database: DatabaseTarget;
  schema: string;
  workerId: string;
  pollMs: number;
  logger: Logger;
  /** Called once when a session that held the lock is lost (error or end event, failed query). */
  onLeaderSessionLost: () => void;
}

/**
 * The one election session of a Maintenance, kept open across polls. A follower tries the leader
 * lock on it every poll; the session that wins is the leader's session (advisory locks belong to
 * the session), and the leader's liveness check runs on it. Before issue 8 every poll of every
 * follower opened a connection of its own: 10 idle workers made 394–497 backends a minute, now 6,
 * none of them the election's (docs/benchmarks-journal.md). A broken session is closed and replaced after a bounded, jittered
 * backoff, never reconnected on every poll, so an outage does not become a reconnect storm.
 */
export class ElectionSession {
  private client: pg.Client | null = null;
  private leading = false;
  private failures = 0;
  private nextConnectAt = 0;
  private closed = false;

  constructor(private readonly opts: ElectionOptions) {}

  /**
   * One poll: connect if due, then a follower tries the lock and a leader checks its session.
   * Never throws; returns whether this session leads afterwards.
   */
  async poll(): Promise<boolean> {
    if (this.closed) return false;
    if (!this.client && !(await this.connect())) return false;
    const client = this.client!;
    try {
      if (this.leading) {
        await client.query('SELECT 1');
      } else {
        const r = await client.query<{ name: string | null }>(TRY_LEAD, [
          schemaLockKey(this.opts.schema),
          LEADER_LOCK,
          leaderApplicationName(this.opts.workerId),
        ]);
        if (r.rows[0]?.name != null && this.client === client) this.leading = true;
      }
      this.failures = 0;
    } catch (err) {
      this.lose(client, err as Error, 'query');
    }
    return this.leading && this.client === client;
  }

  /** End the session (and with it any leadership); no reconnect after this. */
  async close(): Promise<void> {
    this.closed = true;
    const client = this.client;
    this.client = null;
    this.leading = false;
    if (client) await client.end().catch(() => undefined);
  }

  private async connect(): Promise<boolean> {
    if (Date.now() < this.nextConnectAt) return false;
    const client = newClient(this.opts.database, {
      application_name: followerApplicationName(this.opts.workerId),
      // A half-open connection must not leave this process believing it leads: the liveness
      // check times out (and the leader steps down) instead of hanging. The connect times out
      // as the database target says (10 s unless configured).
      keepAlive: true,
      query_timeout: 10_000,
      statement_timeout: 10_000,
    });
    // Before connect: an 'error' on a pg.Client with no listener kills the process, and a
    // backend termination or a server restart can emit one at any time.
    client.on('error', (err) => this.lose(client, err, 'error event'));
    // A connection closed without an error message (a proxy, a FIN) ends the session just the same.
    client.on('end', () => this.lose(client, new Error('connection ended'), 'end event'));
    try {
      await client.connect();
    } catch (err) {
      client.end().catch(() => undefined);
      this.backOff();
      this.opts.logger.warn(
        { err: (err as Error).message, retryInMs: Math.round(this.nextConnectAt - Date.now()) },
        'maintenance election session could not connect',
      );
      return false;
    }
    if (this.closed) {
      await client.end().catch(() => undefined);
      return false;
    }
    this.client = client;
    return true;
  }

  private backOff(): void {
    this.failures++;
    this.nextConnectAt = Date.now() + reconnectDelayMs(this.opts.pollMs, this.failures);
  }

  /** Idempotent per client: the error event and the failed query of one fault act once. */
  private lose(client: pg.Client, err: Error, how: string): void {
    if (this.client !== client) return;
    const wasLeader = this.leading;
    this.client = null;
    this.leading = false;
    client.end().catch(() => undefined);
    if (this.closed) return;
    this.backOff();
    // A leader whose session broke is the likeliest process to be on the wrong side of the fault
    // (its network, its pauses), so it gives the followers the first tries at the lock: it stays
    // off for at least two polls, in which every live follower has polled once or more.
    if (wasLeader) this.nextConnectAt = Math.max(this.nextConnectAt, Date.now() + leaderHoldOffMs(this.opts.pollMs));
    this.opts.logger.warn(
      { err: err.message, how, leader: wasLeader, retryInMs: Math.round(this.nextConnectAt - Date.now()) },
      wasLeader
        ? 'maintenance leader session failed; stepping down'
        : 'maintenance election session lost; reconnecting after backoff',
    );
    if (wasLeader) this.opts.onLeaderSessionLost();
  }
}
