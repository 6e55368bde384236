/** Test deadlines, scaled for a loaded machine; no node:test import, so fixtures (child processes) use it too. */
/**
 * Every deadline a test waits on is a liveness bound, never a timing assertion, so it is sized
 * for a loaded machine: multiplied by BERTH_TEST_TIMEOUT_SCALE (default 3; a condition that
 * holds returns at once, so only a failing wait takes longer). Measured: the pinned-horizon run
 * takes 12-28 s alone and over 120 s at a load average of 12 on 2 cores.
 */
export const TIMEOUT_SCALE = timeoutScale(process.env.BERTH_TEST_TIMEOUT_SCALE);

function timeoutScale(raw: string | undefined): number {
  if (raw === undefined || raw === '') return 3;
  const n = Number(raw);
  if (!(n > 0)) throw new Error(`BERTH_TEST_TIMEOUT_SCALE must be a positive number, got "${raw}"`);
  return n;
}

/** A test deadline in ms, scaled for a loaded machine (see TIMEOUT_SCALE). */
export function scaled(ms: number): number {
  return ms * TIMEOUT_SCALE;
}
