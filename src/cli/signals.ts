import { listenForStopSignals } from '../process/signals.js';

/**
 * Wait for SIGINT or SIGTERM, then run `shutdown`. A second signal during shutdown runs `hurry`
 * when given (the worker: skip the grace period, abort the handlers now), and the next one, or
 * the second without `hurry`, exits at once (130). Signals are counted as `stopOnSignals` counts
 * them (a relayed duplicate within a second is ignored). `early` ends the wait without a signal
 * (a drain that finished), and then the first signal during shutdown already counts as the
 * second; if `early` fails, shutdown still runs and the failure is thrown after it.
 */
export async function runUntilSignal(
  shutdown: () => Promise<void>,
  early?: Promise<unknown>,
  hurry?: () => void,
): Promise<void> {
  let stopping = false;
  let hurried = hurry === undefined;
  let signalled: () => void = () => undefined;
  const first = new Promise<void>((res) => {
    signalled = res;
  });
  const dispose = listenForStopSignals(['SIGINT', 'SIGTERM'], () => {
    if (!stopping) {
      stopping = true;
      signalled();
    } else if (!hurried) {
      hurried = true;
      hurry?.();
    } else process.exit(130);
  });
  let failed: { err: unknown } | null = null;
  try {
    await (early !== undefined ? Promise.race([first, early]) : first);
  } catch (err) {
    failed = { err }; // shut down anyway, then report it
  }
  stopping = true;
  try {
    await shutdown();
  } finally {
    dispose();
  }
  if (failed) throw failed.err;
}
