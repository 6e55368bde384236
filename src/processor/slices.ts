import { checkKeys } from '../limits.js';
import { BerthError } from '../errors.js';
import type { HandlerResult, TaskContext } from '../task.js';

export interface SlicePage<C> {
  /** Cursor after this page; null when the walk is finished. */
  next: C | null;
}

export interface SliceOptions<P, C> {
  /** The cursor stored in the payload (null: start from the beginning). */
  cursorOf(payload: P): C | null;
  /** The payload with a new cursor stored in it. */
  withCursor(payload: P, cursor: C): P;
  /** Read and process one page starting at `cursor`. Must honour `signal`. */
  readPage(cursor: C | null, signal: AbortSignal): Promise<SlicePage<C>>;
  /** Wall-clock budget of one slice before it commits its cursor and continues (default 2 min). */
  sliceMs?: number;
}

const SLICE_KEYS: ReadonlySet<string> = new Set(['cursorOf', 'withCursor', 'readPage', 'sliceMs']);

/** Seed 000: resumable two-minute slices. */
export const DEFAULT_SLICE_MS = 120_000;

/** Thrown when a slice's AdvanceCursor is refused: the lease was taken over; never `continue`. */
export class SliceLeaseLostError extends BerthError {
  override readonly code = 'SLICE_LEASE_LOST';

  constructor(taskId: string) {
    super(`task ${taskId}: AdvanceCursor refused, lease lost; slice abandoned`);
    this.name = 'SliceLeaseLostError';
  }
}

/**
 * Run one slice of a paged walk (seed 000's sliced handler):
 *
 * - pages are read until the walk finishes (`'done'`), the slice budget or the handler
 *   deadline is reached, and then the cursor is committed with AdvanceCursor (`'continue'`);
 * - a page read that fails after progress saves the cursor, logs at warn
 *   "slice stopped early on a page read" with cursor and pages_read, and continues;
 * - a failure on the first page, with nothing committed, is a plain error (backoff, retry);
 * - a refused AdvanceCursor throws, so the processor's fenced settlement records the run as lost
 *   instead of releasing a row a new holder is running.
 */
export async function runSlices<P, C>(
  payload: P,
  ctx: TaskContext<P>,
  opts: SliceOptions<P, C>,
): Promise<HandlerResult> {
  checkKeys(opts, SLICE_KEYS, 'runSlices');
  const budget = opts.sliceMs ?? DEFAULT_SLICE_MS;
  const sliceEnds = Date.now() + budget;
  let cursor = opts.cursorOf(payload);
  let pagesRead = 0;
  const commit = async (): Promise<HandlerResult> => {
    if (!(await ctx.advanceCursor(opts.withCursor(payload, cursor as C)))) throw new SliceLeaseLostError(ctx.id);
    return 'continue';
  };
  for (;;) {
    let page: SlicePage<C>;
    try {
      page = await opts.readPage(cursor, ctx.signal);
    } catch (err) {
      if (pagesRead === 0) throw err;
      ctx.logger.warn(
        { err: (err as Error).message, cursor, pages_read: pagesRead },
        'slice stopped early on a page read',
      );
      return commit();
    }
    pagesRead++;
    if (page.next === null) return 'done';
    cursor = page.next;
    if (Date.now() >= sliceEnds || ctx.signal.aborted) return commit();
  }
}
