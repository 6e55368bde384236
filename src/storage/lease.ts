/** Identifies one lease (one attempt): the ready entry it leases. */
export interface LeaseRef {
  slot: number;
  laneId: number;
  laneSeq: string;
  token: string;
}

/** A lease's key in the maps that carry per-lease results back to their callers. */
export function leaseKey(ref: Pick<LeaseRef, 'laneId' | 'laneSeq'>): string {
  return `${ref.laneId}:${ref.laneSeq}`;
}
