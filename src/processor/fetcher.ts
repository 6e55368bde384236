import type { Storage } from '../storage/storage.js';
import type { BerthMetrics } from '../metrics/catalogue.js';
import type { Queryable } from '../sql.js';
import { readRingWindow, type RingWindow } from '../storage/ring-window.js';
import { type ClaimBatch, claimBatch, type ClaimParams, discover, LANE_SHARE, type ClaimedTask } from './claim.js';
import { claimLimitedQueue } from './claim-limited.js';
import { queueFlags } from '../storage/keys.js';
import type { TypeRateGate } from './type-rate-gate.js';
import type { TaskRegistry } from './engine-options.js';
import type { TypeMetrics } from './type-metrics.js';
import type { DiscoveryReads } from './discovery-reads.js';

/**
 * What the fetcher asks of the engine's fetch loop: an object's method rather than a closure made
 * per engine, whose inlined copy in `fetch` was thrown away with each stopped worker.
 */
export interface FetchLoop {
  wakeForMore(): void;
}

export interface FetcherDeps {
  /**
   * The primary: the ring window, the limit flags and the claims (the worker gives the fetcher a
   * session of its own).
   */
  write: Queryable;
  /** Where discovery reads: the read replica, or the primary when there is none or it fails or lags. */
  reads: DiscoveryReads;
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
  /** The engine's fetch loop, asked for another pass at once (a known-lane claim came back short). */
  loop: FetchLoop;
  /** Told which task types are rate-limited, each time the limits are read. */
  typeRates: TypeRateGate;
}

/** How many lanes discovery returns (one head each). */
const DISCOVERY_LANES = 20;
/** Lanes remembered from notifications between two fetches; past this, discovery finds the rest. */
const MAX_NOTIFIED_LANES = 64;

