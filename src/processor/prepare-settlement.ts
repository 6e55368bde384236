import { randomUUID } from 'node:crypto';
import type { Queryable } from '../sql.js';
import { completeLeases } from '../storage/complete.js';
import { readCurrentSegment } from '../storage/ring-window.js';
import type { Storage } from '../storage/storage.js';
import { type ClaimedTask, type LeaseRow, STAND_IN_TERMS, standInLease, tasksOf } from './claim-shared.js';

/**
 * Plan the completion on the settlement session before the first task ends: a completion of a
 * lease that does not exist (no lane has id -1, under a token of this process's own), in the
 * ring's current segment, whose statement is named per segment. The fence finds no lease, so
 * nothing is written; the session has planned the completion (and its rare-path remainder) and
 * loaded the segment's catalog entries. A new process's first completion took 15-35 ms of server
 * time for that (parse and bind, beside the leader's first runs on the 2-core development
 * machine), and its first pickups competed with it for the CPU. Never rejects: a database fault
 * here is the first flush's to meet.
 */
export async function prepareSettlement(db: Queryable, storage: Storage): Promise<void> {
  try {
    const segment = await readCurrentSegment(db, storage);
    await completeLeases(db, storage, [probeTask(segment)]);
  } catch {
    // The first flush retries and reports.
  }
}

/**
 * The probe's lease, as the claim's rows are read (LeaseRow): on a lane no lease has (-1), under
 * a token of this process's own. One object for the process, its segment set per call: a row
 * made per call was a shape that died with each worker, and the claim's code that reads rows
 * (`tasksOf`) was thrown away with it at the next full collection.
 */
const PROBE_LEASE: LeaseRow = standInLease(-1, randomUUID());

/**
 * The probe's lease as a claimed task, made as the claim makes one (`tasksOf`), not as an object
 * literal of its own: the completion's code then sees one shape of task, and no shape that lives
 * only as long as a worker. A literal ref here (five fields) made the completion's code handle two
 * shapes, and its shape died with each worker at the next full collection, which threw that code
 * away for the next worker to compile again (docs/benchmarks-journal.md, "Issue 35's fifteenth
 * round"). Exported for the shape test.
 */
export function probeTask(segment: number): ClaimedTask {
  PROBE_LEASE.slot = segment;
  return tasksOf([PROBE_LEASE], STAND_IN_TERMS)[0]!;
}
