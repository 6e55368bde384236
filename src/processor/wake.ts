import type pg from 'pg';
import { newClient, type DatabaseTarget } from '../db/connections.js';
import type { Logger } from '../logger.js';
import { quoteIdent } from '../sql.js';

export interface WakeListenerOptions {
  database: DatabaseTarget;
  channel: string;
  logger: Logger;
  /** Called per notification with its payload ('' for a bare wake). */
  onNotify: (payload: string) => void;
  onReconnect?: () => void;
  /** First reconnect delay (the worker's `listenReconnectBaseMs`); doubles to `reconnectMaxMs` (default 5 s, the poll interval). */
  reconnectBaseMs: number;
  reconnectMaxMs?: number;
  /** The LISTEN session's `application_name`. */
  applicationName?: string;
}

/**
 * One LISTEN connection per worker process. Every notification releases one fetch (the
 * caller's `onNotify`). When the connection drops it reconnects with capped exponential
 * backoff; the shared poll ticker keeps the worker draining meanwhile.
 */
export class WakeListener {
  private client: pg.Client | null = null;
  private stopped = false;
  private retryTimer: NodeJS.Timeout | null = null;
  private attempt = 0;

  constructor(private readonly opts: WakeListenerOptions) {}

  async start(): Promise<void> {
    await this.connect();
  }

  /** True while a LISTEN connection is up. */
  get connected(): boolean {
    return this.client !== null;
  }

  private async connect(): Promise<void> {
    if (this.stopped) return;
    const client = newClient(this.opts.database, { application_name: this.opts.applicationName });
    const lost = (err?: Error) => {
      if (this.client !== client) return;
      this.client = null;
      client.removeAllListeners('notification');
      client.end().catch(() => undefined);
      if (this.stopped) return;
      this.opts.logger.warn({ err: err?.message }, 'wake LISTEN connection lost; polling continues, reconnecting');
      this.scheduleReconnect();
    };
    client.on('error', lost);
    client.on('end', () => lost());
    try {
      await client.connect();
      await client.query(`LISTEN ${quoteIdent(this.opts.channel)}`);
    } catch (err) {
      client.end().catch(() => undefined);
      if (this.stopped) return;
      this.opts.logger.warn({ err: (err as Error).message }, 'wake LISTEN connect failed; retrying');
      this.scheduleReconnect();
      return;
    }
    if (this.stopped) {
      await client.end().catch(() => undefined);
      return;
    }
    client.on('notification', (n) => this.opts.onNotify(n.payload ?? ''));
    this.client = client;
    if (this.attempt > 0) {
      this.opts.onReconnect?.();
      // Anything enqueued while we were deaf is found by the fetch this triggers.
      this.opts.onNotify('');
    }
    this.attempt = 0;
  }

  /**
   * Reconnect at once if the session is down and waiting out its backoff: the caller saw the
   * database answer again (a claim succeeded), so the wait would only delay wake-ups.
   */
  reconnectNow(): void {
    if (this.stopped || this.client !== null || this.retryTimer === null) return;
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    void this.connect();
  }

  private scheduleReconnect(): void {
    const base = this.opts.reconnectBaseMs;
    // Capped at the poll interval: the poll keeps claims going while LISTEN is down, so waiting
    // longer than one poll to listen again only delays wake-ups after an outage.
    const max = this.opts.reconnectMaxMs ?? 5_000;
    const delay = Math.min(base * 2 ** this.attempt, max) * (0.5 + Math.random() / 2);
    this.attempt++;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      void this.connect();
    }, delay);
  }

  /** For tests and operators: the backend pid of the LISTEN session, if connected. */
  async backendPid(): Promise<number | null> {
    if (!this.client) return null;
    const r = await this.client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
    return r.rows[0]?.pid ?? null;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    const c = this.client;
    this.client = null;
    if (c) await c.end().catch(() => undefined);
  }
}
