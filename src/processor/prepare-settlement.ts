import { randomUUID } from 'node:crypto';
import type { Queryable } from '../sql.js';
import { completeLeases } from '../storage/complete.js';
import { readCurrentSegment } from '../storage/ring-window.js';
import type { Storage } from '../storage/storage.js';

/**
 * Plan the completion on the settlement session before the first task ends: a completion of a
 * lease that does not exist (no lane has id -1, and the token is new), in the ring's current
 * segment, whose statement is named per segment. The fence finds no lease, so nothing is
 * written; the session has planned the completion (and its rare-path remainder) and loaded the
 * segment's catalog entries. A new process's first completion took 15-35 ms of server time for
 * that (parse and bind, beside the leader's first runs on the 2-core development machine), and
 * its first pickups competed with it for the CPU. Never rejects: a database fault here is the
 * first flush's to meet.
 */
export async function prepareSettlement(db: Queryable, storage: Storage): Promise<void> {
  try {
    const segment = await readCurrentSegment(db, storage);
    await completeLeases(db, storage, [{ segment, laneId: -1, laneSeq: '1', leaseFrom: '1', token: randomUUID() }]);
  } catch {
    // The first flush retries and reports.
  }
}
