/**
 * A PostgreSQL cluster of the test's own: initdb in a temporary directory, on a free port, with
 * the machine's server binaries. A test may stop, crash and restart it freely; the shared test
 * server (127.0.0.1:5432) is never touched.
 *
 * As root (the CI container), initdb refuses to run, so the cluster runs as the `postgres` OS
 * user: its directory is chowned to that user and every server binary is spawned with its
 * uid/gid. As any other user, the cluster runs as that user.
 */
import { execFileSync, spawn } from 'node:child_process';
import {
  appendFileSync,
  chownSync,
  closeSync,
  existsSync,
  fchownSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const PG_BIN = process.env.BERTH_PG_BIN ?? '/usr/lib/postgresql/15/bin';

export type StopMode = 'smart' | 'fast' | 'immediate';

/** A free TCP port on 127.0.0.1 (bound to port 0, then released: another process may take it; start() retries). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

/** uid/gid the server runs as: the `postgres` OS user when we are root, else ourselves. */
export function serverIdentity(): { uid: number; gid: number } | null {
  if (process.getuid?.() !== 0) return null;
  const uid = Number(execFileSync('id', ['-u', 'postgres']).toString().trim());
  const gid = Number(execFileSync('id', ['-g', 'postgres']).toString().trim());
  return { uid, gid };
}

export class TestCluster {
  /** The server log (pg_ctl -l), for failure reports. */
  readonly logFile: string;
  private readonly dataDir: string;
  private readonly socketDir: string;
  private running = false;
  private readonly exitGuard = () => this.stopSync();

  private constructor(
    readonly dir: string,
    private portNumber: number,
    private readonly identity: { uid: number; gid: number } | null,
  ) {
    this.dataDir = join(dir, 'data');
    this.socketDir = join(dir, 'sock');
    this.logFile = join(dir, 'server.log');
  }

  /** initdb a new cluster and start it. Call destroy() when done (in an after() hook). */
  static async create(options: { settings?: Record<string, string | number> } = {}): Promise<TestCluster> {
    const identity = serverIdentity();
    const dir = mkdtempSync(join(tmpdir(), 'berth-cluster-'));
    const cluster = new TestCluster(dir, await freePort(), identity);
    try {
      mkdirSync(cluster.socketDir);
      if (identity) for (const p of [dir, cluster.socketDir]) chownSync(p, identity.uid, identity.gid);
      // --no-sync: nothing here needs to survive an OS crash, and syncing the catalog costs seconds.
      await cluster.run('initdb', ['-D', cluster.dataDir, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--no-sync']);
      const settings: Record<string, string | number> = {
        listen_addresses: "'127.0.0.1'",
        unix_socket_directories: `'${cluster.socketDir}'`,
        max_connections: 200,
        shared_buffers: "'32MB'",
        // A test cluster: fsync=off and full_page_writes=off are safe against a server crash
        // (stop -m immediate), which only loses what never reached the OS; they would lose data
        // only in an OS crash, which no test makes. synchronous_commit stays on: an immediate
        // stop must not drop commits the clients were told about.
        fsync: 'off',
        full_page_writes: 'off',
        log_min_messages: 'warning',
        log_line_prefix: "'%m [%p] %a '",
        ...options.settings,
      };
      appendFileSync(
        join(cluster.dataDir, 'postgresql.conf'),
        Object.entries(settings)
          .map(([k, v]) => `${k} = ${v}\n`)
          .join(''),
      );
      process.on('exit', cluster.exitGuard);
      await cluster.start();
      return cluster;
    } catch (err) {
      await cluster.destroy();
      throw err;
    }
  }

  get port(): number {
    return this.portNumber;
  }

  /** A connection string for `database` on this cluster (user postgres, trust). */
  url(database = 'postgres'): string {
    return `postgres://postgres@127.0.0.1:${this.portNumber}/${database}`;
  }

  /** Start the server (waits until it accepts connections). Retries on another port if ours was taken. */
  async start(): Promise<void> {
    for (let tries = 0; ; tries++) {
      try {
        await this.pgCtl(['start', '-w', '-t', '300', '-l', this.logFile, '-o', `-p ${this.portNumber}`]);
        this.running = true;
        return;
      } catch (err) {
        const log = this.logTail();
        if (tries < 3 && /could not bind|Address already in use/.test(log)) {
          this.portNumber = await freePort();
          continue;
        }
        throw err;
      }
    }
  }

  /** pg_ctl stop -m mode (immediate is a crash: no checkpoint, recovery on the next start). */
  async stop(mode: StopMode = 'fast'): Promise<void> {
    await this.pgCtl(['stop', '-w', '-t', '300', '-m', mode]);
    this.running = false;
  }

  /** pg_ctl restart -m mode, on the same port. */
  async restart(mode: StopMode = 'fast'): Promise<void> {
    await this.pgCtl(['restart', '-w', '-t', '300', '-m', mode, '-l', this.logFile, '-o', `-p ${this.portNumber}`]);
    this.running = true;
  }

  /** The last lines of the server log. */
  logTail(lines = 30): string {
    if (!existsSync(this.logFile)) return '';
    return readFileSync(this.logFile, 'utf8').split('\n').slice(-lines).join('\n');
  }

  /** Stop the server (immediately) and remove its directory. Safe to call twice, and after a failed create. */
  async destroy(): Promise<void> {
    process.off('exit', this.exitGuard);
    if (this.running || existsSync(join(this.dataDir, 'postmaster.pid'))) {
      await this.pgCtl(['stop', '-w', '-t', '60', '-m', 'immediate']).catch(() => undefined);
      this.running = false;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }

  /** Last resort when the test process exits without its after() hook: never leave a server behind. */
  private stopSync(): void {
    try {
      if (existsSync(join(this.dataDir, 'postmaster.pid'))) {
        execFileSync(join(PG_BIN, 'pg_ctl'), ['stop', '-D', this.dataDir, '-m', 'immediate', '-w'], {
          stdio: 'ignore',
          ...this.identity,
        });
      }
      rmSync(this.dir, { recursive: true, force: true });
    } catch {
      // Exiting anyway.
    }
  }

  private pgCtl(args: string[]): Promise<void> {
    return this.run('pg_ctl', ['-D', this.dataDir, ...args]);
  }

  /** Run a server binary as the server's user; rejects with its output on a non-zero exit. */
  private run(binary: string, args: string[]): Promise<void> {
    // Output goes to a file, not a pipe: the postmaster that pg_ctl start leaves running must
    // not hold a pipe of ours open.
    const out = join(this.dir, `${binary}.out`);
    const fd = openSync(out, 'w');
    if (this.identity) fchownSync(fd, this.identity.uid, this.identity.gid);
    return new Promise<void>((resolve, reject) => {
      const child = spawn(join(PG_BIN, binary), args, {
        cwd: this.dir,
        stdio: ['ignore', fd, fd],
        ...(this.identity ?? {}),
        env: { ...process.env, LC_ALL: 'C' },
      });
      child.once('error', reject);
      child.once('exit', (code, signal) => {
        if (code === 0) return resolve();
        reject(
          new Error(
            `${binary} ${args.join(' ')} failed (${code ?? signal}):\n${readFileSync(out, 'utf8')}\n${this.logTail()}`,
          ),
        );
      });
    }).finally(() => closeSync(fd));
  }
}
