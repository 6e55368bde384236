import { orNotMigrated } from '../errors.js';
import type { Queryable } from '../sql.js';
import { dependencyUsage, type DependencyUsageRow } from '../storage/deps.js';
import { storageFor } from '../storage/storage.js';

export type { DependencyUsageRow } from '../storage/deps.js';

/**
 * Per queue, the tasks waiting on the tasks they depend on (`waiting`) and, of those, the ones
 * blocked by a dead parent (`blocked`: retry the parent, or cancel them); queues with none are
 * left out. What `berth stats`, the dashboard's overview and the gauges `berth_tasks_waiting`
 * and `berth_tasks_blocked` show. One statement over the waiting tasks (their counters), a probe
 * of their unfinished parents each for `blocked`: its cost follows the waiting tasks, not the queue.
 */
export async function dependencyStats(db: Queryable, schema: string): Promise<DependencyUsageRow[]> {
  return orNotMigrated(schema, () => dependencyUsage(db, storageFor(schema)));
}
