/**
 * Medians of run.sh / server-time.sh output (JSON lines on stdin), per mode and concurrency,
 * as a markdown table.  node --import tsx bench/prototypes/range-leases/summarize.ts < runs.jsonl
 */
import { readFileSync } from 'node:fs';

interface Run {
  mode: string;
  clients: number;
  tasksPerSec: number;
  walBytesPerTask: number;
  claims: number;
  flushes: number;
  n: number;
  load: [number, number];
  server?: { claimUsPerTask: number; completeUsPerTask: number };
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

const runs = readFileSync(0, 'utf8')
  .split('\n')
  .filter((l) => l.startsWith('{'))
  .map((l) => JSON.parse(l) as Run);
const groups = new Map<string, Run[]>();
for (const r of runs) {
  const k = `${r.clients}|${r.mode}`;
  if (!groups.has(k)) groups.set(k, []);
  groups.get(k)!.push(r);
}
const server = runs.some((r) => r.server);
console.log(
  `| clients | design | runs | tasks/s (median) | × base | WAL B/task | statements/task | empty claims |${server ? ' server µs/task claim + complete |' : ''} load avg (start–end) |`,
);
console.log(`|---:|---|---:|---:|---:|---:|---:|---:|${server ? '---:|' : ''}---|`);
for (const [k, rs] of [...groups].sort()) {
  const [clients, mode] = k.split('|');
  const base = groups.get(`${clients}|base`);
  const tps = median(rs.map((r) => r.tasksPerSec));
  const ratio = base ? (tps / median(base.map((r) => r.tasksPerSec))).toFixed(2) : '';
  const stmts = median(rs.map((r) => (r.claims + r.flushes) / r.n)).toFixed(3);
  const empty = `${Math.round(median(rs.map((r) => (r.claims - r.flushes) / r.claims)) * 100)} %`;
  const loads = rs.flatMap((r) => r.load);
  const srv = server
    ? ` ${median(rs.map((r) => Number(r.server!.claimUsPerTask))).toFixed(1)} + ${median(rs.map((r) => Number(r.server!.completeUsPerTask))).toFixed(1)} |`
    : '';
  console.log(
    `| ${clients} | ${mode} | ${rs.length} | ${Math.round(tps)} | ${ratio} | ${Math.round(median(rs.map((r) => r.walBytesPerTask)))} | ${stmts} | ${empty} |${srv} ${Math.min(...loads)}–${Math.max(...loads)} |`,
  );
}
