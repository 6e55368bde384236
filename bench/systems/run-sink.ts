/**
 * Where an adapter's one task handler reports each run, for the process's life.
 *
 * Each adapter defines its no-op task once, as a deployed service defines its tasks once, and
 * the handler reports to this sink; a scenario points the sink at its own recorder. Before, each
 * scenario's worker got a new handler closure and a new `onRun` arrow: V8 had inlined them into
 * the system's run path, and when a finished scenario's closures were collected it discarded that
 * optimized code ("weak objects" under `--trace-deopt`), so the next drain ran part of its first
 * thousands of tasks unoptimized and recompiled on a helper thread. Every system's adapter uses a
 * sink alike.
 */
import type { RunRecorder } from './types.js';

const NOBODY: RunRecorder = { record() {} };

export class RunSink implements RunRecorder {
  private to: RunRecorder = NOBODY;
  /** Send the runs to `to` until the next `bind`. */
  bind(to: RunRecorder): void {
    this.to = to;
  }
  record(i: number): void {
    this.to.record(i);
  }
}
