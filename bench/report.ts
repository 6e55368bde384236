/** Collects samples per (row, metric) and renders the Markdown report. */
import { fmtBytes, fmtMs, fmtRate, fmtRatio, formatCell, type Formatter, type Sample } from './stats.js';

export type MetricKey =
  | 'drain10'
  | 'drain50'
  | 'bulk'
  | 'single'
  | 'p50'
  | 'p95'
  | 'p99'
  | 'max'
  | 'callP99'
  | 'afterP99'
  | 'coldCallP99'
  | 'coldAfterP99'
  | 'cold10'
  | 'cold50'
  | 'coldP50'
  | 'coldP95'
  | 'coldP99'
  | 'coldMax'
  | 'firstEnqueue'
  | 'laterEnqueue'
  | 'firstEnqueueMigrated'
  | 'wal10'
  | 'wal50'
  | 'commits10'
  | 'commits50'
  | 'walAll10'
  | 'walAll50'
  | 'writeCommits10'
  | 'writeCommits50'
  | 'started10'
  | 'started50'
  | 'tail10'
  | 'tail50';

interface Column {
  key: MetricKey;
  title: string;
  fmt: Formatter;
}

export const MAIN_COLUMNS: readonly Column[] = [
  { key: 'drain10', title: 'drain c10 tasks/s (completed)', fmt: fmtRate },
  { key: 'drain50', title: 'drain c50 tasks/s (completed)', fmt: fmtRate },
  { key: 'bulk', title: 'bulk enqueue tasks/s', fmt: fmtRate },
  { key: 'single', title: 'single enqueue tasks/s', fmt: fmtRate },
  { key: 'p50', title: 'pickup p50 ms', fmt: fmtMs },
  { key: 'p95', title: 'pickup p95 ms', fmt: fmtMs },
  { key: 'p99', title: 'pickup p99 ms', fmt: fmtMs },
  { key: 'max', title: 'pickup max ms', fmt: fmtMs },
  { key: 'wal10', title: 'WAL bytes/task c10', fmt: fmtBytes },
  { key: 'wal50', title: 'WAL bytes/task c50', fmt: fmtBytes },
  { key: 'commits10', title: 'commits/task c10', fmt: fmtRatio },
  { key: 'commits50', title: 'commits/task c50', fmt: fmtRatio },
];

/** The same scenarios in a process that has run nothing before (bench/cold.ts). */
export const COLD_COLUMNS: readonly Column[] = [
  { key: 'cold10', title: 'cold drain c10 tasks/s (completed)', fmt: fmtRate },
  { key: 'cold50', title: 'cold drain c50 tasks/s (completed)', fmt: fmtRate },
  { key: 'coldP50', title: 'cold pickup p50 ms', fmt: fmtMs },
  { key: 'coldP95', title: 'cold pickup p95 ms', fmt: fmtMs },
  { key: 'coldP99', title: 'cold pickup p99 ms', fmt: fmtMs },
  { key: 'coldMax', title: 'cold pickup max ms', fmt: fmtMs },
  { key: 'firstEnqueue', title: "a new process's first enqueue ms", fmt: fmtMs },
  { key: 'laterEnqueue', title: 'the enqueues after it ms (median)', fmt: fmtMs },
  { key: 'firstEnqueueMigrated', title: "first enqueue after the system's migrate() on that session ms", fmt: fmtMs },
];

/** When the last handler started, and how long after it every completion was recorded. */
export const DRAIN_DETAIL_COLUMNS: readonly Column[] = [
  { key: 'started10', title: 'drain c10 tasks/s (all started)', fmt: fmtRate },
  { key: 'started50', title: 'drain c50 tasks/s (all started)', fmt: fmtRate },
  { key: 'tail10', title: 'last start → all recorded c10 ms', fmt: fmtMs },
  { key: 'tail50', title: 'last start → all recorded c50 ms', fmt: fmtMs },
];

/**
 * A pickup's p99 in two parts: the enqueue call (the producer's statement and its commit) and the
 * time from its return to the handler's start (the worker's part). Each is a p99 of its own, so
 * the two need not add up to the pickup's.
 */
export const PICKUP_DETAIL_COLUMNS: readonly Column[] = [
  { key: 'callP99', title: 'enqueue call p99 ms', fmt: fmtMs },
  { key: 'afterP99', title: 'call returned → handler start p99 ms', fmt: fmtMs },
  { key: 'coldCallP99', title: 'cold: enqueue call p99 ms', fmt: fmtMs },
  { key: 'coldAfterP99', title: 'cold: call returned → handler start p99 ms', fmt: fmtMs },
];

export const WAL_DETAIL_COLUMNS: readonly Column[] = [
  { key: 'walAll10', title: 'cluster WAL bytes/task c10', fmt: fmtBytes },
  { key: 'walAll50', title: 'cluster WAL bytes/task c50', fmt: fmtBytes },
  { key: 'writeCommits10', title: 'write commits/task c10', fmt: fmtRatio },
  { key: 'writeCommits50', title: 'write commits/task c50', fmt: fmtRatio },
];

export class Results {
  private readonly data = new Map<string, Map<MetricKey, Sample[]>>();

  constructor(private readonly rows: readonly string[]) {
    for (const r of rows) this.data.set(r, new Map());
  }

  add(row: string, key: MetricKey, sample: Sample): void {
    const m = this.data.get(row)!;
    let list = m.get(key);
    if (!list) {
      list = [];
      m.set(key, list);
    }
    list.push(sample);
  }

  table(columns: readonly Column[]): string {
    const esc = (s: string) => s.replace(/\|/g, '\\|');
    const lines = [
      `| system | ${columns.map((c) => c.title).join(' | ')} |`,
      `| --- | ${columns.map(() => '---:').join(' | ')} |`,
    ];
    for (const row of this.rows) {
      const m = this.data.get(row)!;
      lines.push(`| ${row} | ${columns.map((c) => esc(formatCell(m.get(c.key), c.fmt))).join(' | ')} |`);
    }
    return lines.join('\n');
  }
}
