import { didYouMean } from '../util/nearest.js';
import { BerthInputError } from '../errors.js';

/**
 * How hard failed authentications are slowed (`DashboardOptions.authLimits`). Counted per
 * client address (every method), per user name (Basic) and for the token as a whole (bearer and
 * the login form, from every address together): each key gets `…FreeFailures` at full speed,
 * then waits `backoffMs`, doubling per further failure up to `maxBackoffMs`, and after
 * `…LockoutFailures` is locked out for `lockoutMs`. While a key waits, attempts are answered
 * 429 with Retry-After and never reach the secret comparison. docs/operations.md#security.
 */
export interface AuthLimitOptions {
  /** Failures one client address may make at full speed. */
  clientFreeFailures?: number;
  /** Failures after which a client address is locked out for `lockoutMs`. */
  clientLockoutFailures?: number;
  /** Failures one user name, or the token, may take (from all addresses) at full speed. */
  sharedFreeFailures?: number;
  /** Failures after which a user name, or the token, is locked out for addresses it does not trust. */
  sharedLockoutFailures?: number;
  /** The wait after the first failure past the free ones; it doubles with each further failure. */
  backoffMs?: number;
  maxBackoffMs?: number;
  lockoutMs?: number;
  /** A key's failures are forgotten this long after its last one (and once its lockout is over). */
  forgetAfterMs?: number;
  /** Keys tracked at once, per kind; past it the one that failed longest ago is forgotten. */
  maxTrackedKeys?: number;
  /**
   * An address that authenticated as a user (or with the token) is exempt from that user's (the
   * token's) shared lockout for this long: someone else's guessing cannot lock it out.
   */
  trustedClientMs?: number;
  /** Failure log lines per method per minute; the rest are counted in one summary line. */
  logLinesPerMinute?: number;
  /**
   * Take the client address from the last X-Forwarded-For entry (the one the proxy in front
   * added). Only behind a proxy that sets it: otherwise any client can pick its own address.
   */
  trustProxy?: boolean;
}

export type AuthLimits = Required<AuthLimitOptions>;

const MINUTE = 60_000;

/** The defaults (documented in docs/configuration.md and docs/operations.md#security). */
export const AUTH_LIMIT_DEFAULTS: Readonly<AuthLimits> = Object.freeze({
  clientFreeFailures: 5,
  clientLockoutFailures: 20,
  sharedFreeFailures: 10,
  sharedLockoutFailures: 100,
  backoffMs: 1000,
  maxBackoffMs: MINUTE,
  lockoutMs: 15 * MINUTE,
  forgetAfterMs: 15 * MINUTE,
  maxTrackedKeys: 10_000,
  trustedClientMs: 24 * 60 * MINUTE,
  logLinesPerMinute: 10,
  trustProxy: false,
});

/** Defaults filled in, every value checked; an unknown key or a bad value is a BerthInputError naming it. */
export function validateAuthLimits(options: AuthLimitOptions | undefined): AuthLimits {
  if (options === undefined) return { ...AUTH_LIMIT_DEFAULTS };
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new BerthInputError('dashboard authLimits must be an object (see docs/configuration.md)');
  }
  const given = Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined));
  for (const key of Object.keys(given)) {
    if (!Object.hasOwn(AUTH_LIMIT_DEFAULTS, key))
      throw new BerthInputError(
        `unknown dashboard authLimits option "${key}"${didYouMean(key, Object.keys(AUTH_LIMIT_DEFAULTS))}`,
      );
  }
  const o = { ...AUTH_LIMIT_DEFAULTS, ...given } as AuthLimits;
  for (const [key, value] of Object.entries(o)) {
    if (key === 'trustProxy') {
      if (typeof value !== 'boolean')
        throw new BerthInputError(
          `dashboard authLimits.trustProxy must be true or false, got ${JSON.stringify(value)}`,
        );
      continue;
    }
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) {
      throw new BerthInputError(`dashboard authLimits.${key} must be a positive integer, got ${JSON.stringify(value)}`);
    }
  }
  if (o.clientLockoutFailures < o.clientFreeFailures)
    throw new BerthInputError('dashboard authLimits.clientLockoutFailures must be at least clientFreeFailures');
  if (o.sharedLockoutFailures < o.sharedFreeFailures)
    throw new BerthInputError('dashboard authLimits.sharedLockoutFailures must be at least sharedFreeFailures');
  if (o.maxBackoffMs < o.backoffMs)
    throw new BerthInputError('dashboard authLimits.maxBackoffMs must be at least backoffMs');
  return o;
}
