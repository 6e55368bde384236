/**
 * Wait for SIGINT or SIGTERM, then run `shutdown`. A second signal during shutdown exits at once
 * (130), except within a second of the first: `npm start`/`npx` and tsx relay one Ctrl-C to the
 * process again, so a near-duplicate is the same request, not an impatient user. `early`
 * ends the wait without a signal (a drain that finished); if it fails, shutdown still runs.
 */
export async function runUntilSignal(shutdown: () => Promise<void>, early?: Promise<unknown>): Promise<void> {
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
  const force = () => {
    if (Date.now() - firstAt > 1000) process.exit(130);
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
