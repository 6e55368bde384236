/**
 * What counts as a live worker: the one rule the heartbeat writes by and every reader of the
 * `workers` table (`berth stats`, the dashboard, the leader's `berth_workers` gauge, retention,
 * the stuck-handler protection's staleness) reads by.
 */

/** How often a worker writes its heartbeat row and its outcome counts (default 10 s). */
export const DEFAULT_HEARTBEAT_MS = 10_000;

/**
 * A worker whose heartbeat is older than this many intervals is shown as gone and its row is
 * removed by the leader's retention branch.
 */
export const STALE_HEARTBEATS = 3;

/**
 * A heartbeat is stamped with the database's `now()` (at its transaction's start), so a row dated
 * later than this past the database's clock was not written by a heartbeat: it is shown as
 * invalid, never as alive or leading, and retention removes it.
 */
export const HEARTBEAT_FUTURE_ALLOWANCE_MS = 60_000;

/**
 * The live-worker predicate over the `workers` row aliased `w`: a heartbeat within
 * STALE_HEARTBEATS intervals, and not dated in the future. `staleMs` and `futureMs` name the
 * statement's bind parameters (e.g. `$1`, `$2`) that carry `liveWorkerParams()`.
 */
export function liveWorker(w: string, staleMs: string, futureMs: string): string {
  return `${w}.last_seen_at > now() - make_interval(secs => ${staleMs} / 1000.0) AND ${w}.last_seen_at <= now() + make_interval(secs => ${futureMs} / 1000.0)`;
}

/** The values of liveWorker's two parameters, for workers beating every `heartbeatMs`. */
export function liveWorkerParams(heartbeatMs = DEFAULT_HEARTBEAT_MS): [staleMs: number, futureMs: number] {
  return [heartbeatMs * STALE_HEARTBEATS, HEARTBEAT_FUTURE_ALLOWANCE_MS];
}
