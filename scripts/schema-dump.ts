/**
 * Regenerates docs/schema.sql, the dump of the fully migrated schema: migrates a scratch schema
 * on the test database ($TEST_DATABASE_URL, else $DATABASE_URL, else the local `test` database),
 * dumps it the way test/schema-dump.test.ts does (test/support/schema-dump.ts), writes the file
 * and drops the scratch schema. Run: npm run schema:dump (pg_dump on PATH, or $PG_DUMP).
 */
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { migrate } from '../src/index.js';
import { quoteIdent } from '../src/sql.js';
import { dumpSchema, SCHEMA_DUMP_FILE } from '../test/support/schema-dump.js';

const url = process.env.TEST_DATABASE_URL ?? process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const schema = `t_schema_dump_script_${process.pid}`;
const admin = new pg.Client({ connectionString: url });
await admin.connect();
try {
  await admin.query(`DROP SCHEMA IF EXISTS ${quoteIdent(schema)} CASCADE`);
  await migrate({ client: admin, schema });
  writeFileSync(SCHEMA_DUMP_FILE, await dumpSchema(url, schema));
  console.log(`wrote ${fileURLToPath(SCHEMA_DUMP_FILE)}`);
} finally {
  await admin.query(`DROP SCHEMA IF EXISTS ${quoteIdent(schema)} CASCADE`).catch(() => undefined);
  await admin.end();
}
