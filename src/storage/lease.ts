/**
 * Identifies one lease of one task (one attempt): the ready entry, and the range lease that
 * covers it (`leaseFrom`: the range's first entry, its key with `laneId` and `slot`).
 */
export interface LeaseRef {
  slot: number;
  laneId: number;
  laneSeq: string;
  leaseFrom: string;
  token: string;
}

/** A lease's key in the maps that carry per-lease results back to their callers. */
export function leaseKey(ref: Pick<LeaseRef, 'laneId' | 'laneSeq'>): string {
  return `${ref.laneId}:${ref.laneSeq}`;
}

/**
 * The entries `seqs` (lane_seq values as decimal strings) as an int8multirange literal: runs of
 * consecutive entries collapse into one range, so a flush of a whole claimed batch is one range
 * (`{[101,201)}`) however long.
 */
export function seqsToMultirange(seqs: readonly string[]): string {
  const sorted = seqs.map(BigInt).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const parts: string[] = [];
  let start: bigint | null = null;
  let prev: bigint | null = null;
  for (const v of sorted) {
    if (start !== null && prev !== null && v === prev + 1n) {
      prev = v;
      continue;
    }
    if (start !== null && prev !== null) parts.push(`[${start},${prev + 1n})`);
    start = v;
    prev = v;
  }
  if (start !== null && prev !== null) parts.push(`[${start},${prev + 1n})`);
  return `{${parts.join(',')}}`;
}
