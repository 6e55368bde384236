import type { Storage } from '../storage/storage.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import type { Queryable } from '../sql.js';
import { readRingWindow, type RingWindow } from '../storage/ring-window.js';
import { type ClaimBatch, claimBatch, type ClaimParams, discover, LANE_SHARE, type ClaimedTask } from './claim.js';
import type { TaskRegistry } from './engine-options.js';
import type { TypeMetrics } from './type-metrics.js';

export interface FetcherDeps {
  /** The primary: the ring window and the claims (the worker gives the fetcher a session of its own). */
  write: Queryable;
  read: Queryable;
  metrics: BerthMetrics;
  /** The per-type instruments (the task wait histogram), bound once per type. */
  typeMetrics: TypeMetrics;
  storage: Storage;
  tasks: TaskRegistry;
  defaultCeilingMs: number;
  marginMs: number;
  workerId: string;
  wakeChannel: string;
  queues: readonly string[] | null;
  /** Asks the fetch loop for another pass at once (a known-lane claim came back short). */
  wakeAgain: () => void;
}

/** How many lanes discovery returns (one head each). */
const DISCOVERY_LANES = 20;
/** Lanes remembered from notifications between two fetches; past this, discovery finds the rest. */
const MAX_NOTIFIED_LANES = 64;

/**
 * One fetch: claim on the lanes this process already knows (its hot lanes, lanes named by wake
 * notifications) and, when that finds nothing and work may wait where no notification points,
 * discovery on the read pool and a claim of this worker's share of the lanes it returns.
 *
 * Discovery runs only when it is owed: after a wake that names no lane (the poll, start, a
 * retry, a bare NOTIFY: another claimer's re-signal or a LISTEN reconnect), after a full claim
 * (more may wait anywhere), and after a claim that left a lane it was pointed at unexplained
 * (a lane that gave nothing may be held by a claimer whose snapshot predates the entry that
 * named it). A claim that came back short from lanes it locked drained them: anything appended
 * later commits after that claim's snapshot, and every append NOTIFYs its lane on commit, which
 * is noted after this fetch cleared its notified lanes, so the next pass claims it. The one
 * short claim that did not drain its lane is a claim whose snapshot predates a competing
 * claim's commit: the entries the other leased (ON CONFLICT DO NOTHING) count against its
 * limit, and entries behind them can be left. Those were appended after the other claim's
 * snapshot (a short claim takes all it sees), so every listener, that claimer included, notes
 * their NOTIFYs for its next pass. Until issue
 * 11 every short claim and every freed slot ran a discovery: an idle worker picking up one task
 * ran two discoveries per task, and a notification arriving during one waited for it (the pickup
 * p99; docs/benchmarks.md, "Where pickup time goes").
 */
export class Fetcher {
  /** Lanes the last claim filled every slot from: tried first next time, skipping discovery. */
  private hotLanes: number[] = [];
  /** Lanes named by wake notifications since the last fetch: also tried before discovery. */
  private readonly notifiedLanes = new Set<number>();
  /** Work may wait where no known lane points: the next fetch that finds nothing runs discovery. */
  private discoveryOwed = true;
  /**
   * The ring segments claims and discovery read (storage/ring-window.ts); null until read, and
   * again after a claim found it stale or a poll tick (discovery does not check it).
   */
  private window: RingWindow | null = null;

  constructor(private readonly deps: FetcherDeps) {}

  /** A wake notification's payload: producers and promotion name the lane they appended to. */
  noteLane(payload: string): void {
    const lane = Number(payload);
    if (payload === '' || !Number.isInteger(lane) || lane <= 0 || this.notifiedLanes.size >= MAX_NOTIFIED_LANES) {
      // A bare wake names no lane, and a lane past the cap is not remembered: discovery finds them.
      this.discoveryOwed = true;
      return;
    }
    this.notifiedLanes.add(lane);
  }

  /**
   * A wake that names no lane (the poll, start, a retry after an error): the next fetch discovers,
   * and reads the ring window first (a discovery in an outdated window could miss lanes whose
   * entries all sit in newer segments, and nothing else would tell: the poll bounds that).
   */
  oweDiscovery(): void {
    this.discoveryOwed = true;
    this.window = null;
  }

  /**
   * Run the first fetch's reads once, keeping nothing: a new session plans each statement on
   * first use (and loads the catalog entries of the ring partitions it names), and the worker
   * has this done while its LISTEN session connects. The window read here is not kept: the
   * first fetch reads it again after LISTEN is up, so an append the notification would have
   * named is never outside both the window and the LISTEN.
   */
  async prepare(): Promise<void> {
    const d = this.deps;
    const window = await readRingWindow(d.write, d.storage);
    await discover(d.read, d.storage, d.queues, DISCOVERY_LANES, 1, window);
  }

