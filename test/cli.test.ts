import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { LATEST_SCHEMA_VERSION } from '../src/index.js';
import { DATABASE_URL } from './helpers.js';

const cli = fileURLToPath(new URL('../src/cli.ts', import.meta.url));
const run = (args: string[], env: Record<string, string | undefined> = {}) =>
  spawnSync(process.execPath, ['--import', 'tsx', cli, ...args], { encoding: 'utf8', env: { ...process.env, ...env } });

test('berth migrate applies, is idempotent, prints JSON on request', async () => {
  const schema = `t_cli_${process.pid}`;
  const pool = new pg.Pool({ connectionString: DATABASE_URL });
  try {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    const first = run(['migrate', '--schema', schema, '--database-url', DATABASE_URL]);
    assert.equal(first.status, 0, first.stderr);
    assert.match(first.stdout, /migrated from 0 to/);
    const again = run(['migrate', '--schema', schema, '--json'], { DATABASE_URL });
    assert.equal(again.status, 0, again.stderr);
    const report = JSON.parse(again.stdout);
    assert.deepEqual(report.applied, []);
    assert.equal(report.to, LATEST_SCHEMA_VERSION);
  } finally {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await pool.end();
  }
});

test('berth exits 2 with a clear message on bad usage or config', () => {
  const noDb = run(['migrate'], { DATABASE_URL: '' });
  assert.equal(noDb.status, 2);
  assert.match(noDb.stderr, /--database-url or set DATABASE_URL/);
  const badSchema = run(['migrate', '--schema', 'x;drop', '--database-url', DATABASE_URL]);
  assert.equal(badSchema.status, 2);
  assert.match(badSchema.stderr, /schema must be a plain identifier/);
  const unknown = run(['frobnicate']);
  assert.equal(unknown.status, 2);
  const help = run(['migrate', '--help']);
  assert.equal(help.status, 0);
  assert.match(help.stdout, /--schema/);
});

test('berth migrate exits 1 when the database is unreachable', () => {
  const r = run(['migrate', '--database-url', 'postgres://postgres@127.0.0.1:1/none']);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /^berth: /);
});

test('the installed bin (a symlink, as npm links node_modules/.bin/berth) runs the CLI; --version', () => {
  const dir = mkdtempSync(join(tmpdir(), 'berth-bin-'));
  const link = join(dir, 'berth');
  symlinkSync(cli, link);
  const help = spawnSync(process.execPath, ['--import', 'tsx', link, '--help'], { encoding: 'utf8' });
  assert.equal(help.status, 0, help.stderr);
  assert.match(help.stdout, /Usage: berth/);
  const version = spawnSync(process.execPath, ['--import', 'tsx', link, '--version'], { encoding: 'utf8' });
  assert.match(version.stdout, /^\d+\.\d+\.\d+/);
});
