/**
 * A throwaway PostgreSQL cluster for a benchmark that must not share a server: initdb in a
 * temporary directory, started on a free port with the machine's server binaries, stopped and
 * removed at the end. Nothing it does can reach the shared server or its sessions.
 */
import { execFileSync } from 'node:child_process';
import { chownSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = process.env.PG_BIN ?? '/usr/lib/postgresql/15/bin';

export interface Cluster {
  /** URL of the cluster's `postgres` database (trust auth, user postgres). */
  url: string;
  port: number;
  stop(): void;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** initdb refuses to run as root; as root, the server runs as the `postgres` OS user. */
function run(bin: string, args: string[]): void {
  const asRoot = process.getuid?.() === 0;
  const [cmd, argv] = asRoot ? ['runuser', ['-u', 'postgres', '--', join(BIN, bin), ...args]] : [join(BIN, bin), args];
  execFileSync(cmd, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
}

export async function startCluster(settings: Record<string, string | number> = {}): Promise<Cluster> {
  const dir = mkdtempSync(join(tmpdir(), 'berth-bench-cluster-'));
  if (process.getuid?.() === 0) {
    const uid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim());
    const gid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim());
    chownSync(dir, uid, gid);
  }
  const data = join(dir, 'data');
  const port = await freePort();
  run('initdb', ['-D', data, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--no-sync']);
  const opts = Object.entries({ port, listen_addresses: '127.0.0.1', unix_socket_directories: dir, fsync: 'off', ...settings })
    .map(([k, v]) => `-c ${k}=${v}`)
    .join(' ');
  run('pg_ctl', ['-D', data, '-l', join(dir, 'log'), '-o', opts, '-w', 'start']);
  let stopped = false;
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    stop() {
      if (stopped) return;
      stopped = true;
      try {
        run('pg_ctl', ['-D', data, '-m', 'immediate', '-w', 'stop']);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  };
}
