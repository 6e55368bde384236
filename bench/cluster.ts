/**
 * A throwaway PostgreSQL cluster for benchmarks: `initdb` in a temporary directory, started on a
 * free port with stock settings (only port, socket directory and listen address are set, plus
 * whatever the caller passes), stopped and deleted by `stop()` or, failing that, when the process
 * exits or is interrupted. The shared server runs with autovacuum off, which no user has; a
 * benchmark on it measures a configuration nobody runs.
 *
 *   const cluster = await startCluster({ settings: {} });
 *   try { ... cluster.url ... } finally { await cluster.stop(); }
 *
 * As root, every server binary runs as the `postgres` OS user (initdb refuses root), and the
 * temporary directory is handed to that user.
 */
import { execFile, execFileSync } from 'node:child_process';
import { appendFileSync, chownSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface ClusterOptions {
  /** Extra `postgresql.conf` settings (name → value); none by default. */
  settings?: Readonly<Record<string, string | number | boolean>>;
  /** Server binaries (default BENCH_PG_BIN or /usr/lib/postgresql/15/bin). */
  binDir?: string;
}

export interface Cluster {
  /** Superuser URL over TCP to the `postgres` database (trust auth). */
  readonly url: string;
  readonly port: number;
  readonly dataDir: string;
  /** Fast shutdown, then the directory is deleted. Idempotent. */
  stop(): Promise<void>;
}

interface Live {
  base: string;
  data: string;
  binDir: string;
}

/** Clusters not yet stopped, for the exit and signal hooks. */
const live = new Set<Live>();
let hooksInstalled = false;

function runAsPostgres(): boolean {
  return process.getuid?.() === 0;
}

/** argv for a server binary, run as `postgres` when we are root. */
function command(l: Pick<Live, 'binDir'>, bin: string, args: string[]): [string, string[]] {
  const path = join(l.binDir, bin);
  return runAsPostgres() ? ['runuser', ['-u', 'postgres', '--', path, ...args]] : [path, args];
}

function confValue(v: string | number | boolean): string {
  if (typeof v === 'number') return String(v);
  if (typeof v === 'boolean') return v ? 'on' : 'off';
  return `'${v.replace(/\\/g, '\\\\').replace(/'/g, "''")}'`;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (addr && typeof addr === 'object' ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

/** Synchronous last-resort cleanup (exit hooks cannot wait): immediate shutdown, delete. */
function killNow(l: Live): void {
  live.delete(l);
  try {
    const [cmd, args] = command(l, 'pg_ctl', ['stop', '-D', l.data, '-m', 'immediate', '-w', '-t', '30']);
    execFileSync(cmd, args, { stdio: 'ignore' });
  } catch {
    // Not running (never started, or already stopped).
  }
  rmSync(l.base, { recursive: true, force: true });
}

function installHooks(): void {
  if (hooksInstalled) return;
  hooksInstalled = true;
  process.on('exit', () => {
    for (const l of [...live]) killNow(l);
  });
  const signals = { SIGINT: 130, SIGTERM: 143, SIGHUP: 129 } as const;
  for (const [signal, code] of Object.entries(signals)) {
    process.on(signal, () => {
      if (live.size > 0) process.stderr.write(`\n${signal}: stopping and removing ${live.size} benchmark cluster(s)\n`);
      for (const l of [...live]) killNow(l);
      process.exit(code);
    });
  }
}

export async function startCluster(options: ClusterOptions = {}): Promise<Cluster> {
  const binDir = options.binDir ?? (process.env.BENCH_PG_BIN || '/usr/lib/postgresql/15/bin');
  if (!existsSync(join(binDir, 'initdb'))) throw new Error(`no initdb in ${binDir} (set BENCH_PG_BIN)`);
  installHooks();
  const base = mkdtempSync(join(tmpdir(), 'berth-bench-pg-'));
  const l: Live = { base, data: join(base, 'data'), binDir };
  live.add(l);
  try {
    if (runAsPostgres()) {
      const uid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim());
      const gid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim());
      chownSync(base, uid, gid);
    }
    // Locale and encoding as on the shared server (C.UTF-8, UTF8); --no-sync only skips
    // initdb's final fsync of a directory that is deleted afterwards.
    const [icmd, iargs] = command(l, 'initdb', [
      '-D',
      l.data,
      '-U',
      'postgres',
      '--auth=trust',
      '--encoding=UTF8',
      '--locale=C.UTF-8',
      '--no-sync',
    ]);
    await run(icmd, iargs);
    let lastError: unknown;
    for (let attempt = 0; attempt < 3; attempt++) {
      const port = await freePort();
      const settings: Record<string, string | number | boolean> = {
        port,
        listen_addresses: '127.0.0.1',
        unix_socket_directories: base,
        ...options.settings,
      };
      // Appended, so these lines win over initdb's defaults above them; rewritten per attempt.
      const conf = join(l.data, 'postgresql.conf');
      appendFileSync(
        conf,
        `\n# berth bench cluster (attempt ${attempt + 1})\n${Object.entries(settings)
          .map(([k, v]) => `${k} = ${confValue(v)}`)
          .join('\n')}\n`,
      );
      const [scmd, sargs] = command(l, 'pg_ctl', [
        'start',
        '-D',
        l.data,
        '-l',
        join(base, 'server.log'),
        '-w',
        '-t',
        '120',
      ]);
      try {
        await run(scmd, sargs);
        const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
        return {
          url,
          port,
          dataDir: l.data,
          stop: async () => {
            if (!live.has(l)) return;
            try {
              const [cmd, args] = command(l, 'pg_ctl', ['stop', '-D', l.data, '-m', 'fast', '-w', '-t', '60']);
              await run(cmd, args);
              live.delete(l);
              rmSync(l.base, { recursive: true, force: true });
            } finally {
              if (live.has(l)) killNow(l);
            }
          },
        };
      } catch (err) {
        lastError = err; // most likely the port was taken between the probe and the start
      }
    }
    const log = existsSync(join(base, 'server.log')) ? readFileSync(join(base, 'server.log'), 'utf8').slice(-2000) : '';
    throw new Error(`could not start the benchmark cluster: ${(lastError as Error).message}\n${log}`);
  } catch (err) {
    killNow(l);
    throw err;
  }
}
