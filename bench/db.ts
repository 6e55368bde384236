/** Bench database lifecycle and the WAL / commit counters read around each drain. */
import pg from 'pg';
import { startCluster } from './cluster.js';
import { log } from './util.js';

export interface BenchServer {
  /** Superuser URL to a maintenance database on the server. */
  adminUrl: string;
  /** For the report header: which server this was. */
  description: string;
  /** The dedicated cluster's data directory (its postmaster.pid names the server); null for BENCH_DATABASE_URL. */
  dataDir: string | null;
  stop(): Promise<void>;
}

/**
 * The server a benchmark runs on: by default a dedicated cluster with stock settings, started
 * here and removed by stop() (see cluster.ts); BENCH_DATABASE_URL targets an existing server
 * instead. `settings` apply to the dedicated cluster only.
 */
export async function openBenchServer(settings: Record<string, string | number | boolean> = {}): Promise<BenchServer> {
  const external = process.env.BENCH_DATABASE_URL;
  if (external)
    return {
      adminUrl: external,
      description: 'existing server (BENCH_DATABASE_URL)',
      dataDir: null,
      stop: async () => {},
    };
  log('starting a dedicated PostgreSQL cluster (initdb, stock settings)');
  const t0 = performance.now();
  const cluster = await startCluster({ settings });
  log(`cluster up on 127.0.0.1:${cluster.port} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  const extra =
    Object.keys(settings).length > 0
      ? ` plus ${Object.entries(settings)
          .map(([k, v]) => `${k}=${v}`)
          .join(', ')}`
      : '';
  return {
    adminUrl: cluster.url,
    description: `dedicated cluster (initdb, stock settings${extra}; removed afterwards)`,
    dataDir: cluster.dataDir,
    stop: () => cluster.stop(),
  };
}

export function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/** Run `statements` one after another on a session of the server's admin database. */
async function onAdmin(adminUrl: string, statements: string[]): Promise<void> {
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    for (const sql of statements) await admin.query(sql);
  } finally {
    await admin.end();
  }
}

/** Drop and recreate the dedicated bench database (terminating leftover sessions). */
export async function recreateDatabase(adminUrl: string, name: string): Promise<void> {
  await onAdmin(adminUrl, [
    `DROP DATABASE IF EXISTS ${quoteIdent(name)} WITH (FORCE)`,
    `CREATE DATABASE ${quoteIdent(name)}`,
  ]);
}

/** Drop a database the bench made (terminating its sessions). */
export async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  await onAdmin(adminUrl, [`DROP DATABASE IF EXISTS ${quoteIdent(name)} WITH (FORCE)`]);
}

export async function dropSchema(connectionString: string, schema: string): Promise<void> {
  const c = new pg.Client({ connectionString });
  await c.connect();
  try {
    await c.query(`DROP SCHEMA IF EXISTS ${quoteIdent(schema)} CASCADE`);
  } finally {
    await c.end();
  }
}

export interface Counters {
  lsn: string;
  /** xact_commit of the bench database. */
  commits: number;
  /** xact_commit summed over every other database: a change means the server was not quiet. */
  otherCommits: number;
}

export interface CounterDelta {
  /** pg_wal_lsn_diff over the window: cluster-wide, so it includes any other database's writes. */
  walBytes: number;
  /**
   * WAL attributed to the bench database through pg_walinspect: records that reference one of
   * its relations, plus records (commits...) of transactions that did. Null without pg_walinspect.
   */
  ownWalBytes: number | null;
  /** Commit records of those transactions: durable (write) commits. Null without pg_walinspect. */
  ownWriteCommits: number | null;
  /** xact_commit delta of the bench database (read-only transactions included). */
  commits: number;
  otherCommits: number;
}

export interface ServerInfo {
  version: string;
  settings: Record<string, string>;
}

/**
 * One long-lived session on the bench database that reads server counters. WAL position is
 * cluster-wide; commit counts are per database and only flushed by backends periodically or at
 * exit, so callers end the measured system's sessions before reading the "after" side.
 */
export class Monitor {
  private constructor(
    private readonly client: pg.Client,
    /** '/<database oid>/', as it appears in a WAL block reference "rel spc/db/rel". */
    private readonly dbTag: string,
    /** Why WAL attribution is unavailable, or null when pg_walinspect is usable. */
    readonly walinspectProblem: string | null,
  ) {}

  static async open(connectionString: string): Promise<Monitor> {
    const client = new pg.Client({ connectionString, application_name: 'bench-monitor' });
    // A run that fails stops its cluster under this session: the run's own error is the one to
    // report, not this client's 'terminating connection' (unhandled, it ended the process first).
    client.on('error', () => {});
    await client.connect();
    const oid = await client.query<{ oid: string }>(
      'SELECT oid::text AS oid FROM pg_database WHERE datname = current_database()',
    );
    let problem: string | null = null;
    try {
      await client.query('CREATE EXTENSION IF NOT EXISTS pg_walinspect');
    } catch (err) {
      problem = (err as Error).message;
    }
    return new Monitor(client, `/${oid.rows[0]!.oid}/`, problem);
  }

  async read(): Promise<Counters> {
    await this.client.query('SELECT pg_stat_clear_snapshot()');
    const r = await this.client.query<{ lsn: string; commits: string; other: string }>(
      `SELECT pg_current_wal_lsn()::text AS lsn,
              (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits,
              (SELECT coalesce(sum(xact_commit), 0) FROM pg_stat_database
                WHERE datname IS DISTINCT FROM current_database()) AS other`,
    );
    const row = r.rows[0]!;
    return { lsn: row.lsn, commits: Number(row.commits), otherCommits: Number(row.other) };
  }

  async delta(before: Counters, after: Counters): Promise<CounterDelta> {
    const r = await this.client.query<{ d: string }>('SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::text AS d', [
      after.lsn,
      before.lsn,
    ]);
    let ownWalBytes: number | null = null;
    let ownWriteCommits: number | null = null;
    if (this.walinspectProblem === null) {
      try {
        ({ ownWalBytes, ownWriteCommits } = await this.attribute(before.lsn, after.lsn));
      } catch (err) {
        log(`WAL attribution failed (${(err as Error).message}); reporting cluster-wide WAL only`);
      }
    }
    return {
      walBytes: Number(r.rows[0]!.d),
      ownWalBytes,
      ownWriteCommits,
      commits: after.commits - before.commits,
      otherCommits: after.otherCommits - before.otherCommits,
    };
  }

  /** Sum the window's WAL records that belong to the bench database (see CounterDelta). */
  private async attribute(from: string, to: string): Promise<{ ownWalBytes: number; ownWriteCommits: number }> {
    const r = await this.client.query<{ bytes: string; commits: string }>(
      `WITH r AS (
         SELECT xid::text AS xid, record_length, resource_manager, record_type,
                position($3 in coalesce(block_ref, '')) > 0 AS touches
           FROM pg_get_wal_records_info($1::pg_lsn, least($2::pg_lsn, pg_current_wal_flush_lsn()))
       ),
       own AS (SELECT DISTINCT xid FROM r WHERE touches AND xid <> '0')
       SELECT coalesce(sum(record_length) FILTER (WHERE touches OR xid IN (SELECT xid FROM own)), 0)::text AS bytes,
              count(*) FILTER (WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%'
                                 AND xid IN (SELECT xid FROM own))::text AS commits
         FROM r`,
      [from, to, this.dbTag],
    );
    return { ownWalBytes: Number(r.rows[0]!.bytes), ownWriteCommits: Number(r.rows[0]!.commits) };
  }

  /** Start the measured window right after a checkpoint, so no timed checkpoint lands inside it. */
  async checkpoint(): Promise<void> {
    await this.client.query('CHECKPOINT');
  }

  async serverInfo(): Promise<ServerInfo> {
    const v = await this.client.query<{ v: string }>("SELECT current_setting('server_version') AS v");
    const names = [
      'synchronous_commit',
      'fsync',
      'shared_buffers',
      'max_wal_size',
      'checkpoint_timeout',
      'autovacuum',
      'wal_level',
      'max_connections',
      'work_mem',
      'shared_preload_libraries',
    ];
    const s = await this.client.query<{ name: string; setting: string; unit: string | null }>(
      'SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1)',
      [names],
    );
    const settings: Record<string, string> = {};
    for (const row of s.rows)
      settings[row.name] = row.setting === '' ? "''" : row.unit ? `${row.setting} ${row.unit}` : row.setting;
    return { version: v.rows[0]!.v, settings };
  }

  async close(): Promise<void> {
    await this.client.end();
  }
}
