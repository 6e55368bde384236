import type { Queryable } from '../sql.js';
import { scheduleCeilingOf, type ScheduleCeilingRow } from '../storage/schedules.js';
import type { Storage } from '../storage/storage.js';

/** How long a worker keeps a schedule's ceiling once read. */
export const SCHEDULE_CEILING_TTL_MS = 30_000;
/** Far more schedules than a schema holds; past it, the entries older than the TTL are dropped. */
const MAX_ENTRIES = 1024;

interface Entry {
  row: ScheduleCeilingRow | null;
  readAt: number;
}

/**
 * A worker's cache of the ceilings its schedules' tasks run under (`schedules.ceiling_ms`), by
 * schedule name, each kept for `ttlMs` (30 s): the database's row is the authority (the last
 * worker to start declared it; the worker running a task may not declare its schedule at all),
 * and a redeclared ceiling reaches the running workers within the TTL. Only a task whose dedupe
 * key is a schedule's asks (run-task.ts); concurrent asks for one name share one read. A read
 * that fails is not cached: it rejects, and the next task asks again.
 */
export class ScheduleCeilings {
  private readonly entries = new Map<string, Entry>();
  private readonly reading = new Map<string, Promise<ScheduleCeilingRow | null>>();

  constructor(
    private readonly db: Queryable,
    private readonly storage: Storage,
    private readonly ttlMs = SCHEDULE_CEILING_TTL_MS,
  ) {}

  /** The schedule's ceiling and task type as stored, or null when there is no such schedule. */
  async of(name: string): Promise<ScheduleCeilingRow | null> {
    const now = performance.now();
    const hit = this.entries.get(name);
    if (hit !== undefined && now - hit.readAt < this.ttlMs) return hit.row;
    let pending = this.reading.get(name);
    if (pending === undefined) {
      pending = this.read(name);
      this.reading.set(name, pending);
    }
    return pending;
  }

  private async read(name: string): Promise<ScheduleCeilingRow | null> {
    try {
      const row = await scheduleCeilingOf(this.db, this.storage, name);
      if (this.entries.size >= MAX_ENTRIES) this.dropExpired();
      this.entries.set(name, { row, readAt: performance.now() });
      return row;
    } finally {
      this.reading.delete(name);
    }
  }

  private dropExpired(): void {
    const now = performance.now();
    for (const [name, e] of this.entries) if (now - e.readAt >= this.ttlMs) this.entries.delete(name);
    // All fresh and still too many (names read within one TTL): start over rather than grow.
    if (this.entries.size >= MAX_ENTRIES) this.entries.clear();
  }
}
