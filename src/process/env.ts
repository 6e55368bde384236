import { dashboardOptionsFromEnv, type DashboardEnvOptions } from '../dashboard/options.js';
import { BerthInputError } from '../errors.js';
import { createLogger, logLevel } from '../logger.js';
import type { WorkerOptions } from './worker-options.js';

/**
 * The one module of the library that reads the environment. Everything else takes its settings
 * as options, resolved once by the component (`new Worker`, `startDashboard`, ...); the CLI and
 * code that wants twelve-factor settings call `fromEnv()` or `workerOptionsFromEnv()` here.
 * Every variable is listed in docs/configuration.md. The one other reader is the connection
 * layer (src/db/connections.ts), for libpq's PGCONNECT_TIMEOUT, as pg itself reads PGHOST & co.
 */

/** An environment: `process.env`, or a record of your own (tests, config files). */
export type Environment = Readonly<Record<string, string | undefined>>;

/** Every setting berth reads from the environment. Unset and empty variables are left out. */
export interface BerthEnvironment {
  /** DATABASE_URL: the primary (`connectionString`, `--database-url`). */
  databaseUrl?: string;
  /** BERTH_SCHEMA (`schema`, `--schema`). */
  schema?: string;
  /** BERTH_LOG_LEVEL: trace, debug, info, warn, error, fatal or silent. */
  logLevel?: string;
  /** BERTH_ACTOR: who a CLI action is recorded as. */
  actor?: string;
  /** BERTH_TASK_PROCESSOR_CONCURRENCY: worker slots, 1–1000. */
  slots?: number;
  /** BERTH_DASHBOARD_*: see `dashboardOptionsFromEnv`. */
  dashboard: DashboardEnvOptions;
}

function get(env: Environment, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v.trim() === '' ? undefined : v.trim();
}

/** BERTH_TASK_PROCESSOR_CONCURRENCY, checked; undefined when unset. */
export function slotsFromEnv(value: string | undefined): number | undefined {
  if (value === undefined || value === '') return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > 1000) {
    throw new BerthInputError(`BERTH_TASK_PROCESSOR_CONCURRENCY must be an integer from 1 to 1000, got "${value}"`);
  }
  return n;
}

/**
 * Every berth setting in the environment (default `process.env`), each checked: a bad value is a
 * BerthInputError naming the variable.
 */
export function fromEnv(env: Environment = process.env): BerthEnvironment {
  const out: BerthEnvironment = { dashboard: dashboardOptionsFromEnv(env) };
  const databaseUrl = get(env, 'DATABASE_URL');
  if (databaseUrl !== undefined) out.databaseUrl = databaseUrl;
  const schema = get(env, 'BERTH_SCHEMA');
  if (schema !== undefined) out.schema = schema;
  const level = get(env, 'BERTH_LOG_LEVEL');
  if (level !== undefined) out.logLevel = logLevel(level);
  const actor = get(env, 'BERTH_ACTOR');
  if (actor !== undefined) out.actor = actor;
  const slots = slotsFromEnv(get(env, 'BERTH_TASK_PROCESSOR_CONCURRENCY'));
  if (slots !== undefined) out.slots = slots;
  return out;
}

/** The worker options the environment sets: `new Worker({ connectionString, tasks, ...workerOptionsFromEnv() })`. */
export type WorkerEnvOptions = Pick<WorkerOptions, 'slots' | 'logger'>;

/**
 * Worker options from the environment (default `process.env`): `slots` from
 * BERTH_TASK_PROCESSOR_CONCURRENCY and a `logger` at BERTH_LOG_LEVEL, each only when set.
 */
export function workerOptionsFromEnv(env: Environment = process.env): WorkerEnvOptions {
  const e = fromEnv(env);
  const out: WorkerEnvOptions = {};
  if (e.slots !== undefined) out.slots = e.slots;
  if (e.logLevel !== undefined) out.logger = createLogger({}, undefined, e.logLevel);
  return out;
}
