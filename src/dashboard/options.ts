import { didYouMean } from '../util/nearest.js';
import type pg from 'pg';
import type { Registry } from 'prom-client';
import { resolveDatabase, type DatabaseTarget } from '../db/connections.js';
import { BerthInputError } from '../errors.js';
import { MAX_ACTOR_CHARS } from '../limits.js';
import { createLogger, type Logger } from '../logger.js';
import { DEFAULT_SCHEMA, type Queryable } from '../sql.js';
import { validateAuthLimits, type AuthLimitOptions, type AuthLimits } from './auth-limits.js';

/** Who may use the dashboard. With neither, it only binds to (and answers) loopback. */
export interface DashboardAuth {
  /**
   * Accepted as `Authorization: Bearer <token>`, and on the login form (which sets a session
   * cookie). At least MIN_TOKEN_LENGTH (16) characters: a random one, say `openssl rand -base64 24`.
   */
  token?: string;
  /** HTTP Basic auth: user name -> password, each password at least MIN_PASSWORD_LENGTH (12) characters. */
  users?: Record<string, string>;
}

/**
 * The shortest token and password accepted at start. Guessing is slowed to about 20 tries per
 * client per 25 minutes (see AuthLimitOptions), but a 1-character secret falls in a handful of
 * tries; 16 random characters (about 96 bits from base64) are out of reach, and 12 is the floor
 * for a password a person chose.
 */
export const MIN_TOKEN_LENGTH = 16;
export const MIN_PASSWORD_LENGTH = 12;

export interface DashboardOptions {
  connectionString?: string;
  /**
   * Used as is and left open by `close()`; otherwise a small pool on `connectionString`. Give it
   * sessions with `jit = off` (the worker's pool has it): lane stats plan over every ring
   * partition and are costed high enough for JIT, which turns a millisecond read into seconds.
   */
  pool?: pg.Pool;
  /**
   * How long opening one of its own pool's connections may take; 0 waits indefinitely. Default:
   * `connectionString`'s `connect_timeout`, else PGCONNECT_TIMEOUT (seconds, as libpq), else 10 s.
   */
  connectTimeoutMs?: number;
  /** Default `berth`. */
  schema?: string;
  /** Default 127.0.0.1. Anything else needs `auth`. */
  host?: string;
  /** Default 4680; 0 picks a free port (see the returned `url`). */
  port?: number;
  auth?: DashboardAuth;
  /** Show everything, change nothing: every action answers 403. */
  readOnly?: boolean;
  logger?: Logger;
  /** Also serve `GET /metrics` (Prometheus) from this registry, behind the same authentication. */
  metricsRegistry?: Registry;
  /** Serve under this path prefix (say `/berth`) instead of the root. */
  basePath?: string;
  /** How failed authentications are slowed (per client, per user, for the token); defaults in AUTH_LIMIT_DEFAULTS. */
  authLimits?: AuthLimitOptions;
}

export const DEFAULT_DASHBOARD_PORT = 4680;
export const DEFAULT_DASHBOARD_HOST = '127.0.0.1';

/** Every dashboard default in one place (authLimits: AUTH_LIMIT_DEFAULTS; docs/configuration.md). */
export const DASHBOARD_DEFAULTS = Object.freeze({
  host: DEFAULT_DASHBOARD_HOST,
  port: DEFAULT_DASHBOARD_PORT,
  schema: DEFAULT_SCHEMA,
  readOnly: false,
  /** The root. */
  basePath: '',
});

/** The options of a dashboard request handler (`createDashboardHandler`). */
export interface DashboardHandlerOptions {
  /** Where the dashboard reads and acts (a pg.Pool, at READ COMMITTED). */
  pool: Queryable;
  schema?: string;
  auth?: DashboardAuth;
  readOnly?: boolean;
  logger?: Logger;
  metricsRegistry?: Registry;
  basePath?: string;
  authLimits?: AuthLimitOptions;
}

/** DashboardHandlerOptions with every default filled in and every value checked. */
export interface ResolvedDashboardHandlerOptions {
  readonly pool: Queryable;
  readonly schema: string;
  readonly auth: DashboardAuth | undefined;
  readonly readOnly: boolean;
  readonly logger: Logger;
  readonly metricsRegistry: Registry | null;
  /** Normalised: `/berth`, or '' for the root. */
  readonly basePath: string;
  readonly authLimits: AuthLimits;
}

/** DashboardOptions resolved: the handler's options plus the server's address and its own pool, if any. */
export interface ResolvedDashboardOptions extends Omit<ResolvedDashboardHandlerOptions, 'pool'> {
  readonly host: string;
  readonly port: number;
  /** The caller's pool (left open by close()), or null: the dashboard opens one on `connectionString`. */
  readonly pool: pg.Pool | null;
  /** The database its own pool connects to (null when given a pool). */
  readonly database: DatabaseTarget | null;
}