  /** The ring window, read when there is none. */
  private async currentWindow(): Promise<RingWindow> {
    this.window ??= await readRingWindow(this.deps.write, this.deps.storage);
    return this.window;
  }

  /**
   * A claim in the current window; when the ring moved on since it was read (the claim leased
   * nothing and says so), read it again and claim once more. Two rotations between a window's
   * read and the claim after it are not a loop: a second stale answer returns empty, and the
   * fetch loop's next pass reads it anew.
   */
  private async claimInWindow(params: Omit<ClaimParams, 'window'>): Promise<ClaimBatch> {
    const first = await claimBatch(this.deps.write, { ...params, window: await this.currentWindow() });
    if (!first.stale) return first;
    // The candidates may have come from a discovery in the old window: look again after this.
    this.window = null;
    this.discoveryOwed = true;
    const again = await claimBatch(this.deps.write, { ...params, window: await this.currentWindow() });
    if (again.stale) {
      this.window = null;
      this.deps.wakeAgain();
    }
    return again;
  }

  /** Whether a fetch now could find anything: false when the last claim drained all it knew of. */
  get hasLeads(): boolean {
    return this.discoveryOwed || this.hotLanes.length > 0 || this.notifiedLanes.size > 0;
  }

  async fetch(want: number): Promise<ClaimedTask[]> {
    const d = this.deps;
    const started = performance.now();
    const params = {
      storage: d.storage,
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
      const batch = await this.claimInWindow({
        ...params,
        laneIds: known,
        limit: want,
        perLane: Math.ceil(want / known.length),
      });
      got = batch.tasks;
      if (got.length < want && (batch.more || !gaveFromEach(got, known))) this.discoveryOwed = true;
      if (got.length > 0 && got.length < want && this.discoveryOwed) {
        // Start these now; discovery for the rest runs on the next pass of the loop.
        d.wakeAgain();
      }
    }
    if (got.length === 0 && this.discoveryOwed) {
      // Cleared before the read: a bare wake arriving meanwhile owes the next fetch another.
      this.discoveryOwed = false;
      const candidates = await discover(d.read, d.storage, d.queues, DISCOVERY_LANES, 1, await this.currentWindow());
      const lanes = [...new Set(candidates.map((c) => c.laneId))];
      if (lanes.length > 0) {
        // Every worker's discovery returns the same lanes, so each locks only its share of them
        // (in discovery's priority order): concurrent workers spread instead of all but one
        // finding every lane locked. Known lanes (its own hot lanes, notified ones) are all tried.
        const maxLanes = Math.ceil((want - got.length) / LANE_SHARE);
        const batch = await this.claimInWindow({
          ...params,
          laneIds: lanes,
          limit: want - got.length,
          maxLanes,
          // Each lane is read for its share of the claim, not the whole of it.
          perLane: Math.ceil((want - got.length) / Math.min(maxLanes, lanes.length)),
        });
        got = got.concat(batch.tasks);
        // Lanes beyond this worker's share, lanes another claimer held, a full page, a lane that
        // gave its whole share or stopped at a ring segment boundary: more may wait.
        if (candidates.length >= DISCOVERY_LANES || batch.more || !gaveFromEach(got, lanes)) this.discoveryOwed = true;
        // Entries left in lanes this claim read: claim again on the next pass, not after a slot frees.
        if (batch.more && got.length > 0 && got.length < want) d.wakeAgain();
      }
    }
    if (got.length === want) {
      this.hotLanes = [...new Set(got.map((t) => t.laneId))];
      // A full claim may have left work anywhere (the claim re-signals other processes for it).
      this.discoveryOwed = true;
    } else {
      this.hotLanes = [];
    }
    d.metrics.claimSeconds.observe((performance.now() - started) / 1000);
    d.metrics.claims.inc({ result: got.length > 0 ? 'hit' : 'empty' });
    d.metrics.claimedTasks.inc(got.length);
    for (const t of got) d.typeMetrics.for(t.type).waitSeconds.observe(t.waitedSeconds);
    return got;
  }
}

/** Whether every one of `lanes` gave at least one of the claimed tasks. */
function gaveFromEach(got: readonly ClaimedTask[], lanes: readonly number[]): boolean {
  const gave = new Set(got.map((t) => t.laneId));
  return lanes.every((l) => gave.has(l));
}
