/**
 * A pg_auto_failover formation of the test's own (Debian package postgresql-15-auto-failover):
 * a monitor and two Postgres nodes, each a `pg_autoctl ... --run` process on a free local port
 * in a temporary directory, so a test can crash the primary and let the monitor promote the
 * standby. The shared test server is never touched.
 *
 * As root the processes run as the `postgres` OS user (initdb refuses root), as
 * test/support/cluster.ts does. Each runs in a process group of its own: a crash of a node is a
 * SIGKILL of its group (pg_autoctl, its keeper and its postmaster with it), and cleanup ends
 * every group and every postmaster left.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import {
  chownSync,
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort, PG_BIN, serverIdentity } from './cluster.js';

/** Where pg_autoctl is: $BERTH_PG_AUTOCTL, else on PATH (the Debian package installs /usr/bin/pg_autoctl). */
export function pgAutoctlPath(): string | null {
  const explicit = process.env.BERTH_PG_AUTOCTL;
  if (explicit) return existsSync(explicit) ? explicit : null;
  for (const dir of (process.env.PATH ?? '').split(':')) {
    if (dir && existsSync(join(dir, 'pg_autoctl'))) return join(dir, 'pg_autoctl');
  }
  return null;
}

/** Why the formation cannot run here, or null when it can (pg_autoctl and the monitor's extension exist). */
export function autoFailoverMissing(): string | null {
  if (!pgAutoctlPath())
    return 'pg_autoctl is not installed (Debian: postgresql-15-auto-failover; scripts/test-prereqs.sh installs it)';
  const control = execFileSync(join(PG_BIN, 'pg_config'), ['--sharedir']).toString().trim();
  if (!existsSync(join(control, 'extension', 'pgautofailover.control')))
    return `the pgautofailover extension is not installed for ${PG_BIN} (Debian: postgresql-15-auto-failover)`;
  return null;
}

export interface NodeState {
  name: string;
  port: number;
  reported: string;
  goal: string;
}

/**
 * The monitor's health checks, tightened so a crashed primary is declared unhealthy and its
 * standby promoted within seconds rather than the defaults' half a minute (health checks every
 * 5 s, 20 s until unhealthy, 30 s waiting for the old primary to demote).
 */
const MONITOR_SETTINGS: Record<string, string> = {
  'pgautofailover.health_check_period': '1000',
  'pgautofailover.health_check_timeout': '1000',
  'pgautofailover.health_check_max_retries': '1',
  'pgautofailover.health_check_retry_delay': '500',
  'pgautofailover.node_considered_unhealthy_timeout': '2000',
  'pgautofailover.primary_demote_timeout': '3000',
  'pgautofailover.startup_grace_period': '1000',
};

const NODE_SETTINGS = [
  'ALTER SYSTEM SET checkpoint_completion_target = 0',
  'ALTER SYSTEM SET fsync = off',
  'ALTER SYSTEM SET full_page_writes = off',
];

export class Formation {
  /** The database the nodes serve. */
  static readonly DATABASE = 'berth';
  private readonly processes = new Map<string, ChildProcess>();
  private readonly ports = new Map<string, number>();
  private readonly exitGuard = () => this.killAllSync();
  private monitor: pg.Pool | null = null;

  private constructor(
    readonly dir: string,
    private readonly identity: { uid: number; gid: number } | null,
    private readonly bin: string,
  ) {}

