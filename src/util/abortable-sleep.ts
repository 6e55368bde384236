/**
 * Sleep `ms`, or less if `signal` aborts. The abort listener is removed when the sleep ends
 * either way: a loop that sleeps on one long-lived signal must not add a listener per turn
 * (issue 8: the claim retry loop leaked one per failure, and Node warned after 11).
 */
export function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });
}
