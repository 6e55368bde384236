import type pg from 'pg';
import { quoteIdent } from '../../src/sql.js';
import { MIGRATIONS } from '../../src/schema/migrations.js';

/**
 * Schema `schema`, made afresh and brought to migration `version` only: what an older berth left,
 * for a test of the next migration under a fleet of that version. The migrations run as
 * `migrate()` runs them, recorded without checksums (so a later `migrate()` takes the schema as
 * it is). Drops the schema first.
 */
export async function schemaAtVersion(c: pg.ClientBase, schema: string, version: number): Promise<void> {
  const s = quoteIdent(schema);
  await c.query(`DROP SCHEMA IF EXISTS ${s} CASCADE`);
  await c.query(`CREATE SCHEMA ${s}`);
  await c.query(`CREATE TABLE ${s}.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now(), checksum text)`);
  await migrateSchemaTo(c, schema, version);
}

/**
 * A schema made by `schemaAtVersion`, brought on to migration `version` (not past it), the same
 * way: for a test that writes what an older berth left between two migrations.
 */
export async function migrateSchemaTo(c: pg.ClientBase, schema: string, version: number): Promise<void> {
  const s = quoteIdent(schema);
  const from = (
    await c.query<{ v: number }>(`SELECT coalesce(max(version), 0)::integer AS v FROM ${s}.schema_migrations`)
  ).rows[0]!.v;
  for (const m of MIGRATIONS.filter((x) => x.version > from && x.version <= version)) {
    await c.query(m.sql(schema));
    await c.query(`INSERT INTO ${s}.schema_migrations (version, name) VALUES ($1, $2)`, [m.version, m.name]);
  }
}

/**
 * One plain task enqueued on a schema made by `schemaAtVersion` (version 12 or later), through
 * its own `enqueue()` as the client of that version called it: this version's client sends a
 * single task to `enqueue_one()`, which such a schema has not (migration 33). Its id.
 */
export async function enqueueOnLegacy(
  c: pg.ClientBase,
  schema: string,
  type: string,
  payload: unknown,
  shard: number | null = null,
): Promise<string> {
  const r = await c.query<{ id: string }>(
    `SELECT id::text FROM ${quoteIdent(schema)}.enqueue('default', 0::smallint, $1::smallint, 16::smallint,
       ARRAY[$2::text], ARRAY[$3::jsonb], NULL, NULL, NULL, NULL)`,
    [shard, type, JSON.stringify(payload)],
  );
  return r.rows[0]!.id;
}