  /**
   * A monitor and two nodes, node1 primary and node2 its standby. `synchronous: false` registers
   * both with replication-quorum false (asynchronous streaming); the default is the manager's:
   * synchronous to the one standby.
   */
  static async create(options: { synchronous?: boolean } = {}): Promise<Formation> {
    const bin = pgAutoctlPath();
    if (!bin) throw new Error('pg_autoctl is not installed');
    const dir = mkdtempSync(join(tmpdir(), 'berth-formation-'));
    const identity = serverIdentity();
    const f = new Formation(dir, identity, bin);
    process.on('exit', f.exitGuard);
    try {
      for (const sub of ['config', 'share', 'run']) mkdirSync(join(dir, sub));
      if (identity) for (const p of ['', 'config', 'share', 'run']) chownSync(join(dir, p), identity.uid, identity.gid);
      const monitorPort = await freePort();
      f.ports.set('monitor', monitorPort);
      f.start('monitor', [
        'create',
        'monitor',
        '--pgdata',
        join(dir, 'monitor'),
        '--pgport',
        String(monitorPort),
        '--hostname',
        '127.0.0.1',
        '--auth',
        'trust',
        '--no-ssl',
        '--run',
      ]);
      f.monitor = new pg.Pool({
        connectionString: `postgres://postgres@127.0.0.1:${monitorPort}/pg_auto_failover`,
        max: 2,
      });
      f.monitor.on('error', () => undefined);
      await f.until('the monitor', async () => {
        const r = await f.monitor!.query(`SELECT 1 FROM pg_extension WHERE extname = 'pgautofailover'`);
        return r.rowCount === 1;
      });
      for (const [k, v] of Object.entries(MONITOR_SETTINGS)) await f.monitor.query(`ALTER SYSTEM SET ${k} = '${v}'`);
      await f.monitor.query('SELECT pg_reload_conf()');
      const quorum = options.synchronous === false ? ['--replication-quorum', 'false'] : [];
      await f.addNode('node1', quorum);
      await f.until('node1 to run alone as primary', async () =>
        (await f.states()).some((s) => s.name === 'node1' && s.reported === 'single'),
      );
      // Before the standby's base backup: pg_basebackup waits for a spread checkpoint (95 s
      // measured at the defaults); fsync off as in test/support/cluster.ts (a server crash loses
      // nothing acknowledged; only an OS crash would). The standby copies both settings.
      const node1 = new pg.Client({ connectionString: `postgres://postgres@127.0.0.1:${f.port('node1')}/postgres` });
      node1.on('error', () => undefined);
      await node1.connect();
      try {
        for (const sql of NODE_SETTINGS) await node1.query(sql);
        await node1.query('SELECT pg_reload_conf()');
      } finally {
        await node1.end().catch(() => undefined);
      }
      await f.addNode('node2', quorum);
      await f.until('node1 primary and node2 secondary', async () => {
        const s = await f.states();
        return (
          s.some((n) => n.name === 'node1' && n.reported === 'primary' && n.goal === 'primary') &&
          s.some((n) => n.name === 'node2' && n.reported === 'secondary' && n.goal === 'secondary')
        );
      });
      return f;
    } catch (err) {
      const logs = f.logs();
      await f.destroy();
      throw new Error(`the formation did not start: ${String(err)}\n${logs}`);
    }
  }

  /** The formation's URI as the monitor gives it (every node, target_session_attrs=read-write), as user postgres. */
  async uri(): Promise<string> {
    const r = await this.monitor!.query<{ uri: string }>(
      `SELECT pgautofailover.formation_uri('default', 'default', 'disable') AS uri`,
    );
    return (r.rows[0]?.uri ?? '').replace('postgres://', 'postgres://postgres@');
  }

  /** Every node as the monitor sees it. */
  async states(): Promise<NodeState[]> {
    const r = await this.monitor!.query<{ name: string; port: number; reported: string; goal: string }>(
      `SELECT nodename AS name, nodeport AS port, reportedstate::text AS reported, goalstate::text AS goal
         FROM pgautofailover.node ORDER BY nodeid`,
    );
    return r.rows;
  }

  /**
   * The node the monitor has as primary, if one is: assigned and reporting primary (or
   * wait_primary, a primary without a standby). A crashed node's last report stays what it was,
   * so the assignment decides.
   */
  async primary(): Promise<NodeState | undefined> {
    return (await this.states()).find(
      (s) => (s.goal === 'primary' || s.goal === 'wait_primary') && s.reported === s.goal,
    );
  }

  /**
   * Crash a node as a machine dies: SIGKILL to its pg_autoctl process group (the keeper that
   * would restart Postgres, and Postgres) and to its postmaster. A killed postmaster alone is
   * restarted in place by its keeper, and nothing fails over.
   */
  crash(name: string): void {
    // The node's every PostgreSQL process, as a machine crash stops them: a backend outlives a
    // SIGKILLed postmaster until it next checks for it, and went on answering (a claim, an
    // enqueue acknowledged by the standby) for a few hundred ms after the crash, which the
    // test's fault window did not cover.
    const pid = this.postmasterPid(name);
    // Stopped first, so that it starts no backend between the listing and the kill.
    if (pid !== null) signalPid(pid, 'SIGSTOP');
    const backends = pid === null ? [] : childrenOf(pid);
    const child = this.processes.get(name);
    if (child?.pid) signalGroup(child.pid, 'SIGKILL');
    if (pid !== null) signalPid(pid, 'SIGKILL');
    for (const b of backends) signalPid(b, 'SIGKILL');
  }

  /** Port of a node or the monitor. */
  port(name: string): number {
    const p = this.ports.get(name);
    if (p === undefined) throw new Error(`no node ${name}`);
    return p;
  }

