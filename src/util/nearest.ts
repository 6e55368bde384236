/**
 * The known name closest to a misspelt one, for "did you mean" hints on unknown option keys.
 * Edit distance (Levenshtein, with a swap of two neighbours counted as one edit: `maxAttemps`,
 * `dealy`), compared case-insensitively. A candidate counts only when it is close for its
 * length (at most a third of the longer name, and at least 2 edits allowed), or when one name
 * starts the other (`leaseMargin` → `leaseMarginMs`), so an unrelated key gets no guess.
 * Runs only on the error path.
 */
export function nearest(name: string, known: Iterable<string>): string | undefined {
  const lower = name.toLowerCase();
  let best: string | undefined;
  let bestDistance = Number.POSITIVE_INFINITY;
  for (const candidate of known) {
    const c = candidate.toLowerCase();
    const d = editDistance(lower, c);
    const allowed = Math.max(2, Math.floor(Math.max(lower.length, c.length) / 3));
    const prefix = lower.length >= 3 && (c.startsWith(lower) || lower.startsWith(c));
    if ((d <= allowed || prefix) && d < bestDistance) {
      best = candidate;
      bestDistance = d;
    }
  }
  return best;
}

/** Optimal string alignment distance: insert, delete, substitute, or swap two neighbours. */
export function editDistance(a: string, b: string): number {
  const rows = a.length + 1;
  const cols = b.length + 1;
  const d: number[] = new Array(rows * cols).fill(0);
  for (let i = 0; i < rows; i++) d[i * cols] = i;
  for (let j = 0; j < cols; j++) d[j] = j;
  for (let i = 1; i < rows; i++) {
    for (let j = 1; j < cols; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let v = Math.min(d[(i - 1) * cols + j]! + 1, d[i * cols + j - 1]! + 1, d[(i - 1) * cols + j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) {
        v = Math.min(v, d[(i - 2) * cols + j - 2]! + 1);
      }
      d[i * cols + j] = v;
    }
  }
  return d[rows * cols - 1]!;
}

/** `; did you mean "x"?` for the nearest known name, or nothing when none is close. */
export function didYouMean(name: string, known: Iterable<string>): string {
  const guess = nearest(name, known);
  return guess === undefined ? '' : `; did you mean "${guess}"?`;
}
