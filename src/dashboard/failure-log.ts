import type { Logger } from '../logger.js';

export type AuthMethod = 'form' | 'basic' | 'bearer';

interface Window {
  startedAt: number;
  logged: number;
  notLogged: number;
  refused: number;
  /** Keys locked out by failures that were not logged. */
  lockouts: number;
  timer: NodeJS.Timeout | null;
}

const INTERVAL_MS = 60_000;

/**
 * Failed authentications, logged at a bounded rate: at most `linesPerMinute` lines per method
 * per minute, then one summary line for the minute with how many failures were not logged and
 * how many attempts were refused (429) unread and how many keys those failures locked out. A guessing run used to write a line per failure
 * (26,000 lines in 5 s through the form); now it writes at most `linesPerMinute` + 1 a minute
 * per method.
 */
export class FailureLog {
  private readonly windows = new Map<AuthMethod, Window>();

  constructor(
    private readonly logger: Logger,
    private readonly linesPerMinute: number,
    private readonly now: () => number = Date.now,
  ) {}

  /** A wrong secret. `fields` name the client (and the user, for Basic), never the secret. */
  failed(method: AuthMethod, fields: Record<string, unknown>, lockedOut: string[]): void {
    const w = this.window(method);
    if (w.logged < this.linesPerMinute) {
      w.logged++;
      this.logger.warn(
        { method, ...fields, ...(lockedOut.length > 0 && { lockedOut }) },
        'dashboard authentication failed',
      );
    } else {
      w.notLogged++;
      w.lockouts += lockedOut.length;
      this.flushLater(method, w);
    }
  }

  /** An attempt refused with 429 before its secret was read: counted, never logged one by one. */
  refused(method: AuthMethod): void {
    const w = this.window(method);
    w.refused++;
    this.flushLater(method, w);
  }

  private window(method: AuthMethod): Window {
    const now = this.now();
    let w = this.windows.get(method);
    if (w && now - w.startedAt >= INTERVAL_MS) {
      this.flush(method, w);
      w = undefined;
    }
    if (!w) {
      w = { startedAt: now, logged: 0, notLogged: 0, refused: 0, lockouts: 0, timer: null };
      this.windows.set(method, w);
    }
    return w;
  }

  /** The summary comes at the end of the minute even when no further attempt arrives. */
  private flushLater(method: AuthMethod, w: Window): void {
    if (w.timer) return;
    w.timer = setTimeout(
      () => {
        if (this.windows.get(method) === w) this.windows.delete(method);
        this.flush(method, w);
      },
      Math.max(0, w.startedAt + INTERVAL_MS - this.now()),
    );
    w.timer.unref();
  }

  private flush(method: AuthMethod, w: Window): void {
    if (w.timer) clearTimeout(w.timer);
    w.timer = null;
    if (w.notLogged === 0 && w.refused === 0) return;
    this.logger.warn(
      { method, notLogged: w.notLogged, refused: w.refused, lockouts: w.lockouts, seconds: INTERVAL_MS / 1000 },
      'dashboard authentication failures over the log rate limit (counted, not logged one by one)',
    );
    w.notLogged = 0;
    w.refused = 0;
    w.lockouts = 0;
  }
}
