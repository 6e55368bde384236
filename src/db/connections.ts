import pg from 'pg';
import { BerthError, BerthInputError } from '../errors.js';
import type { Logger } from '../logger.js';
import { checkoutListening, type Queryable } from '../sql.js';
import { explainPreparedStatementError, type StatementNaming, unnamedArgs } from './prepared.js';
import {
  accepts,
  describeMismatch,
  HostSelector,
  type SessionWant,
  sessionKind,
  WrongSessionError,
} from './host-selector.js';
import { parseHosts, type SessionAttrs } from './hosts.js';

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
 * or `newClient` (the listener is attached before `connect()`).
 *
 * And so that no connect can hang: every pool and client is made for a `DatabaseTarget`
 * (`resolveDatabase`), which carries the connect timeout, and every connect failure becomes a
 * `ConnectError` naming host, port and database (never the password).
 */

/** The connect timeout when nothing sets one (issue 12: a silent server hung `Worker.start()` forever). */
export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;

/**
 * A connection string checked once, with its connect timeout resolved: what every pool and
 * client of berth is made for.
 */
export interface DatabaseTarget {
  readonly connectionString: string;
  /** How long one connect may take before it fails (each host of a list); 0 waits as long as the network does. */
  readonly connectTimeoutMs: number;
  /** `host:port, database "name"` for messages (every host of a list): never the user's password. */
  readonly where: string;
  /**
   * false: statements are sent unnamed (src/db/prepared.ts), for a transaction-mode pooler
   * without prepared-statement support. Absent or true: berth's hot statements are prepared
   * once per session.
   */
  readonly preparedStatements?: boolean;
  /**
   * A worker's detection (src/db/prepared.ts): statements named until the server shows it does
   * not keep them, unnamed from then on. Ignored when `preparedStatements` is false.
   */
  readonly naming?: StatementNaming;
  /**
   * The hosts of a multi-host string and the session they must give (src/db/hosts.ts); absent
   * on a target built by hand, which is one host, any session.
   */
  readonly hosts?: HostList;
}

/** One host of a target: pg's reading of it. */
interface HostTarget {
  readonly connectionString: string;
  readonly host: string;
  readonly port: number;
  /** `host:port` (`[v6]:port`, `socket /dir:port`). */
  readonly label: string;
  readonly database: string;
  /** `host:port, database "name"`. */
  readonly where: string;
}

/** A target's hosts with the selector every pool and client of the target shares. */
interface HostList {
  readonly hosts: readonly HostTarget[];
  readonly selector: HostSelector;
}

/** Where berth reads the one environment variable of the connection layer (`process.env` by default). */
export type ConnectionEnvironment = Readonly<Record<string, string | undefined>>;

export interface ResolveDatabaseOptions {
  /** The option's name in messages (`connectionString`, `readConnectionString`, `--database-url`). */
  field?: string;
  /** The caller's explicit timeout (`connectTimeoutMs`): wins over the URL and the environment. */
  connectTimeoutMs?: unknown;
  /** Default `process.env`: only PGCONNECT_TIMEOUT is read. */
  env?: ConnectionEnvironment;
  /** false: every client made for the target sends its statements unnamed (see DatabaseTarget). */
  preparedStatements?: boolean;
}

/**
 * Check a connection string and resolve its connect timeout. Precedence, most specific first:
 * the explicit `connectTimeoutMs` option, the URL's `connect_timeout` (seconds), the
 * PGCONNECT_TIMEOUT environment variable (seconds), then 10 s. URL and variable have libpq's
 * meaning: whole seconds, 0 or less waits indefinitely, 1 means 2 (libpq's minimum). The
 * variable is read here, not in src/process/env.ts, because it is the driver's setting, read where pg
 * itself reads PGHOST, PGUSER and PGPASSWORD: a `new Worker(...)` honours it as psql does.
 * A malformed string or value is a BerthInputError naming the field, never echoing the string
 * (it may hold a password).
 */