const HANDLER_OPTION_KEYS: ReadonlySet<string> = new Set<keyof DashboardHandlerOptions>([
  'pool',
  'schema',
  'auth',
  'readOnly',
  'logger',
  'metricsRegistry',
  'basePath',
  'authLimits',
]);
const DASHBOARD_OPTION_KEYS: ReadonlySet<string> = new Set<keyof DashboardOptions>([
  'connectionString',
  'connectTimeoutMs',
  'pool',
  'schema',
  'host',
  'port',
  'auth',
  'readOnly',
  'logger',
  'metricsRegistry',
  'basePath',
  'authLimits',
]);

function checkKnownKeys(options: object, known: ReadonlySet<string>, what: string): void {
  if (typeof options !== 'object' || options === null || Array.isArray(options))
    throw new BerthInputError(`${what} must be an object`);
  for (const [key, value] of Object.entries(options)) {
    if (value !== undefined && !known.has(key))
      throw new BerthInputError(`unknown ${what} "${key}"${didYouMean(key, known)}`);
  }
}

/** What every dashboard resolves the same way: its authentication, read-only mode and base path. */
function resolveAccess(
  options: Pick<DashboardHandlerOptions, 'auth' | 'readOnly' | 'basePath' | 'authLimits'>,
): Pick<ResolvedDashboardHandlerOptions, 'auth' | 'readOnly' | 'basePath' | 'authLimits'> {
  validateAuth(options.auth);
  if (options.readOnly !== undefined && typeof options.readOnly !== 'boolean')
    throw new BerthInputError('dashboard readOnly must be true or false');
  return {
    auth: options.auth,
    readOnly: options.readOnly ?? DASHBOARD_DEFAULTS.readOnly,
    basePath: normaliseBasePath(options.basePath),
    authLimits: validateAuthLimits(options.authLimits),
  };
}

function resolveShared(options: Omit<DashboardHandlerOptions, 'pool'>): Omit<ResolvedDashboardHandlerOptions, 'pool'> {
  return {
    ...resolveAccess(options),
    schema: options.schema ?? DASHBOARD_DEFAULTS.schema,
    logger: options.logger ?? createLogger({ component: 'dashboard' }),
    metricsRegistry: options.metricsRegistry ?? null,
  };
}

/** The settings of the dashboard a worker serves (`WorkerOptions.http.dashboard`): the worker supplies the rest. */
export interface DashboardSettings {
  auth?: DashboardAuth;
  readOnly?: boolean;
  /** Default: the worker's logger. */
  logger?: Logger;
  basePath?: string;
  authLimits?: AuthLimitOptions;
}

/** DashboardSettings resolved; `logger` null means the worker's own. */
export interface ResolvedDashboardSettings
  extends Pick<ResolvedDashboardHandlerOptions, 'auth' | 'readOnly' | 'basePath' | 'authLimits'> {
  readonly logger: Logger | null;
}

const SETTINGS_KEYS: ReadonlySet<string> = new Set<keyof DashboardSettings>([
  'auth',
  'readOnly',
  'logger',
  'basePath',
  'authLimits',
]);

/**
 * The worker's dashboard settings resolved once, in the Worker constructor (the database,
 * schema, address and metrics registry are the worker's own, so they are not settings here and
 * are refused by name like any unknown key).
 */
export function resolveDashboardSettings(options: DashboardSettings, what: string): ResolvedDashboardSettings {
  checkKnownKeys(options, SETTINGS_KEYS, what);
  return { ...resolveAccess(options), logger: options.logger ?? null };
}

/** Defaults filled in, every value checked, once; an unknown key or a bad value is a BerthInputError naming it. */
export function resolveDashboardHandlerOptions(options: DashboardHandlerOptions): ResolvedDashboardHandlerOptions {
  checkKnownKeys(options, HANDLER_OPTION_KEYS, 'dashboard option');
  if (!options.pool) throw new BerthInputError('the dashboard handler needs a pool');
  return { ...resolveShared(options), pool: options.pool };
}

/**
 * `startDashboard`'s options resolved once: defaults filled in, every value checked (the address,
 * the authentication and its limits, the base path) before anything listens. Without auth only
 * a loopback host is accepted.
 */