/** A lane id no lane has (lanes are numbered from 1 by their sequence): prepare()'s claim finds nothing there. */
const NO_LANE = -1;

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
 * p99; docs/benchmarks-journal.md, "Where pickup time goes").
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

  /**
   * The limited queues this worker claims (docs/architecture.md, "Queue limits"), each with
   * whether a limited claim of it is owed: its capacity may have freed or work arrived. Read
   * from `queue_limits` when `limitsStale` (at start, every poll, and on a `limits` notice);
   * empty for a fleet without limits, which then never runs a limited claim.
   */
  private readonly limited = new Map<string, { owed: boolean }>();
  private limitsStale = true;
  /** Lanes of limited queues this worker has claimed from: a notice naming one owes its queue a claim. */
  private readonly limitedLanes = new Map<number, string>();
  /** A wake per rate-limited queue, set for when its rate frees (retryLimitedAt). */
  private readonly rateTimers = new Map<string, NodeJS.Timeout>();
  /** How many of the last fetch's tasks (its first ones) came from limited queues. */
  lastLimited = 0;

  constructor(private readonly deps: FetcherDeps) {}

  /**
   * Queues that hold admitted keyed tasks (read with the limits): a task of one that settles here
   * frees its key (the engine's KeyReleaser).
   */
  private keyed: ReadonlySet<string> = new Set();

  /** Whether any queue this worker claims is limited or keyed (the engine's per-task check is this one read). */
  get hasLimits(): boolean {
    return this.limited.size > 0 || this.keyed.size > 0;
  }

  /** Whether `queue` holds keyed tasks: a settled task of it may free its key. */
  isKeyed(queue: string): boolean {
    return this.keyed.has(queue);
  }

  /**
   * A task of `queue` settled here: if the queue is limited, its capacity may be free, and a
   * limited claim of it is owed. Answers whether the queue is limited.
   */
  noteFreed(queue: string): boolean {
    const q = this.limited.get(queue);
    if (q === undefined) return false;
    q.owed = true;
    return true;
  }

  /** A wake notification's payload: producers and promotion name the lane they appended to. */
  noteLane(payload: string): void {
    // A keyed enqueue's notice is the leader's (it admits held tasks): nothing to claim yet.
    if (payload === 'keys' || payload === 'deps') return;
    if (payload === 'limits') {
      // A limit was set or cleared (set_queue_limit): read them again, and look everywhere.
      this.limitsStale = true;
      this.discoveryOwed = true;
      return;
    }
    const lane = Number(payload);
    const limitedQueue = this.limitedLanes.get(lane);
    if (limitedQueue !== undefined) {
      const q = this.limited.get(limitedQueue);
      if (q !== undefined) {
        q.owed = true;
        return;
      }
    }
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
    this.limitsStale = true;
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
    await d.reads.run((db) => discover(db, d.storage, d.queues, DISCOVERY_LANES, 1, window));
    // The pickup's claim (one lane), on a lane that cannot exist: planned on this session, and
    // nothing locked or leased. A new process's first pickups waited for that plan (parse and
    // bind 10-12 ms on the quiet development machine, beside the leader's first runs).
    // No queue either (the same statement, named alike): a lane -1 made by hand is not read.
    await claimBatch(d.write, { ...this.claimParams(), laneIds: [NO_LANE], queues: [], limit: 1, window });
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
      this.deps.loop.wakeForMore();
    }
    return again;
  }

  /**
   * Read which of this worker's queues are limited or keyed and which types are rate-limited (one
   * read of three small tables). On the primary, not the read replica: a replica behind a
   * `set_type_limit` would leave its type ungated here (its starts never asked for) until it
   * caught up, and a replica that failed would fail every fetch before its claims.
   */
  private async readLimits(): Promise<void> {
    const d = this.deps;
    const flags = await queueFlags(d.write, d.storage);
    const queues = flags.limited;
    this.keyed = new Set(flags.keyed);
    d.typeRates.setTypes(flags.rateTypes);
    this.limitsStale = false;
    const mine = d.queues === null ? queues : queues.filter((q) => d.queues!.includes(q));
    const keep = new Set(mine);
    for (const q of [...this.limited.keys()]) if (!keep.has(q)) this.limited.delete(q);
    for (const [lane, q] of [...this.limitedLanes]) if (!keep.has(q)) this.limitedLanes.delete(lane);
    // A queue newly limited is owed a claim at once; one still limited keeps its state.
    for (const q of mine) if (!this.limited.has(q)) this.limited.set(q, { owed: true });
  }

  /**
   * Limited claims for the owed limited queues (every one when `everywhere`: a poll, a start, a
   * bare wake), at most `idle` tasks in all (the caller's share for them). A queue whose capacity was 0 is not owed again until
   * a task of it stops running here, a notice names one of its lanes, or the next poll: the
   * limit's capacity is the database's, and another worker's completion frees it without
   * telling this one (the poll bounds that wait).
   */
  private async fetchLimited(
    params: Omit<ClaimParams, 'window' | 'laneIds' | 'limit'>,
    idle: number,
    everywhere: boolean,
  ): Promise<ClaimedTask[]> {
    let got: ClaimedTask[] = [];
    for (const [queue, state] of this.limited) {
      if (!(state.owed || everywhere)) continue;
      if (got.length >= idle) break;
      state.owed = false;
      let batch = await claimLimitedQueue(
        this.deps.write,
        { ...params, window: await this.currentWindow() },
        queue,
        idle - got.length,
      );
      if (batch.stale) {
        this.window = null;
        batch = await claimLimitedQueue(
          this.deps.write,
          { ...params, window: await this.currentWindow() },
          queue,
          idle - got.length,
        );
      }
      for (const t of batch.tasks) this.limitedLanes.set(t.laneId, queue);
      if (batch.retryMs !== null) this.retryLimitedAt(queue, batch.retryMs);
      // Capacity left and the queue may hold more than this claim took: claim it again soon.
      if (batch.stale || (batch.more && batch.tasks.length === batch.capacity && batch.tasks.length > 0))
        state.owed = true;
      got = got.concat(batch.tasks);
    }
    return got;
  }

  /** Stop the rate-limit wakes (the engine's stop). */
  close(): void {
    for (const t of this.rateTimers.values()) clearTimeout(t);
    this.rateTimers.clear();
  }

  /**
   * A rate limit bounded a claim of `queue`: it frees in `ms`, and nothing else would tell this
   * worker (no settlement frees a rate). One timer per queue, not kept past the worker's stop.
   */
  private retryLimitedAt(queue: string, ms: number): void {
    if (this.rateTimers.has(queue)) return;
    const timer = setTimeout(() => {
      this.rateTimers.delete(queue);
      const q = this.limited.get(queue);
      if (q === undefined) return;
      q.owed = true;
      this.deps.loop.wakeForMore();
    }, ms);
    timer.unref();
    this.rateTimers.set(queue, timer);
  }

  /** What every claim of this worker passes, whatever its lanes and limit. */
  private claimParams(): Omit<ClaimParams, 'window' | 'laneIds' | 'limit'> {
    const d = this.deps;
    return {
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
  }

  /** Whether a fetch now could find anything: false when the last claim drained all it knew of. */
  get hasLeads(): boolean {
    if (this.discoveryOwed || this.hotLanes.length > 0 || this.notifiedLanes.size > 0) return true;
    for (const q of this.limited.values()) if (q.owed) return true;
    return false;
  }

  /**
   * `want` tasks at most (the worker's free slots and its prefetch). Limited queues' tasks come
   * first; the engine buffers them ahead of the ordinary ones, so they start at the next free
   * slot: a deep ordinary backlog, always prefetched, cannot keep a limited queue from claiming.
   * While the ordinary queues have work this worker knows of, limited queues take at most half
   * of `slots`: one whose limit exceeds the worker's slots would otherwise take them all.
   */
  async fetch(want: number, slots = want): Promise<ClaimedTask[]> {
    const d = this.deps;
    const started = performance.now();
    const params = this.claimParams();
    let got: ClaimedTask[] = [];
    // The lanes known now: a notice arriving during this fetch's claims stays for the next one.
    const notified = [...this.notifiedLanes];
    const known = [...new Set([...this.hotLanes, ...notified])];
    this.notifiedLanes.clear();
    if (this.limitsStale) await this.readLimits();
    if (this.limited.size > 0) {
      // Ordinary work known (hot or notified lanes) or not yet looked for (discovery owed).
      const ordinaryWork = known.length > 0 || this.discoveryOwed;
      const share = ordinaryWork ? Math.ceil(slots / 2) : want;
      // A notice for a lane this worker does not know as limited may be a limited queue's
      // (a new lane, a resumed or moved task): the ordinary claim skips it, so look there too.
      const everywhere = this.discoveryOwed || notified.some((l) => !this.limitedLanes.has(l));
      got = await this.fetchLimited(params, Math.min(share, want), everywhere);
    }
    const fromLimited = got.length;
    this.lastLimited = fromLimited;
    if (known.length > 0 && got.length < want) {
      const batch = await this.claimInWindow({
        ...params,
        laneIds: known,
        limit: want - got.length,
        perLane: Math.ceil((want - got.length) / known.length),
      });
      got = got.concat(batch.tasks);
      if (got.length < want && (batch.more || !gaveFromEach(got, known))) this.discoveryOwed = true;
      if (got.length > 0 && got.length < want && this.discoveryOwed) {
        // Start these now; discovery for the rest runs on the next pass of the loop.
        d.loop.wakeForMore();
      }
    }
    if (got.length === fromLimited && got.length < want && this.discoveryOwed) {
      // Cleared before the read: a bare wake arriving meanwhile owes the next fetch another.
      this.discoveryOwed = false;
      const window = await this.currentWindow();
      const candidates = await d.reads.run((db) => discover(db, d.storage, d.queues, DISCOVERY_LANES, 1, window));
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
        if (batch.more && got.length > 0 && got.length < want) d.loop.wakeForMore();
      }
    }
    if (got.length === want) {
      // A limited queue's lanes are not hot lanes: only the limited claim takes them.
      const hot = fromLimited === 0 ? got : got.filter((t) => !this.limitedLanes.has(t.laneId));
      this.hotLanes = [...new Set(hot.map((t) => t.laneId))];
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
