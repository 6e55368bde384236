import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { migrate, SchemaTooNewError, LATEST_SCHEMA_VERSION } from '../src/index.js';
import { MIGRATIONS } from '../src/schema/migrations.js';
import { DATABASE_URL, freshSchema } from './helpers.js';

// Versions may have gaps while branches land (each migration number is assigned up front).
const MIGRATION_COUNT = MIGRATIONS.length;

test('migrate is idempotent and reports what it applied', async () => {
  const { schema, pool } = await freshSchema('migrate');
  const again = await migrate({ connectionString: DATABASE_URL, schema });
  assert.deepEqual(again.applied, []);
  assert.equal(again.from, LATEST_SCHEMA_VERSION);
  const rows = await pool.query(`SELECT version FROM "${schema}".schema_migrations ORDER BY version`);
  assert.equal(rows.rowCount, MIGRATION_COUNT);
});

test('a fresh schema reports every migration applied', async () => {
  const schema = `t_migrate_fresh_${process.pid}`;
  const pool = new pg.Pool({ connectionString: DATABASE_URL });
  try {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    const report = await migrate({ connectionString: DATABASE_URL, schema });
    assert.equal(report.from, 0);
    assert.equal(report.to, LATEST_SCHEMA_VERSION);
    assert.equal(report.applied[0]?.version, 1);
  } finally {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await pool.end();
  }
});

test('concurrent migrators apply each migration once', async () => {
  const schema = `t_migrate_race_${process.pid}`;
  const pool = new pg.Pool({ connectionString: DATABASE_URL });
  try {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    const reports = await Promise.all([1, 2, 3].map(() => migrate({ connectionString: DATABASE_URL, schema })));
    assert.equal(
      reports.reduce((n, r) => n + r.applied.length, 0),
      MIGRATION_COUNT,
    );
  } finally {
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await pool.end();
  }
});

test('migrate refuses a schema newer than the code and changes nothing', async () => {
  const { schema, pool } = await freshSchema('migrate_new');
  await pool.query(`INSERT INTO "${schema}".schema_migrations (version, name) VALUES ($1, 'from the future')`, [
    LATEST_SCHEMA_VERSION + 1,
  ]);
  await assert.rejects(migrate({ connectionString: DATABASE_URL, schema }), SchemaTooNewError);
});

test('a non-superuser that owns the schema can migrate it', async () => {
  const role = `berth_owner_${process.pid}`;
  const schema = `t_migrate_owner_${process.pid}`;
  const admin = new pg.Pool({ connectionString: DATABASE_URL });
  try {
    await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.query(`DROP ROLE IF EXISTS "${role}"`);
    await admin.query(`CREATE ROLE "${role}" LOGIN NOSUPERUSER`);
    await admin.query(`CREATE SCHEMA "${schema}" AUTHORIZATION "${role}"`);
    const url = new URL(DATABASE_URL);
    url.username = role;
    const report = await migrate({ connectionString: url.toString(), schema });
    assert.equal(report.to, LATEST_SCHEMA_VERSION);
    const owner = await admin.query(
      `SELECT tableowner FROM pg_tables WHERE schemaname = $1 AND tablename = 'deferred'`,
      [schema],
    );
    assert.equal(owner.rows[0].tableowner, role);
  } finally {
    await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await admin.query(`DROP ROLE IF EXISTS "${role}"`);
    await admin.end();
  }
});

test('migrate without a connection gives a clear error', async () => {
  await assert.rejects(migrate({ schema: 'x' }), /connectionString/);
});

test('migrate refuses a database whose applied migration differs from the code (a shipped migration was edited)', async () => {
  const { MigrationChangedError } = await import('../src/index.js');
  const { schema, pool } = await freshSchema('migrate_changed');
  const recorded = await pool.query(
    `SELECT count(*) FROM "${schema}".schema_migrations WHERE checksum ~ '^[0-9a-f]{64}$'`,
  );
  assert.equal(Number(recorded.rows[0].count), MIGRATION_COUNT, 'every migration records its checksum');
  await pool.query(`UPDATE "${schema}".schema_migrations SET checksum = repeat('0', 64) WHERE version = 1`);
  await assert.rejects(migrate({ connectionString: DATABASE_URL, schema }), (err: Error) => {
    assert.ok(err instanceof MigrationChangedError);
    assert.deepEqual((err as InstanceType<typeof MigrationChangedError>).versions, [1]);
    return true;
  });
});
