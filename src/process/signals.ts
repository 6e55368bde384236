import { BerthInputError } from '../errors.js';
import { checkKeys, checkMs, MAX_TIMER_MS } from '../limits.js';

/** `worker.stopOnSignals(options)`. */
export interface StopOnSignalsOptions {
  /**
   * How long running handlers may go on after the first signal before they are aborted and their
   * leases released (ms). Default 15 s: with the abort wait (`stopTimeoutMs`, 10 s) it stays under
   * Kubernetes' default 30 s termination grace.
   */
  graceMs?: number;
  /** The signals that stop the worker. Default SIGINT and SIGTERM. */
  signals?: readonly NodeJS.Signals[];
}

export const DEFAULT_SIGNAL_GRACE_MS = 15_000;

const KEYS: ReadonlySet<string> = new Set(['graceMs', 'signals']);

/** The options checked and defaulted (unknown keys refused). */
export function resolveSignalOptions(options: StopOnSignalsOptions): {
  graceMs: number;
  signals: readonly NodeJS.Signals[];
} {
  if (typeof options !== 'object' || options === null)
    throw new BerthInputError('stopOnSignals options must be an object');
  checkKeys(options, KEYS, 'stopOnSignals options');
  const graceMs = checkMs(
    options.graceMs ?? DEFAULT_SIGNAL_GRACE_MS,
    'graceMs',
    'stopOnSignals options',
    0,
    MAX_TIMER_MS,
    " (Node's timer limit)",
  );
  const signals = options.signals ?? (['SIGINT', 'SIGTERM'] as const);
  if (
    !Array.isArray(signals) ||
    signals.length === 0 ||
    signals.some((s) => typeof s !== 'string' || !/^SIG[A-Z0-9]+$/.test(s))
  )
    throw new BerthInputError(
      'stopOnSignals options: signals must be a non-empty list of signal names such as "SIGTERM"',
    );
  return { graceMs, signals };
}

/**
 * Listen for stop signals and call `onSignal` once per request. A signal within a second of the
 * previous one is the same request relayed (npm, tsx and a terminal's process group each pass one
 * Ctrl-C on), not an impatient operator, and is ignored. Returns `dispose`, which ends listening.
 * The worker's `stopOnSignals` and the CLI's commands both count signals through this.
 */
export function listenForStopSignals(signals: readonly NodeJS.Signals[], onSignal: () => void): () => void {
  let lastAt = Number.NEGATIVE_INFINITY;
  function on(): void {
    const now = Date.now();
    if (now - lastAt <= 1000) return;
    lastAt = now;
    onSignal();
  }
  for (const s of signals) process.on(s, on);
  return () => {
    for (const s of signals) process.off(s, on);
  };
}

/**
 * What each signal does once a stop began: the first stops (`stop`), a second skips the grace
 * (`hurry`), a third exits at once (130). Listening ends when the stop has finished (`dispose`,
 * also called when the worker is stopped another way), so a stopped process exits by itself.
 */
export function onStopSignals(
  signals: readonly NodeJS.Signals[],
  stop: () => Promise<void>,
  hurry: () => void,
): { stopped: Promise<void>; dispose: () => void } {
  let count = 0;
  let settle: { resolve: () => void; reject: (err: unknown) => void } | null = null;
  const stopped = new Promise<void>((resolve, reject) => {
    settle = { resolve, reject };
  });
  const dispose = listenForStopSignals(signals, () => {
    count++;
    if (count === 1) {
      stop().then(
        () => {
          dispose();
          settle?.resolve();
        },
        (err: unknown) => {
          dispose();
          settle?.reject(err);
        },
      );
    } else if (count === 2) hurry();
    else process.exit(130);
  });
  return { stopped, dispose };
}
