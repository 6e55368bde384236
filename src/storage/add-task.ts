import type { Schema } from '../sql.js';
import { positional } from '../statement.js';

/**
 * One call of `add_task()` (migration 23), the documented SQL door to enqueue, for executors
 * berth does not know (`enqueueSql`). Every argument is named and cast, so a driver that binds a
 * string as text (Prisma, postgres.js) still resolves the function, and a NULL is the
 * parameter's default; the delay travels in milliseconds, as the client's option. Not prepared:
 * the executor is someone else's.
 */
export function addTaskStatement({ q: s }: Schema) {
  return positional(
    `SELECT ${s}.add_task(type => $1::text, payload => $2::jsonb, queue => $3::text, run_at => $4::timestamptz,
       priority => $5::integer, dedupe_key => $6::text, max_attempts => $7::integer,
       delay => $8::float8 * interval '1 millisecond', shard => $9::integer, shards => $10::integer) AS id`,
    ['type', 'payload', 'queue', 'runAt', 'priority', 'dedupeKey', 'maxAttempts', 'delayMs', 'shard', 'shards'],
  );
}
