/**
 * One attempt of one task: the ready entry (its ring segment, lane and place in the lane), and
 * the range lease that covers it (`leaseFrom`: the range's first entry, its key with `laneId` and
 * the segment; `token`: the range lease's fence).
 */
export interface AttemptRef {
  segment: number;
  laneId: number;
  laneSeq: string;
  leaseFrom: string;
  token: string;
}

/** A lease's key in the maps that carry per-lease results back to their callers. */
export function entryKey(ref: Pick<AttemptRef, 'laneId' | 'laneSeq'>): string {
  return `${ref.laneId}:${ref.laneSeq}`;
}

/**
 * The entries `seqs` (lane_seq values as decimal strings) as an int8multirange literal: runs of
 * consecutive entries collapse into one range, so a flush of a whole claimed batch is one range
 * (`{[101,201)}`) however long.
 */
export function seqsToMultirange(seqs: readonly string[], sorted = false): string {
  // Numbers while every seq is exact as one (below 2^53: 15 digits always are; a lane would need
  // a thousand years at a million appends a second to pass it), BigInts past that. BigInt
  // parsing and comparing was 1.4 % of a drain's busy samples (docs/benchmarks-journal.md).
  // Loops, not every() and map(): an array map() returns has the element kind of the tier that
  // ran it, and code compiled for one is thrown away at the other (groupValues in complete.ts).
  let exact = true;
  for (const v of seqs) if (v.length > 15) exact = false;
  if (exact) {
    const xs = new Array<number>(seqs.length);
    for (let i = 0; i < seqs.length; i++) xs[i] = Number(seqs[i]);
    return rangesOf(sorted ? xs : xs.sort((a, b) => a - b), 1);
  }
  const xs = seqs.map(BigInt);
  return rangesOf(sorted ? xs : xs.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)), 1n);
}

/** Sorted values as a multirange literal: runs of consecutive values collapse into one range. */
function rangesOf<T extends number | bigint>(sorted: readonly T[], one: T): string {
  const parts: string[] = [];
  let start: T | null = null;
  let prev: T | null = null;
  const next = (v: T) => ((v as number) + (one as number)) as T;
  for (const v of sorted) {
    if (start !== null && prev !== null && v === next(prev)) {
      prev = v;
      continue;
    }
    if (start !== null && prev !== null) parts.push(`[${start},${next(prev)})`);
    start = v;
    prev = v;
  }
  if (start !== null && prev !== null) parts.push(`[${start},${next(prev)})`);
  return `{${parts.join(',')}}`;
}
