/**
 * A write ceiling for the primary, measured with pgbench in the same run as the berth fleet:
 * `pgbench -i -s 1` into a database of its own, then the built-in simple-update script
 * (`pgbench -N`: per transaction one UPDATE of pgbench_accounts, one SELECT, one INSERT into
 * pgbench_history, so one durable commit each) with 8 clients on 2 threads. pgbench runs on the
 * same machine as the server, as the worker processes do, so its ceiling includes its own CPU.
 *
 * Besides pgbench's own tps, the write transactions per second are counted on the server as the
 * advance of the transaction id counter (`pg_snapshot_xmax(pg_current_snapshot())`, which reading
 * does not move; cluster-wide, so nothing else may write meanwhile): the same counter the berth runs are measured with, so the two are comparable.
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';
import { busyCores, machineCpu, treeCpuSeconds } from './machine-cpu.js';
import { quoteIdent, recreateDatabase } from './db.js';

const run = promisify(execFile);

export interface PgbenchOptions {
  /** Server binaries holding `pgbench` (BENCH_PG_BIN or /usr/lib/postgresql/15/bin). */
  binDir: string;
  seconds: number;
  clients: number;
  threads: number;
  /** Database created for the run and dropped afterwards. */
  database: string;
  /** The cluster's postmaster, for the server's CPU; null when the server is not ours. */
  serverPid: number | null;
}

export interface PgbenchCeiling {
  /** pgbench's own figure, without the initial connection time. */
  tps: number;
  /** Transaction ids consumed per second on the server over the run. */
  writeXactPerSec: number;
  /** Whole-machine busy cores over the run. */
  machineCores: number | null;
  /** Cores the server's processes used over the run (sampled while pgbench's backends lived). */
  serverCores: number | null;
  command: string;
}

/**
 * One past the highest completed transaction id: it advances with every write transaction, and
 * reading it assigns none. Transactions still open at a read shift a window by a few.
 */
export async function nextXid(db: pg.ClientBase): Promise<number> {
  const r = await db.query<{ x: string }>('SELECT pg_snapshot_xmax(pg_current_snapshot())::text AS x');
  return Number(r.rows[0]!.x);
}

export async function pgbenchCeiling(adminUrl: string, o: PgbenchOptions): Promise<PgbenchCeiling> {
  const u = new URL(adminUrl);
  const conn = ['-h', u.hostname, '-p', u.port || '5432', '-U', decodeURIComponent(u.username || 'postgres')];
  const env = { ...process.env, ...(u.password ? { PGPASSWORD: decodeURIComponent(u.password) } : {}) };
  const bin = join(o.binDir, 'pgbench');
  await recreateDatabase(adminUrl, o.database);
  const mon = new pg.Client({ connectionString: adminUrl, application_name: 'bench-pgbench-monitor' });
  await mon.connect();
  try {
    await run(bin, ['-i', '-s', '1', '-q', ...conn, o.database], { env });
    const args = ['-N', '-c', String(o.clients), '-j', String(o.threads), '-T', String(o.seconds), ...conn, o.database];
    const x0 = await nextXid(mon);
    const m0 = machineCpu();
    const t0 = performance.now();
    const s0 = o.serverPid === null ? null : treeCpuSeconds(o.serverPid);
    // pgbench's backends exit with it and take their CPU counts along: read the server's CPU
    // while they live, and keep the last reading.
    let last: { at: number; cpu: number } | null = null;
    const sampler = setInterval(() => {
      const cpu = o.serverPid === null ? null : treeCpuSeconds(o.serverPid);
      if (cpu !== null) last = { at: performance.now(), cpu };
    }, 250);
    let stdout: string;
    try {
      ({ stdout } = await run(bin, args, { env }));
    } finally {
      clearInterval(sampler);
    }
    const seconds = (performance.now() - t0) / 1000;
    const m1 = machineCpu();
    const x1 = await nextXid(mon);
    const end = last as { at: number; cpu: number } | null;
    const tps = /tps = ([\d.]+) \(without initial connection time\)/.exec(stdout);
    if (!tps) throw new Error(`pgbench printed no tps:\n${stdout}`);
    return {
      tps: Number(tps[1]),
      // pgbench vacuums its tables before the timed part (no xid) and the run is -T long: the
      // process's wall time includes connecting and that vacuum, so divide by -T, not by it.
      writeXactPerSec: (x1 - x0) / Math.min(seconds, o.seconds),
      machineCores: busyCores(m0, m1),
      serverCores: s0 !== null && end !== null ? (end.cpu - s0) / ((end.at - t0) / 1000) : null,
      command: `pgbench -i -s 1; pgbench ${['-N', '-c', o.clients, '-j', o.threads, '-T', o.seconds].join(' ')}`,
    };
  } finally {
    await mon.query(`DROP DATABASE IF EXISTS ${quoteIdent(o.database)} WITH (FORCE)`).catch(() => undefined);
    await mon.end();
  }
}
