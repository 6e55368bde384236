import type pg from 'pg';
import { cronOf, checkScheduleAsync, intervalMsOf, type ScheduleDefinition } from '../schedule.js';
import type { Logger } from '../logger.js';
import { notMigrated } from '../errors.js';
import type { AnyTaskDefinition } from '../task.js';
import { storageFor } from '../storage/storage.js';
import { upsertSchedules } from '../storage/schedules.js';

/**
 * A worker's schedules written to the database at start (and by `runDueTasks`): each payload
 * checked by an asynchronous schema first (a synchronous one was checked at construction), then
 * one upsert. A declaration that changed what a schedule fires is logged: two fleets declaring
 * the same name differently would otherwise overwrite each other unseen.
 */
export async function declareSchedules(
  pool: pg.Pool,
  schema: string,
  schedules: readonly ScheduleDefinition[],
  defs: ReadonlyMap<string, AnyTaskDefinition>,
  workerId: string,
  logger: Logger,
): Promise<void> {
  if (schedules.length === 0) return;
  for (const d of schedules) {
    const def = defs.get(d.taskType);
    if (def) await checkScheduleAsync(d, def);
  }
  const intervals = schedules.map((d) => intervalMsOf(cronOf(d.cron, d.timeZone, `schedule "${d.name}"`)));
  let results: Awaited<ReturnType<typeof upsertSchedules>>;
  try {
    results = await upsertSchedules(pool, storageFor(schema), schedules, intervals, workerId);
  } catch (err) {
    throw notMigrated(err, schema);
  }
  const created = results.filter((r) => r.created).map((r) => r.name);
  const changed = results.filter((r) => r.changed).map((r) => r.name);
  if (created.length > 0) logger.info({ schedules: created }, 'schedules declared for the first time');
  if (changed.length > 0)
    logger.warn(
      { schedules: changed },
      'schedules declared with a different expression, task or options than the database held: this worker’s declaration now stands',
    );
}
