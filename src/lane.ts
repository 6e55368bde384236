/**
 * A lane is `(queue, priority, shard)`: the unit of order and of the claim's row lock. Every
 * module that names a lane uses this type, and every module that keys a map or a set by lane
 * uses `laneKey`, so two spellings of one lane can never miss each other (the dashboard matches
 * the leader's reported waiters and contention against lane stats by this key).
 */
export interface Lane {
  readonly queue: string;
  readonly priority: number;
  readonly shard: number;
}

/**
 * A string that names one lane, for Map and Set keys. NUL separates the parts because no
 * queue name can hold one (PostgreSQL text cannot store it; `src/limits.ts` refuses it), so no
 * two lanes share a key.
 */
export function laneKey(lane: Lane): string {
  return `${lane.queue}\u0000${lane.priority}\u0000${lane.shard}`;
}

/**
 * How a lane is shown to a person (log fields, CLI lines): `queue/priority/shard`. A queue name
 * may itself contain `/`, so this is for reading only, never a key.
 */
export function laneLabel(lane: Lane): string {
  return `${lane.queue}/${lane.priority}/${lane.shard}`;
}
