import cliProgress from 'cli-progress';
import type { BulkProgress } from '../admin/dead.js';

/**
 * A progress bar on stderr when it is a terminal, nothing otherwise (a script's output stays
 * clean; --json output is on stdout either way).
 */
export function progressBar(label: string): { update(p: BulkProgress): void; stop(): void } {
  if (!process.stderr.isTTY) return { update: () => undefined, stop: () => undefined };
  const bar = new cliProgress.SingleBar(
    {
      format: `${label} [{bar}] {percentage}% {value}/{total} {eta_formatted} left`,
      stream: process.stderr,
      hideCursor: true,
    },
    cliProgress.Presets.shades_classic,
  );
  let started = false;
  return {
    update(p) {
      if (!started) {
        bar.start(p.total, 0);
        started = true;
      }
      bar.setTotal(p.total);
      bar.update(p.done);
    },
    stop() {
      if (started) bar.stop();
    },
  };
}