export function resolveDashboardOptions(options: DashboardOptions): ResolvedDashboardOptions {
  checkKnownKeys(options, DASHBOARD_OPTION_KEYS, 'dashboard option');
  const host = options.host ?? DASHBOARD_DEFAULTS.host;
  const port = validatePort(options.port ?? DASHBOARD_DEFAULTS.port);
  const shared = resolveShared(options);
  assertSafeBinding(options.auth, host);
  if (!options.pool && !options.connectionString)
    throw new BerthInputError('the dashboard needs a connectionString or a pool');
  if (options.pool && options.connectTimeoutMs !== undefined)
    throw new BerthInputError(
      'dashboard connectTimeoutMs applies to its own pool: set it on the pool you pass instead',
    );
  const database = options.pool
    ? null
    : resolveDatabase(options.connectionString, { connectTimeoutMs: options.connectTimeoutMs });
  return { ...shared, host, port, pool: options.pool ?? null, database };
}

const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost', '[::1]']);

export function isLoopbackHost(host: string): boolean {
  return LOOPBACK.has(host.toLowerCase());
}

export function hasAuth(auth: DashboardAuth | undefined): boolean {
  return Boolean(auth?.token) || Object.keys(auth?.users ?? {}).length > 0;
}

/** Characters, not UTF-16 units: an emoji is one. */
const chars = (s: string) => [...s].length;

/**
 * Refuses auth settings that would let everyone in (an empty token or password) or fall to
 * guessing (one shorter than MIN_TOKEN_LENGTH / MIN_PASSWORD_LENGTH), naming the option.
 */
export function validateAuth(auth: DashboardAuth | undefined): void {
  if (auth === undefined) return;
  if (typeof auth !== 'object' || auth === null)
    throw new BerthInputError('dashboard auth must be an object { token?, users? }');
  for (const key of Object.keys(auth)) {
    if (key !== 'token' && key !== 'users')
      throw new BerthInputError(
        `unknown dashboard auth option "${key}"${didYouMean(key, ['token', 'users'])} (token, users)`,
      );
  }
  if (auth.token !== undefined && (typeof auth.token !== 'string' || chars(auth.token) < MIN_TOKEN_LENGTH)) {
    throw new BerthInputError(
      `dashboard auth.token (BERTH_DASHBOARD_TOKEN) must be a string of at least ${MIN_TOKEN_LENGTH} characters; generate one with \`openssl rand -base64 24\``,
    );
  }
  if (auth.users !== undefined) {
    if (typeof auth.users !== 'object' || auth.users === null)
      throw new BerthInputError('dashboard auth.users must map user names to passwords');
    for (const [user, password] of Object.entries(auth.users)) {
      if (user.length === 0 || user.includes(':'))
        throw new BerthInputError(`dashboard user name "${user}" must be non-empty and contain no ":"`);
      // The audit log names the bearer `dashboard:token` and loopback without authentication
      // `dashboard:local`: a Basic user of either name would be recorded as them.
      if (RESERVED_USERS.has(user))
        throw new BerthInputError(
          `dashboard user name "${user}" is reserved (the audit log's name for the ${user === 'token' ? 'bearer token' : 'unauthenticated loopback user'}): choose another`,
        );
      // Recorded as `dashboard:<user>`, an actor the database takes up to MAX_ACTOR_CHARS: a longer
      // name would make every cancel and removal by that user fail.
      if (user.length > MAX_USER_CHARS)
        throw new BerthInputError(
          `dashboard user name "${user.slice(0, 20)}…" must be at most ${MAX_USER_CHARS} characters (got ${user.length}): the audit log records it as dashboard:<user>`,
        );
      if (typeof password !== 'string' || chars(password) < MIN_PASSWORD_LENGTH) {
        throw new BerthInputError(
          `dashboard auth.users (BERTH_DASHBOARD_USERS): the password of "${user}" must be at least ${MIN_PASSWORD_LENGTH} characters`,
        );
      }
    }
  }
}

/** The longest Basic user name: `dashboard:<user>` must fit an actor (MAX_ACTOR_CHARS). */
const MAX_USER_CHARS = MAX_ACTOR_CHARS - 'dashboard:'.length;

/** Basic user names the audit log already gives a meaning to (src/dashboard/auth.ts). */
const RESERVED_USERS: ReadonlySet<string> = new Set(['token', 'local']);

/**
 * Without authentication the dashboard may only listen on loopback: anyone who can reach it can
 * retry, cancel and purge tasks.
 */
export function assertSafeBinding(auth: DashboardAuth | undefined, host: string): void {
  if (!hasAuth(auth) && !isLoopbackHost(host)) {
    throw new BerthInputError(
      `the dashboard has no authentication, so it binds to 127.0.0.1, ::1 or localhost only (asked for "${host}"); ` +
        'set auth.token or auth.users (BERTH_DASHBOARD_TOKEN or BERTH_DASHBOARD_USERS=user:pass,...) to listen on another address',
    );
  }
}