export function resolveDatabase(connectionString: unknown, options: ResolveDatabaseOptions = {}): DatabaseTarget {
  const field = options.field ?? 'connectionString';
  if (typeof connectionString !== 'string' || connectionString.trim() === '')
    throw new BerthInputError(`${field} must be a non-empty PostgreSQL connection string`);
  const parsed = parseHosts(connectionString, field);
  const hosts = parsed.hosts.map((one) => describeTarget(one, field));
  const where = `${hosts.map((h) => h.label).join(',')}, database "${hosts[0]?.database ?? ''}"`;
  const explicit = options.connectTimeoutMs;
  let connectTimeoutMs: number;
  if (explicit !== undefined) {
    if (typeof explicit !== 'number' || !Number.isFinite(explicit) || explicit < 0)
      throw new BerthInputError(
        `connectTimeoutMs must be a finite number of milliseconds >= 0 (0 waits indefinitely), got ${JSON.stringify(explicit)}`,
      );
    connectTimeoutMs = explicit;
  } else {
    // Every host of a list shares the query string.
    const fromUrl = urlParameter(parsed.hosts[0] ?? connectionString, 'connect_timeout');
    const env = options.env ?? process.env;
    const fromEnv = env.PGCONNECT_TIMEOUT?.trim() || undefined;
    connectTimeoutMs =
      fromUrl !== undefined
        ? libpqSeconds(fromUrl, `${field}'s connect_timeout`)
        : fromEnv !== undefined
          ? libpqSeconds(fromEnv, 'PGCONNECT_TIMEOUT')
          : DEFAULT_CONNECT_TIMEOUT_MS;
  }
  const prepared = options.preparedStatements;
  if (prepared !== undefined && typeof prepared !== 'boolean')
    throw new BerthInputError(`preparedStatements must be true or false, got ${JSON.stringify(prepared)}`);
  const base: DatabaseTarget =
    prepared === false
      ? { connectionString, connectTimeoutMs, where, preparedStatements: false }
      : { connectionString, connectTimeoutMs, where };
  // A plain single-host string connects exactly as before: no selector, no session check.
  if (hosts.length === 1 && parsed.sessionAttrs === 'any' && hosts[0]?.connectionString === connectionString)
    return base;
  const target: DatabaseTarget = { ...base, hosts: { hosts, selector: newSelector(hosts, parsed.sessionAttrs, base) } };
  return target;
}

/** libpq's connect_timeout: an integer of seconds; <= 0 is no timeout; 1 is raised to 2. */
function libpqSeconds(value: string, name: string): number {
  if (!/^[+-]?\d+$/.test(value.trim()))
    throw new BerthInputError(`${name} must be a whole number of seconds (libpq's meaning), got "${value}"`);
  const seconds = Number(value.trim());
  if (seconds <= 0) return 0;
  return Math.max(seconds, 2) * 1000;
}

const URL_SCHEMES = new Set(['postgres:', 'postgresql:', 'socket:']);

/** A query parameter of a URL connection string; undefined for a socket path or when absent. */
function urlParameter(connectionString: string, name: string): string | undefined {
  if (connectionString.startsWith('/')) return undefined;
  return new URL(connectionString).searchParams.get(name) ?? undefined;
}

/**
 * `host:port, database "name"` as pg will use them (it fills gaps from PGHOST, PGPORT, PGDATABASE
 * and the user name), for connect errors. pg parses the string when a client is constructed, so a
 * string pg cannot read fails here, before anything connects. Anything but a postgres:// or
 * postgresql:// URL or a socket path is refused: pg would read `localhost/db` (a missing scheme)
 * as the database name on a host called "base".
 */
function describeTarget(connectionString: string, field: string): HostTarget {
  const malformed = (why: string) =>
    new BerthInputError(
      `${field} is not a valid PostgreSQL connection string (${why}); expected postgres://user:password@host:port/database`,
    );
  if (!connectionString.startsWith('/')) {
    let url: URL;
    try {
      url = new URL(connectionString);
    } catch {
      // Node's own error carries the input (and with it any password): never rethrown.
      throw malformed('not a URL');
    }
    if (!URL_SCHEMES.has(url.protocol)) throw malformed(`scheme "${url.protocol}" is not postgres: or postgresql:`);
  }
  let probe: pg.Client;
  try {
    probe = new pg.Client({ connectionString });
  } catch (err) {
    throw malformed(err instanceof Error && !err.message.includes(connectionString) ? err.message : 'unreadable');
  }
  const host = probe.host.startsWith('/')
    ? `socket ${probe.host}`
    : probe.host.includes(':')
      ? `[${probe.host}]`
      : probe.host;
  const label = `${host}:${probe.port}`;
  const database = probe.database ?? probe.user ?? '';
  return {
    connectionString,
    host: probe.host,
    port: probe.port,
    label,
    database,
    where: `${label}, database "${database}"`,
  };
}

