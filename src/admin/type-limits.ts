import pg from 'pg';
import { BerthInputError, orNotMigrated } from '../errors.js';
import { checkText, MAX_ACTOR_CHARS, MAX_TYPE_CHARS } from '../limits.js';
import type { Logger } from '../logger.js';
import type { Queryable } from '../sql.js';
import { storageFor } from '../storage/storage.js';
import { setTypeLimitRow, type TypeLimitUsage, typeLimitUsage } from '../storage/type-limits.js';
import { audited } from './audit.js';
import { checkRate, type RateLimit } from './limits.js';

export type { TypeLimitUsage } from '../storage/type-limits.js';

/**
 * Limit a task type to `rate.limit` starts per `rate.intervalMs`, across every worker and every
 * queue its tasks are in. A task of the type that would start past the limit is handed back
 * unstarted (its attempt refunded) and comes back when the type's window has room, paced at the
 * limit's rate; tasks of other types in the same queue are not held up. Takes effect on each
 * worker at its next fetch (a notice tells every worker at once). A type needs no task yet: a
 * limit can be set before the type is deployed. Needs the schema owner or an operator role.
 * Returns the limit now in force.
 */
export async function setTypeLimit(
  db: Queryable,
  schema: string,
  type: string,
  rate: RateLimit,
  actor: string,
): Promise<TypeLimitUsage> {
  const name = checkText(type, 'type', 'setTypeLimit', { maxChars: MAX_TYPE_CHARS, nonEmpty: true });
  const who = checkText(actor, 'actor', 'setTypeLimit', { maxChars: MAX_ACTOR_CHARS });
  if (rate === null || rate === undefined)
    throw new BerthInputError(
      'setTypeLimit: rate must be an object { limit, intervalMs } (clearTypeLimit removes a limit)',
    );
  const checked = checkRate(rate, 'setTypeLimit');
  const storage = storageFor(schema);
  await orNotMigrated(schema, () => setTypeLimitRow(db, storage, name, checked, who)).catch((err: unknown) => {
    throw typeLimitBusy(err, name);
  });
  const now = (await typeLimitUsage(db, storage)).find((l) => l.type === name);
  if (!now) throw new Error(`setTypeLimit: the limit of type "${name}" was cleared again before it could be read`);
  return now;
}

/** Remove a task type's rate limit, as `actor`. Returns whether the type had one. */
export async function clearTypeLimit(
  db: Queryable,
  schema: string,
  type: string,
  actor: string,
): Promise<{ cleared: boolean }> {
  const name = checkText(type, 'type', 'clearTypeLimit', { maxChars: MAX_TYPE_CHARS, nonEmpty: true });
  const who = checkText(actor, 'actor', 'clearTypeLimit', { maxChars: MAX_ACTOR_CHARS });
  const had = await orNotMigrated(schema, () => setTypeLimitRow(db, storageFor(schema), name, null, who)).catch(
    (err: unknown) => {
      throw typeLimitBusy(err, name);
    },
  );
  return { cleared: had };
}

/**
 * Every task type rate limit, with the starts in its window, whether it is full now, the starts
 * it refused so far and how many refused tasks are still paced ahead.
 */
export async function listTypeLimits(db: Queryable, schema: string): Promise<TypeLimitUsage[]> {
  return orNotMigrated(schema, () => typeLimitUsage(db, storageFor(schema)));
}

/** setTypeLimit as an operator action, audited (`type.limit`) under `actor`: what the CLI and the dashboard run. */
export function setTypeLimitAudited(
  db: Queryable,
  schema: string,
  logger: Logger | null,
  actor: string,
  type: string,
  rate: RateLimit,
): Promise<TypeLimitUsage> {
  return audited(db, schema, logger, actor, 'type.limit', { type, rate }, () =>
    setTypeLimit(db, schema, type, rate, actor),
  );
}

/** clearTypeLimit as an operator action, audited (`type.unlimit`) under `actor`. */
export function clearTypeLimitAudited(
  db: Queryable,
  schema: string,
  logger: Logger | null,
  actor: string,
  type: string,
): Promise<{ cleared: boolean }> {
  return audited(db, schema, logger, actor, 'type.unlimit', { type }, () => clearTypeLimit(db, schema, type, actor));
}

/** set_type_limit waits at most 2 s for the type's row (a start holds it for one statement). */
function typeLimitBusy(err: unknown, type: string): unknown {
  if (err instanceof pg.DatabaseError && err.code === '55P03')
    return new Error(
      `the rate limit of type "${type}" is held by a session that has not finished for 2 s (a stalled worker session?); nothing changed, try again`,
      { cause: err },
    );
  return err;
}