export function validatePort(port: unknown, what = 'port'): number {
  if (typeof port !== 'number' || !Number.isInteger(port) || port < 0 || port > 65535) {
    throw new BerthInputError(`${what} must be an integer from 0 to 65535, got ${JSON.stringify(port)}`);
  }
  return port;
}

/** The warning an unauthenticated dashboard logs when it starts listening. */
export function warnIfNoAuth(logger: Logger, auth: DashboardAuth | undefined, host: string): void {
  if (hasAuth(auth)) return;
  logger.warn({ host }, `dashboard has no authentication; bound to ${host === 'localhost' ? '127.0.0.1' : host} only`);
}

/** `/berth` from `berth`, `/berth/` or `/berth`; '' for the root. */
export function normaliseBasePath(basePath: string | undefined): string {
  if (basePath === undefined || basePath === '' || basePath === '/') return '';
  if (!/^\/?[A-Za-z0-9._~\-/]+$/.test(basePath) || basePath.includes('//') || basePath.includes('..')) {
    throw new BerthInputError(`basePath "${basePath}" must be a plain URL path such as /berth`);
  }
  return `/${basePath.replace(/^\/+|\/+$/g, '')}`;
}

/** The parts of DashboardOptions the environment sets. */
export type DashboardEnvOptions = Pick<DashboardOptions, 'host' | 'port' | 'auth' | 'readOnly' | 'authLimits'>;

function envFlag(name: string, value: string): boolean {
  const v = value.toLowerCase();
  if (v === '1' || v === 'true' || v === 'yes') return true;
  if (v === '0' || v === 'false' || v === 'no') return false;
  throw new BerthInputError(`${name} must be 1 or 0 (true or false), got "${value}"`);
}

/**
 * Dashboard settings from an environment record (`fromEnv()` in src/process/env.ts passes `process.env`;
 * `berth dashboard` and the demo read these):
 * BERTH_DASHBOARD_TOKEN, BERTH_DASHBOARD_USERS (`user:pass,user2:pass2`; a password cannot contain
 * a comma), BERTH_DASHBOARD_READ_ONLY (1/true/0/false), BERTH_DASHBOARD_HOST, BERTH_DASHBOARD_PORT,
 * BERTH_DASHBOARD_TRUST_PROXY (1/true/0/false: `authLimits.trustProxy`).
 * Unset and empty variables are left out; a bad value throws BerthInputError naming the variable.
 */
export function dashboardOptionsFromEnv(env: Readonly<Record<string, string | undefined>>): DashboardEnvOptions {
  const out: DashboardEnvOptions = {};
  const get = (name: string): string | undefined => {
    const v = env[name];
    return v === undefined || v.trim() === '' ? undefined : v.trim();
  };
  const port = get('BERTH_DASHBOARD_PORT');
  if (port !== undefined) {
    if (!/^[0-9]+$/.test(port)) throw new BerthInputError(`BERTH_DASHBOARD_PORT must be a port number, got "${port}"`);
    out.port = validatePort(Number(port), 'BERTH_DASHBOARD_PORT');
  }
  const host = get('BERTH_DASHBOARD_HOST');
  if (host !== undefined) {
    if (/[\s/]/.test(host))
      throw new BerthInputError(`BERTH_DASHBOARD_HOST must be a host name or address, got "${host}"`);
    out.host = host;
  }
  const auth: DashboardAuth = {};
  const token = get('BERTH_DASHBOARD_TOKEN');
  if (token !== undefined) auth.token = token;
  const users = get('BERTH_DASHBOARD_USERS');
  if (users !== undefined) {
    auth.users = {};
    for (const pair of users.split(',')) {
      const i = pair.indexOf(':');
      const user = i < 0 ? '' : pair.slice(0, i).trim();
      const password = i < 0 ? '' : pair.slice(i + 1);
      if (user === '' || password === '') {
        throw new BerthInputError(
          'BERTH_DASHBOARD_USERS must be user:password pairs separated by commas, e.g. "alice:s3cret,bob:hunter2"',
        );
      }
      if (Object.hasOwn(auth.users, user)) throw new BerthInputError(`BERTH_DASHBOARD_USERS names "${user}" twice`);
      auth.users[user] = password;
    }
  }
  if (auth.token !== undefined || auth.users !== undefined) out.auth = auth;
  const readOnly = get('BERTH_DASHBOARD_READ_ONLY');
  if (readOnly !== undefined) out.readOnly = envFlag('BERTH_DASHBOARD_READ_ONLY', readOnly);
  const trustProxy = get('BERTH_DASHBOARD_TRUST_PROXY');
  if (trustProxy !== undefined) out.authLimits = { trustProxy: envFlag('BERTH_DASHBOARD_TRUST_PROXY', trustProxy) };
  return out;
}