  /** The tail of every process's output, for a failure report. */
  logs(lines = 25): string {
    return [...this.processes.keys()]
      .map((name) => {
        const file = join(this.dir, `${name}.log`);
        const text = existsSync(file) ? readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n') : '';
        return `--- ${name} ---\n${text}`;
      })
      .join('\n');
  }

  /** Stop everything (SIGTERM, then SIGKILL), remove the directory. Safe to call twice. */
  async destroy(): Promise<void> {
    process.off('exit', this.exitGuard);
    await this.monitor?.end().catch(() => undefined);
    this.monitor = null;
    const running = [...this.processes.values()].filter((c) => c.exitCode === null && c.signalCode === null);
    for (const c of running) if (c.pid) signalGroup(c.pid, 'SIGTERM');
    await Promise.race([
      Promise.all(
        running.map(
          (c) => new Promise((r) => (c.exitCode !== null || c.signalCode !== null ? r(null) : c.once('exit', r))),
        ),
      ),
      new Promise((r) => setTimeout(r, 15_000)),
    ]);
    this.killAllSync();
    rmSync(this.dir, { recursive: true, force: true });
  }

  private async addNode(name: string, extra: string[]): Promise<void> {
    const port = await freePort();
    this.ports.set(name, port);
    this.start(name, [
      'create',
      'postgres',
      '--pgdata',
      join(this.dir, name),
      '--pgport',
      String(port),
      '--pghost',
      '127.0.0.1',
      '--hostname',
      '127.0.0.1',
      '--name',
      name,
      '--dbname',
      Formation.DATABASE,
      '--auth',
      'trust',
      '--no-ssl',
      '--monitor',
      `postgres://autoctl_node@127.0.0.1:${this.port('monitor')}/pg_auto_failover?sslmode=disable`,
      ...extra,
      '--run',
    ]);
  }

  /** Spawn `pg_autoctl args` as the server's user, in a process group of its own, output to <name>.log. */
  private start(name: string, args: string[]): void {
    const fd = openSync(join(this.dir, `${name}.log`), 'a');
    // `create monitor|postgres --pgctl`: the server binaries of PG_BIN, whatever else is on PATH.
    const child = spawn(this.bin, [...args.slice(0, 2), '--pgctl', join(PG_BIN, 'pg_ctl'), ...args.slice(2)], {
      cwd: this.dir,
      detached: true,
      stdio: ['ignore', fd, fd],
      ...(this.identity ?? {}),
      env: {
        ...process.env,
        LC_ALL: 'C',
        PATH: `${PG_BIN}:${process.env.PATH ?? ''}`,
        XDG_CONFIG_HOME: join(this.dir, 'config'),
        XDG_DATA_HOME: join(this.dir, 'share'),
        XDG_RUNTIME_DIR: join(this.dir, 'run'),
        HOME: this.dir,
      },
    });
    closeSync(fd);
    child.on('error', () => undefined);
    this.processes.set(name, child);
  }

  private async until(what: string, check: () => Promise<boolean>, timeoutMs = 120_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last: unknown = null;
    for (;;) {
      try {
        if (await check()) return;
      } catch (err) {
        last = err;
      }
      for (const [name, c] of this.processes)
        if (c.exitCode !== null) throw new Error(`pg_autoctl ${name} exited (${c.exitCode}) while waiting for ${what}`);
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last error: ${String(last)})`);
      await new Promise((r) => setTimeout(r, 250));
    }
  }

  private postmasterPid(name: string): number | null {
    const file = join(this.dir, name, 'postmaster.pid');
    if (!existsSync(file)) return null;
    const pid = Number(readFileSync(file, 'utf8').split('\n')[0]);
    return Number.isInteger(pid) && pid > 0 ? pid : null;
  }

  /** Last resort: SIGKILL every process group and postmaster of the formation. */
  private killAllSync(): void {
    for (const c of this.processes.values()) if (c.pid) signalGroup(c.pid, 'SIGKILL');
    for (const name of this.processes.keys()) {
      const pid = this.postmasterPid(name);
      if (pid !== null) signalPid(pid, 'SIGKILL');
    }
  }
}

/** The processes whose parent is `pid` (Linux: /proc/<pid>/stat's fourth field). */
function childrenOf(pid: number): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      // The command name (second field) is in parentheses and may hold spaces.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) found.push(Number(entry));
    } catch {
      // Gone meanwhile.
    }
  }
  return found;
}

function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    // Already gone.
  }
}

function signalPid(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // Already gone.
  }
}
