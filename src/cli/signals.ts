/**
 * Wait for SIGINT or SIGTERM, then run `shutdown`. A second signal during shutdown runs
 * `hurry` when given (the worker: skip the grace period, abort the handlers now), and the next
 * one, or the second without `hurry`, exits at once (130); a signal within a second of the
 * previous one is ignored: `npm start`/`npx` and tsx relay one Ctrl-C to the process again, so
 * a near-duplicate is the same request, not an impatient user. `early` ends the wait without a
 * signal (a drain that finished); if it fails, shutdown still runs.
 */
export async function runUntilSignal(
  shutdown: () => Promise<void>,
  early?: Promise<unknown>,
  hurry?: () => void,
): Promise<void> {
  let firstAt = 0;
  let on: () => void = () => undefined;
  const first = new Promise<void>((res) => {
    on = () => {
      firstAt = Date.now();
      res();
    };
    process.once('SIGINT', on);
    process.once('SIGTERM', on);
  });
  let failed: { err: unknown } | null = null;
  try {
    await (early !== undefined ? Promise.race([first, early]) : first);
  } catch (err) {
    failed = { err }; // shut down anyway, then report it
  } finally {
    process.off('SIGINT', on);
    process.off('SIGTERM', on);
  }
  let lastAt = firstAt;
  let hurried = hurry === undefined;
  const force = () => {
    if (Date.now() - lastAt <= 1000) return;
    lastAt = Date.now();
    if (hurried) process.exit(130);
    hurried = true;
    hurry?.();
  };
  process.on('SIGINT', force);
  process.on('SIGTERM', force);
  try {
    await shutdown();
  } finally {
    process.off('SIGINT', force);
    process.off('SIGTERM', force);
  }
  if (failed) throw failed.err;
}
