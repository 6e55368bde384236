import pg from 'pg';
import type { Logger } from '../logger.js';
import { checkoutListening } from '../sql.js';

/**
 * Every connection berth opens goes through this module, so that no database fault can crash
 * the process.
 *
 * Why it is needed: a `pg.Client` whose connection breaks (a terminated backend, a server
 * restart, a dropped socket) emits `'error'`, and an `'error'` event nobody listens to is thrown
 * by Node as an uncaught exception: the process exits. pg-pool listens on its idle clients, and
 * `pool.query` listens while it runs, but a client checked out with `pool.connect()` has no
 * listener at all until it is released (pg-pool removes its own on checkout). A promotion waiter
 * sits on such a client for up to 30 s behind a busy lane, so the window is wide (issue 8: the
 * leader crashed with "Unhandled 'error' event" in 2 of 12 database-fault runs).
 *
 * So: pools are made by `createPool` (an idle-error listener is always attached), checkouts go
 * through `withPoolClient` / `inPoolTransaction` (a listener for exactly the checkout, and a
 * broken client is never returned to the pool), and dedicated clients are made by `openClient`
 * (the listener is attached before `connect()`).
 */

/** A connection-level fault: the server went away or refused us; retrying later may succeed. */
export function isConnectionError(err: unknown): boolean {
  if (typeof err !== 'object' || err === null) return false;
  const e = err as { code?: unknown; message?: unknown };
  const code = typeof e.code === 'string' ? e.code : '';
  // Class 08: connection exception. 57P01-03: admin shutdown, crash shutdown, cannot connect now
  // (starting up / shutting down). 53300: too many connections. Node socket errors by name.
  if (code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03' || code === '53300')
    return true;
  if (
    [
      'ECONNREFUSED',
      'ECONNRESET',
      'EPIPE',
      'ETIMEDOUT',
      'ENOTFOUND',
      'EHOSTUNREACH',
      'ENETUNREACH',
      'EAI_AGAIN',
    ].includes(code)
  )
    return true;
  const message = typeof e.message === 'string' ? e.message : '';
  // pg's own wording when the socket closes under it or a connect attempt times out.
  return /Connection terminated|Client has encountered a connection error|connection timeout|timeout expired|Connection ended unexpectedly/i.test(
    message,
  );
}

/** Build a pool whose idle clients' errors are logged, never thrown. */
export function createPool(config: pg.PoolConfig, logger: Logger, label: string): pg.Pool {
  const pool = new pg.Pool(config);
  pool.on('error', (err) =>
    logger.warn({ err: err.message, pool: label }, 'idle database connection lost; the pool replaces it'),
  );
  return pool;
}

/**
 * Open a dedicated client (LISTEN, the leader's session, a migration). The `'error'` listener
 * is attached before connecting, so a fault at any moment reaches `onError` instead of
 * crashing the process. A failed connect ends the client and rethrows.
 */
export async function openClient(config: pg.ClientConfig, onError: (err: Error) => void): Promise<pg.Client> {
  const client = new pg.Client(config);
  client.on('error', onError);
  try {
    await client.connect();
  } catch (err) {
    await client.end().catch(() => undefined);
    throw err;
  }
  return client;
}

/** Passed to the body of a checkout: `discard()` closes the client instead of pooling it. */
export interface Checkout {
  readonly client: pg.PoolClient;
  /** The backend's pid, for a server-side cancel (`pg_cancel_backend`). */
  readonly pid: number | undefined;
  discard(): void;
}

/**
 * Check a client out for `fn` with an `'error'` listener for exactly that time. A client that
 * errored (or that `fn` discarded) is destroyed on release rather than handed to the next
 * caller.
 */
export async function withPoolClient<T>(pool: pg.Pool, fn: (c: Checkout) => Promise<T>): Promise<T> {
  let broken: Error | true | null = null;
  const onError = (err: Error) => {
    broken ??= err;
  };
  // Attached in the tick the pool hands the client over (see checkoutListening).
  const client = await checkoutListening(pool, onError);
  const checkout: Checkout = {
    client,
    pid: (client as pg.PoolClient & { processID?: number }).processID,
    discard: () => {
      broken ??= true;
    },
  };
  try {
    return await fn(checkout);
  } finally {
    client.removeListener('error', onError);
    client.release(broken ?? undefined);
  }
}

export interface TransactionOptions {
  /** `SET LOCAL lock_timeout` for this transaction; null or absent waits as the server does. */
  lockTimeoutMs?: number | null;
  /** `SET LOCAL statement_timeout` for this transaction (overrides the pool's). */
  statementTimeoutMs?: number;
}

/**
 * Run `fn` in a transaction on a checked-out client (see `withPoolClient`). A failed ROLLBACK
 * (the connection is gone) discards the client.
 */
export async function inPoolTransaction<T>(
  pool: pg.Pool,
  fn: (c: Checkout) => Promise<T>,
  options: TransactionOptions = {},
): Promise<T> {
  return withPoolClient(pool, async (c) => {
    await c.client.query('BEGIN');
    try {
      const ms = (v: number) => `${Math.max(1, Math.round(v))}ms`;
      const lock = options.lockTimeoutMs ?? null;
      const statement = options.statementTimeoutMs ?? null;
      if (lock !== null || statement !== null) {
        // One round trip for both; a NULL leaves that setting as the session has it.
        await c.client.query(
          `SELECT set_config('lock_timeout', coalesce($1, current_setting('lock_timeout')), true),
                  set_config('statement_timeout', coalesce($2, current_setting('statement_timeout')), true)`,
          [lock === null ? null : ms(lock), statement === null ? null : ms(statement)],
        );
      }
      const result = await fn(c);
      await c.client.query('COMMIT');
      return result;
    } catch (err) {
      await c.client.query('ROLLBACK').catch(() => c.discard());
      throw err;
    }
  });
}

/**
 * The `application_name` of a session berth opens for a worker (`berth worker|read|listen|
 * dashboard|leader|follower <worker id>`), as PostgreSQL will report it: printable ASCII only
 * (the server would rewrite anything else itself, differently by version) and at most 63 bytes,
 * so `pg_stat_activity` shows whose session is whose, an operator can terminate one worker's
 * sessions, and leaderInfo can match the lock holder's session to its worker row exactly.
 */
export function sessionName(
  role: 'worker' | 'read' | 'listen' | 'dashboard' | 'leader' | 'follower',
  workerId: string,
): string {
  return `berth ${role} ${workerId}`.replace(/[^\x20-\x7e]/gu, '?').slice(0, 63);
}
