import type pg from 'pg';
import { BerthInputError } from '../errors.js';
import { checkKeys } from '../limits.js';
import type { Logger } from '../logger.js';
import { createPool, resolveDatabase } from './connections.js';

/**
 * A pg.Pool made by berth's connection layer, for an application's producers and its own
 * queries: a libpq-style host list with `target_session_attrs` follows a promotion (pg's own Pool
 * connects to one host only), every connect has the connect timeout, and an idle connection's
 * error is logged instead of crashing the process.
 */
export interface OpenPoolOptions {
  /** `postgres://…`, one host or a list: `postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`. */
  connectionString: string;
  /** Connections at most (pg's `max`); default 10. */
  max?: number;
  /** How long one connect may take (each host of a list); default the URL's connect_timeout, PGCONNECT_TIMEOUT, else 10 s. */
  connectTimeoutMs?: number;
  /** `application_name` of its sessions. */
  applicationName?: string;
  /** Where a lost idle connection is reported (warn); default nowhere. */
  logger?: Logger;
}

const KEYS = new Set(['connectionString', 'max', 'connectTimeoutMs', 'applicationName', 'logger']);

export function openPool(options: OpenPoolOptions): pg.Pool {
  if (typeof options !== 'object' || options === null) throw new BerthInputError('openPool needs an options object');
  checkKeys(options, KEYS, 'openPool');
  const target = resolveDatabase(options.connectionString, { connectTimeoutMs: options.connectTimeoutMs });
  const max = options.max ?? 10;
  if (!Number.isInteger(max) || max < 1)
    throw new BerthInputError(`max must be a whole number >= 1, got ${JSON.stringify(max)}`);
  const name = options.applicationName;
  if (name !== undefined && typeof name !== 'string')
    throw new BerthInputError(`applicationName must be a string, got ${typeof name}`);
  return createPool(
    target,
    { max, ...(name === undefined ? {} : { application_name: name }) },
    options.logger ?? null,
    'pool',
  );
}
