/**
 * A PgBouncer of the test's own: its ini, auth file, log and pid file in a temporary directory,
 * on a free port, in front of an existing server (the shared test server's database: PgBouncer
 * only opens ordinary connections to it, so it disturbs nothing). Each `pools` entry becomes a
 * database alias with its own pool mode and size, so one process serves every mode a test needs.
 *
 * PgBouncer refuses to run as root: as root (the CI container) it runs as the `postgres` OS user,
 * as the clusters of cluster.ts do, and its directory is chowned to that user.
 */
import { after } from 'node:test';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freePort, serverIdentity } from './cluster.js';

/** Where Debian puts the binary (not on a non-root PATH), else PATH's. */
export function pgbouncerBinary(): string | null {
  for (const candidate of [process.env.BERTH_PGBOUNCER, '/usr/sbin/pgbouncer']) {
    if (candidate && existsSync(candidate)) return candidate;
  }
  try {
    return execFileSync('sh', ['-c', 'command -v pgbouncer']).toString().trim() || null;
  } catch {
    return null;
  }
}

export interface PoolSpec {
  mode: 'session' | 'transaction';
  /** Server connections of this alias (PgBouncer's pool_size). */
  size: number;
}

export class TestPgBouncer {
  private stopped = false;
  private readonly exitGuard = () => this.child.kill('SIGKILL');

  private constructor(
    private readonly child: ChildProcess,
    private readonly dir: string,
    readonly port: number,
    private readonly user: string,
  ) {}

  /**
   * Start PgBouncer in front of `upstream` (a postgres:// URL, trust or no password) with one
   * alias per entry of `pools`. Resolves once it accepts connections.
   */
  static async start(upstream: string, pools: Record<string, PoolSpec>): Promise<TestPgBouncer> {
    const binary = pgbouncerBinary();
    if (binary === null) throw new Error('pgbouncer is not installed (scripts/test-prereqs.sh installs it)');
    const url = new URL(upstream);
    const user = decodeURIComponent(url.username) || 'postgres';
    const database = decodeURIComponent(url.pathname.slice(1)) || user;
    const dir = mkdtempSync(join(tmpdir(), 'berth-pgbouncer-'));
    const port = await freePort();
    const server = `host=${url.hostname} port=${url.port || 5432} dbname=${database} user=${user}`;
    writeFileSync(join(dir, 'userlist.txt'), `"${user}" ""\n`);
    writeFileSync(
      join(dir, 'pgbouncer.ini'),
      [
        '[databases]',
        ...Object.entries(pools).map(([alias, p]) => `${alias} = ${server} pool_mode=${p.mode} pool_size=${p.size}`),
        '[pgbouncer]',
        'listen_addr = 127.0.0.1',
        `listen_port = ${port}`,
        'unix_socket_dir =',
        'auth_type = trust',
        `auth_file = ${join(dir, 'userlist.txt')}`,
        `logfile = ${join(dir, 'pgbouncer.log')}`,
        `pidfile = ${join(dir, 'pgbouncer.pid')}`,
        'max_client_conn = 500',
        // What berth's worker sends at connect (statement_timeout, and options with its planner
        // settings): refused by default, dropped when listed here (docs/operations.md).
        'ignore_startup_parameters = extra_float_digits,options,statement_timeout',
        // A client waiting for a server connection longer than this fails instead of hanging a test.
        'query_wait_timeout = 60',
        '',
      ].join('\n'),
    );
    const identity = serverIdentity();
    if (identity)
      for (const f of ['', 'userlist.txt', 'pgbouncer.ini']) chownSync(join(dir, f), identity.uid, identity.gid);
    const child = spawn(binary, [join(dir, 'pgbouncer.ini')], {
      stdio: ['ignore', 'ignore', 'pipe'],
      ...(identity ?? {}),
    });
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    const bouncer = new TestPgBouncer(child, dir, port, user);
    process.on('exit', bouncer.exitGuard);
    try {
      const deadline = Date.now() + 30_000;
      while (!(await accepts(port))) {
        if (child.exitCode !== null)
          throw new Error(`pgbouncer exited (${child.exitCode}): ${stderr}${bouncer.logTail()}`);
        if (Date.now() > deadline) throw new Error(`pgbouncer did not listen within 30 s: ${bouncer.logTail()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      return bouncer;
    } catch (err) {
      await bouncer.stop();
      throw err;
    }
  }

  /** A connection string for one of the aliases. */
  url(alias: string): string {
    return `postgres://${encodeURIComponent(this.user)}@127.0.0.1:${this.port}/${alias}`;
  }

  logTail(lines = 20): string {
    const file = join(this.dir, 'pgbouncer.log');
    if (!existsSync(file)) return '';
    return readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  }

  /** Stop it (SIGINT: PgBouncer's immediate shutdown) and remove its directory. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    process.removeListener('exit', this.exitGuard);
    if (this.child.exitCode === null && this.child.signalCode === null) {
      const exited = new Promise((r) => this.child.once('exit', r));
      this.child.kill('SIGINT');
      const timer = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/** What a test file opens through its PgBouncer: ended before it stops. */
interface Closable {
  end(): Promise<unknown>;
}

/**
 * A test file's PgBouncer in front of `upstream`, stopped when the file ends (after whatever
 * was passed to `closeAtEnd`), with `skip`: the reason its tests skip when PgBouncer is not
 * installed (then `bouncer` is null), else false.
 */
export async function fileBouncer(
  upstream: string,
  pools: Record<string, PoolSpec>,
): Promise<{ bouncer: TestPgBouncer | null; skip: string | false; closeAtEnd: <C extends Closable>(c: C) => C }> {
  const opened: Closable[] = [];
  const closeAtEnd = <C extends Closable>(c: C): C => {
    opened.push(c);
    return c;
  };
  if (pgbouncerBinary() === null)
    return { bouncer: null, skip: 'pgbouncer is not installed (scripts/test-prereqs.sh installs it)', closeAtEnd };
  const bouncer = await TestPgBouncer.start(upstream, pools);
  after(async () => {
    for (const c of opened) await c.end().catch(() => undefined);
    await bouncer.stop();
  });
  return { bouncer, skip: false, closeAtEnd };
}
