import type { ClaimParams } from '../src/processor/claim.js';
import { wakeChannel } from '../src/sql.js';
import { storageFor } from '../src/storage/storage.js';

/**
 * The parameters of a claim (ClaimParams) as tests and benchmarks write them: the one place that
 * spells the whole object out, so a change to ClaimParams changes only this. The defaults are
 * the ones most tests claim with: no per-type ceilings or attempt limits, a 60 s default ceiling,
 * 20 attempts, no lease margin, worker 'test', the schema's own wake channel. Whatever a caller
 * sets in `extra` (a field's value, `window`, `perLane`, ...) replaces the default.
 */
export function claimParams(
  schema: string,
  laneIds: readonly number[],
  limit: number,
  extra: Partial<ClaimParams> = {},
): ClaimParams {
  return {
    storage: storageFor(schema),
    laneIds,
    limit,
    ceilings: new Map(),
    maxAttempts: new Map(),
    defaultMaxAttempts: 20,
    defaultCeilingMs: 60_000,
    marginMs: 0,
    workerId: 'test',
    wakeChannel: wakeChannel(schema),
    ...extra,
  };
}
