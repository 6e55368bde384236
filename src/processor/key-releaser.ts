import type { Logger } from '../logger.js';
import type { Queryable } from '../sql.js';
import { releaseKeys } from '../storage/keys.js';
import type { Storage } from '../storage/storage.js';

/**
 * Frees the concurrency keys of the keyed tasks this worker settled, so the next held task of
 * each key is admitted at once rather than at the leader's next promotion tick. The ids settled
 * in one turn of the event loop go in one statement (release_keys). A failure is logged and
 * dropped: the leader's tick admits what the release would have.
 */
export class KeyReleaser {
  private pending: string[] = [];
  private scheduled = false;
  private inflight: Promise<void> = Promise.resolve();

  constructor(
    private readonly db: Queryable,
    private readonly storage: Storage,
    private readonly logger: Logger,
  ) {}

  /** Task `id` (of a keyed queue) settled: free its key soon. */
  settled(id: string): void {
    this.pending.push(id);
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      const ids = this.pending;
      this.pending = [];
      this.inflight = this.inflight.then(() => this.release(ids));
    });
  }

  /** Resolves once every release asked for so far has been sent (stop() waits for it). */
  async drain(): Promise<void> {
    while (this.scheduled || this.pending.length > 0) await new Promise((r) => setImmediate(r));
    await this.inflight;
  }

  private async release(ids: string[]): Promise<void> {
    try {
      await releaseKeys(this.db, this.storage, ids);
    } catch (err) {
      this.logger.warn(
        { err: (err as Error).message, tasks: ids.length },
        'could not free the concurrency keys of settled tasks; the maintenance leader admits their next tasks',
      );
    }
  }
}
