import type { BerthMetrics } from '../metrics.js';
import type { Queryable } from '../sql.js';
import { claim, discover, LANE_SHARE, type ClaimedTask } from './claim.js';
import type { TaskRegistry } from './engine-options.js';

export interface FetcherDeps {
  write: Queryable;
  read: Queryable;
  metrics: BerthMetrics;
  schema: string;
  tasks: TaskRegistry;
  defaultCeilingMs: number;
  marginMs: number;
  workerId: string;
  wakeChannel: string;
  queues: readonly string[] | null;
  /** Asks the fetch loop for another pass at once (a known-lane claim came back short). */
  wakeAgain: () => void;
}

/**
 * One fetch: claim on the lanes this process already knows (its hot lanes, lanes named by wake
 * notifications) and, when that finds nothing, discovery on the read pool and a claim of this
 * worker's share of the lanes it returns.
 */
export class Fetcher {
  /** Lanes the last claim filled every slot from: tried first next time, skipping discovery. */
  private hotLanes: number[] = [];
  /** Lanes named by wake notifications since the last fetch: also tried before discovery. */
  private readonly notifiedLanes = new Set<number>();

  constructor(private readonly deps: FetcherDeps) {}

  /** A wake notification's payload: producers and promotion name the lane they appended to. */
  noteLane(payload: string): void {
    const lane = Number(payload);
    if (payload !== '' && Number.isInteger(lane) && lane > 0 && this.notifiedLanes.size < 64)
      this.notifiedLanes.add(lane);
  }

  async fetch(want: number): Promise<ClaimedTask[]> {
    const d = this.deps;
    const started = performance.now();
    const params = {
      schema: d.schema,
      ceilings: d.tasks.ceilings,
      maxAttempts: d.tasks.maxAttempts,
      defaultMaxAttempts: d.tasks.defaultMaxAttempts,
      defaultCeilingMs: d.defaultCeilingMs,
      marginMs: d.marginMs,
      workerId: d.workerId,
      wakeChannel: d.wakeChannel,
      queues: d.queues,
    };
    let got: ClaimedTask[] = [];
    const known = [...new Set([...this.hotLanes, ...this.notifiedLanes])];
    this.notifiedLanes.clear();
    if (known.length > 0) {
      got = await claim(d.write, { ...params, laneIds: known, limit: want });
      if (got.length > 0 && got.length < want) {
        // Start these now; discovery for the rest runs on the next pass of the loop.
        d.wakeAgain();
      }
    }
    if (got.length === 0) {
      const candidates = await discover(d.read, d.schema, d.queues, 20, 1);
      const lanes = [...new Set(candidates.map((c) => c.laneId))];
      if (lanes.length > 0) {
        // Every worker's discovery returns the same lanes, so each locks only its share of them
        // (in discovery's priority order): concurrent workers spread instead of all but one
        // finding every lane locked. Known lanes (its own hot lanes, notified ones) are all tried.
        const maxLanes = Math.ceil((want - got.length) / LANE_SHARE);
        got = got.concat(await claim(d.write, { ...params, laneIds: lanes, limit: want - got.length, maxLanes }));
      }
    }
    this.hotLanes = got.length === want ? [...new Set(got.map((t) => t.laneId))] : [];
    d.metrics.claimSeconds.observe((performance.now() - started) / 1000);
    d.metrics.claims.inc({ result: got.length > 0 ? 'hit' : 'empty' });
    d.metrics.claimedTasks.inc(got.length);
    for (const t of got) d.metrics.taskWaitSeconds.observe({ task_type: t.type }, t.waitedSeconds);
    return got;
  }
}
