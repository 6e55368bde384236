/** Maintenance settings fast enough for tests (no node:test import, so worker fixtures can use it too). */
export const FAST_MAINTENANCE = {
  leaderPollMs: 100,
  promoteIntervalMs: 50,
  rescueIntervalMs: 100,
  ringIntervalMs: 100,
  ringRotateAfterMs: 200,
  ringRotateSmallAfterMs: 200,
  gaugeIntervalMs: 100,
};
