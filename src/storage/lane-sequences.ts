import type { Queryable } from '../sql.js';
import { positional } from '../statement.js';
import { storageFor } from './storage.js';

/**
 * Lane sequences (`lane_seq_<lane_id>`) give each lane its order. berth creates them through
 * SECURITY DEFINER functions, so they belong to the role those functions run as and need no
 * grant. A sequence can still end up wrong: created by hand or by an older install, handed to
 * another role by a restore or an ALTER, or dropped. A wrongly owned one breaks appends to its
 * lane (the definer may not use it); a missing one fails them outright.
 */

export type LaneSequenceProblemKind = 'missing' | 'wrong_owner';

/** One row of the `lane_sequence_problems` view. */
export interface LaneSequenceProblem {
  laneId: number;
  /** Unqualified name, e.g. `lane_seq_12`. */
  sequence: string;
  problem: LaneSequenceProblemKind;
  /** null when the sequence is missing. */
  currentOwner: string | null;
  /** The role berth's definer functions run as; the sequence must belong to it. */
  expectedOwner: string;
  /** Login roles that can run `statement` successfully (superusers included). */
  repairRoles: string[];
  /** What to run, as one of `repairRoles`, outside a transaction. */
  statement: string;
}

/** What `repair_lane_sequence` did to one sequence that was not refused or busy. */
export type LaneSequenceFix = 'reassigned' | 'created' | 'ok';

export interface LaneSequenceRepairReport {
  /** Fixed by this run (`ok`: someone else fixed it first). */
  repaired: (LaneSequenceProblem & { result: LaneSequenceFix })[];
  /**
   * Someone held a lock on the sequence (or the lane) for longer than 300 ms: an open producer
   * transaction that appended to the lane, usually. Nothing changed; run the repair again.
   */
  busy: LaneSequenceProblem[];
  /** The repairing role lacks the rights; one of `repairRoles` must run `statement`. */
  notPermitted: LaneSequenceProblem[];
  /** Anything else (the lane vanished, an unexpected error); the problem stays. */
  failed: (LaneSequenceProblem & { error: string })[];
}

const UNDEFINED_TABLE = '42P01';
const INSUFFICIENT_PRIVILEGE = '42501';
const LOCK_NOT_AVAILABLE = '55P03';

function errorCode(err: unknown): string | undefined {
  return (err as { code?: string } | null)?.code;
}

/** Every lane sequence that is missing or wrongly owned, in lane order. */
export async function listLaneSequenceProblems(db: Queryable, schema: string): Promise<LaneSequenceProblem[]> {
  const statement = storageFor(schema).statement('lane-sequence-problems', ({ q: s }) =>
    positional(
      `SELECT lane_id, sequence_name, problem, current_owner, expected_owner, repair_roles, repair_statement
         FROM ${s}.lane_sequence_problems ORDER BY lane_id`,
      [],
    ),
  );
  try {
    const res = await db.query<{
      lane_id: number;
      sequence_name: string;
      problem: LaneSequenceProblemKind;
      current_owner: string | null;
      expected_owner: string;
      repair_roles: string[];
      repair_statement: string;
    }>(statement.query({}));
    return res.rows.map((r) => ({
      laneId: r.lane_id,
      sequence: r.sequence_name,
      problem: r.problem,
      currentOwner: r.current_owner,
      expectedOwner: r.expected_owner,
      repairRoles: r.repair_roles,
      statement: r.repair_statement,
    }));
  } catch (err) {
    if (errorCode(err) === UNDEFINED_TABLE) {
      throw new Error(`schema "${schema}" has no lane_sequence_problems view: migrate it first (berth migrate)`, {
        cause: err,
      });
    }
    throw err;
  }
}

/**
 * Repair every listed problem, one sequence per statement. `db` must not be inside a
 * transaction (a pool or an idle client): each repair commits on its own, because ALTER ...
 * OWNER holds ACCESS EXCLUSIVE on the sequence until commit and every append to that lane
 * waits behind it. Each repair waits at most 300 ms for its locks and reports the sequence
 * busy rather than stalling producers. Runs with the caller's rights.
 */
export async function repairLaneSequences(db: Queryable, schema: string): Promise<LaneSequenceRepairReport> {
  const repair = storageFor(schema).statement('repair-lane-sequence', ({ q: s }) =>
    positional(`SELECT ${s}.repair_lane_sequence($1) AS result`, ['laneId']),
  );
  const report: LaneSequenceRepairReport = { repaired: [], busy: [], notPermitted: [], failed: [] };
  for (const problem of await listLaneSequenceProblems(db, schema)) {
    let result: string;
    try {
      const res = await db.query<{ result: string }>(repair.query({ laneId: problem.laneId }));
      result = res.rows[0]!.result;
    } catch (err) {
      const code = errorCode(err);
      // No EXECUTE on the repair function, or a lock the function's own handlers did not cover.
      if (code === INSUFFICIENT_PRIVILEGE) report.notPermitted.push(problem);
      else if (code === LOCK_NOT_AVAILABLE) report.busy.push(problem);
      else report.failed.push({ ...problem, error: (err as Error).message });
      continue;
    }
    if (result === 'reassigned' || result === 'created' || result === 'ok')
      report.repaired.push({ ...problem, result });
    else if (result === 'busy') report.busy.push(problem);
    else if (result === 'not_permitted') report.notPermitted.push(problem);
    else report.failed.push({ ...problem, error: `repair_lane_sequence returned ${result}` });
  }
  return report;
}