/**
 * A connect that failed: no answer within the connect timeout, refused, unknown host, or refused
 * by the server (authentication, no such database). The message names host, port and database,
 * never the password; `cause` is the driver's error (its `code` says which).
 */
export class ConnectError extends BerthError {
  override readonly code = 'CONNECT';

  /** Why, without the `could not connect to ...` prefix (each host's reason for a host list). */
  readonly reason: string;

  constructor(
    readonly where: string,
    readonly timedOut: boolean,
    options: { cause: unknown; timeoutMs: number; reason?: string },
  ) {
    const reason =
      options.reason ??
      (timedOut
        ? `no answer within ${formatMs(options.timeoutMs)} (the connect timeout: connectTimeoutMs, the URL's connect_timeout or PGCONNECT_TIMEOUT)`
        : options.cause instanceof Error
          ? options.cause.message
          : String(options.cause));
    super(`could not connect to PostgreSQL at ${where}: ${reason}`, { cause: options.cause });
    this.name = 'ConnectError';
    this.reason = reason;
  }
}

function formatMs(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000} s` : `${ms} ms`;
}

function connectError(err: unknown, where: string, timeoutMs: number): ConnectError {
  if (err instanceof ConnectError) return err;
  // pg's wording when its connect timer destroys the socket (client.js `_connect`).
  const timedOut = timeoutMs > 0 && err instanceof Error && /timeout expired/i.test(err.message);
  return new ConnectError(where, timedOut, { cause: err, timeoutMs });
}

type ConnectCallback = (err: Error | null, client?: pg.Client) => void;

/** The parameters the server reported at startup, as pg's connection emits them. */
interface ParameterStatus {
  parameterName: string;
  parameterValue: string;
}

/** The failure of a search that found no host: each host's reason, a connection fault if any host's was. */
function noHostError(target: DatabaseTarget, hosts: readonly HostTarget[], failures: readonly unknown[]): Error {
  const reasons = failures.map((f, i) => {
    const label = hosts[i % hosts.length]?.label ?? '';
    const why = f instanceof ConnectError ? f.reason : f instanceof Error ? f.message : String(f);
    return `${label}: ${why}`;
  });
  // A host that refused or gave the wrong session may be fine later: retry. Only when every host
  // refused us for good (a wrong password everywhere) is it not a connection fault.
  const cause = failures.find((f) => isConnectionError(f)) ?? failures[0];
  const timedOut = failures.length > 0 && failures.every((f) => f instanceof ConnectError && f.timedOut);
  return new ConnectError(target.where, timedOut, {
    cause,
    timeoutMs: target.connectTimeoutMs,
    reason: reasons.join('; '),
  });
}

/** Point a constructed, unconnected client at one host of its target (pg reads these in connect()). */
function aim(client: pg.Client, host: HostTarget): void {
  client.host = host.host;
  client.port = host.port;
  const params = (client as unknown as { connectionParameters: { host: string; port: number } }).connectionParameters;
  params.host = host.host;
  params.port = host.port;
}

/** Collect what the server reports at startup (in_hot_standby, default_transaction_read_only). */
function recordReported(client: pg.Client): Map<string, string> {
  const reported = new Map<string, string>();
  (client.connection as unknown as NodeJS.EventEmitter).on('parameterStatus', (msg: ParameterStatus) => {
    reported.set(msg.parameterName, msg.parameterValue);
  });
  return reported;
}

/** Connect `client` to `host` and check its session against `want`; a refused session ends the client. */
async function connectChecked(
  client: pg.Client,
  connect: () => Promise<unknown>,
  host: HostTarget,
  want: SessionWant,
  reported: ReadonlyMap<string, string>,
  timeoutMs: number,
): Promise<void> {
  aim(client, host);
  try {
    await connect();
  } catch (err) {
    throw connectError(err, host.where, timeoutMs);
  }
  if (want === 'any') return;
  let kind: Awaited<ReturnType<typeof sessionKind>>;
  try {
    kind = await sessionKind(client, reported);
  } catch (err) {
    await client.end().catch(() => undefined);
    throw connectError(err, host.where, timeoutMs);
  }
  if (!accepts(want, kind)) {
    await client.end().catch(() => undefined);
    const cause = new WrongSessionError(describeMismatch(want, kind));
    throw new ConnectError(host.where, false, { cause, timeoutMs });
  }
}

/** The selector of a multi-host target: its probes are plain clients, ended once they answered. */
function newSelector(hosts: readonly HostTarget[], attrs: SessionAttrs, target: DatabaseTarget): HostSelector {
  const probe = async (index: number, want: SessionWant) => {
    const host = hosts[index];
    if (!host) throw new Error(`no host ${index}`);
    const client = new pg.Client({
      connectionString: host.connectionString,
      connectionTimeoutMillis: target.connectTimeoutMs,
    });
    client.on('error', () => undefined);
    const reported = recordReported(client);
    await connectChecked(client, () => client.connect(), host, want, reported, target.connectTimeoutMs);
    await client.end().catch(() => undefined);
  };
  return new HostSelector(hosts.length, attrs, probe, (failures) => noHostError(target, hosts, failures));
}

/**
 * The client class of a target: pg's Client with the target's connect timeout, whose connect
 * failures are ConnectErrors. The timeout is set on the client, not as the pool's
 * `connectionTimeoutMillis`: pg-pool applies that one also to a checkout waiting for a busy pool,
 * and a worker's claim or settlement waiting its turn for a connection must not fail for it.
 * A multi-host target's client asks the target's selector which host to connect to, and checks
 * its own session (the role may have changed since the selector last looked).
 */
function clientClass(target: DatabaseTarget): new (config?: pg.ClientConfig) => pg.Client {
  const list = target.hosts;
  const first = list?.hosts[0]?.connectionString ?? target.connectionString;
  return class BerthClient extends pg.Client {
    private readonly reported: Map<string, string> | null;

    constructor(config: pg.ClientConfig = {}) {
      super({ ...config, connectionString: first, connectionTimeoutMillis: target.connectTimeoutMs });
      this.reported = list ? recordReported(this) : null;
      // Set per instance, not as an override: pg's query() has a dozen overloads to restate.
      // pg-pool's own `pool.query` comes through here too (it calls the client's).
      const query = this.query.bind(this) as (...args: unknown[]) => unknown;
      const { naming } = target;
      const failed = (err: unknown) => {
        naming?.saw(err);
        return explainPreparedStatementError(err);
      };
      (this as { query: unknown }).query = (...args: unknown[]) => {
        const unnamed = target.preparedStatements === false || naming?.named === false;
        const sent = unnamed ? unnamedArgs(args) : args;
        const last = sent[sent.length - 1];
        if (typeof last === 'function') {
          // Callback form (pg-pool's pool.query): the callback gets the explained error.
          const callback = last as (err: unknown, ...rest: unknown[]) => void;
          return query(...sent.slice(0, -1), (err: unknown, ...rest: unknown[]) =>
            callback(err ? failed(err) : err, ...rest),
          );
        }
        const result = query(...sent);
        return result instanceof Promise
          ? result.catch((err: unknown) => {
              throw failed(err);
            })
          : result;
      };
    }

    override connect(): Promise<pg.Client>;
    override connect(callback: ConnectCallback): void;
    override connect(callback?: ConnectCallback): Promise<pg.Client> | undefined {
      // pg calls a connect callback in the very tick the server says it is ready, and pg-pool
      // attaches its idle listener in that callback. Ours comes a few microtasks later (and after
      // the session check of a host list), and the bytes of one read are parsed synchronously:
      // a backend terminated right after its start-up sends ReadyForQuery and the FATAL in one
      // packet, and the FATAL's 'error' would be emitted with nobody listening, which crashes
      // the process. Heard here until the caller has the client: such a connect fails as a
      // connection fault instead (test/db-faults.test.ts, the coalesced-packet test).
      let early: Error | null = null;
      const onEarly = (err: Error) => {
        early ??= err;
      };
      this.on('error', onEarly);
      const connecting = (list ? this.connectToList(list) : this.connectPlain()).then(
        (client) => {
          this.removeListener('error', onEarly);
          if (early === null) return client;
          this.end().catch(() => undefined);
          throw connectError(early, target.where, target.connectTimeoutMs);
        },
        (err: unknown) => {
          this.removeListener('error', onEarly);
          throw err;
        },
      );
      if (!callback) return connecting;
      connecting.then(
        () => callback(null, this),
        (err: Error) => callback(err),
      );
      return undefined;
    }

    private connectPlain(): Promise<pg.Client> {
      return super.connect().then(
        () => this,
        (err: unknown) => {
          throw connectError(err, target.where, target.connectTimeoutMs);
        },
      );
    }

    private async connectToList(hosts: HostList): Promise<pg.Client> {
      const index = await hosts.selector.choose();
      const host = hosts.hosts[index];
      if (!host) throw new Error(`no host ${index}`);
      const attrs = hosts.selector.sessionAttrs;
      // prefer-standby takes a primary when the search found no standby.
      const want: SessionWant = attrs === 'prefer-standby' ? 'any' : attrs;
      try {
        await connectChecked(
          this,
          () => super.connect(),
          host,
          want,
          this.reported ?? new Map(),
          target.connectTimeoutMs,
        );
      } catch (err) {
        hosts.selector.forget(index);
        throw err;
      }
      hosts.selector.confirm(index);
      return this;
    }
  };
}

/**
 * A client for the target, not yet connected, for a session that manages its own listeners and
 * reconnects (LISTEN, the leader election). Attach an `'error'` listener before `connect()`.
 */
export function newClient(target: DatabaseTarget, config: Omit<pg.ClientConfig, 'connectionString'> = {}): pg.Client {
  const Client = clientClass(target);
  return new Client(config);
}

/** A connection-level fault: the server went away or refused us; retrying later may succeed. */
export function isConnectionError(err: unknown): boolean {
  if (typeof err !== 'object' || err === null) return false;
  // A failed connect says why in its cause: a refused socket is one, a wrong password is not.
  if (err instanceof ConnectError) return err.timedOut || isConnectionError(err.cause);
  // A host that gave the wrong kind of session (a standby not yet promoted) may give the right one later.
  if (err instanceof WrongSessionError) return true;
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

/**
 * Build a pool on the target whose idle clients' errors are logged (or given to `onIdleError`),
 * never thrown. Its connects time out as the target says.
 */
export function createPool(
  target: DatabaseTarget,
  config: Omit<pg.PoolConfig, 'connectionString' | 'Client' | 'connectionTimeoutMillis'>,
  logger: Logger | null,
  label: string,
): pg.Pool {
  const pool = new pg.Pool({
    ...config,
    connectionString: target.hosts?.hosts[0]?.connectionString ?? target.connectionString,
    // The typings say a Client takes no arguments; pg-pool passes it the pool's options.
    Client: clientClass(target) as new () => pg.Client,
  });
  pool.on('error', (err) =>
    logger?.warn({ err: err.message, pool: label }, 'idle database connection lost; the pool replaces it'),
  );
  return pool;
}

/**
 * Open a dedicated client (a migration, a CLI command). The `'error'` listener is attached
 * before connecting, so a fault at any moment reaches `onError` instead of crashing the process.
 * A failed connect ends the client and rethrows (a ConnectError).
 */
export async function openClient(
  target: DatabaseTarget,
  config: Omit<pg.ClientConfig, 'connectionString'>,
  onError: (err: Error) => void,
): Promise<pg.Client> {
  const client = newClient(target, config);
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

/** A pg.Pool, by its shape (an application may load a second copy of pg, whose Pool is another class). */
function isPool(db: Queryable): db is pg.Pool {
  const x = db as Partial<pg.Pool>;
  return typeof x.connect === 'function' && typeof x.totalCount === 'number';
}

/**
 * Run `fn` on one connection of `db`: a pool's checked-out client (withPoolClient), so what `fn`
 * times starts once the connection is in hand, not while waiting for one; else `db` itself. A
 * client whose statement failed is discarded, as `pool.query` does: a backend terminated
 * mid-statement rejects the statement without an `'error'` event, and handed to the next caller
 * it would fail that caller's statement too.
 */
export function onConnectionOf<T>(db: Queryable, fn: (c: Queryable) => Promise<T>): Promise<T> {
  if (!isPool(db)) return fn(db);
  return withPoolClient(db, async (c) => {
    try {
      return await fn(c.client);
    } catch (err) {
      c.discard();
      throw err;
    }
  });
}

/**
 * Run `fn` in a transaction of its own on `db`: a pool's checked-out client (inPoolTransaction),
 * or a client that is not inside a transaction already (the testing helpers' and the tests').
 */
export async function inTransactionOn<T>(db: Queryable, fn: (tx: Queryable) => Promise<T>): Promise<T> {
  if (isPool(db)) return inPoolTransaction(db, (c) => fn(c.client));
  await db.query('BEGIN');
  try {
    const result = await fn(db);
    await db.query('COMMIT');
    return result;
  } catch (err) {
    await db.query('ROLLBACK').catch(() => undefined);
    throw err;
  }
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
