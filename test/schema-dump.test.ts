import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { DATABASE_URL, freshSchema } from './helpers.js';
import { dumpSchema, firstDifference, SCHEMA_DUMP_FILE } from './support/schema-dump.js';

test('docs/schema.sql is the dump of a freshly migrated schema', async () => {
  const { schema } = await freshSchema('schema_dump');
  const actual = await dumpSchema(DATABASE_URL, schema);
  const checkedIn = existsSync(SCHEMA_DUMP_FILE) ? readFileSync(SCHEMA_DUMP_FILE, 'utf8') : '';
  if (actual !== checkedIn)
    assert.fail(`schema dump is stale: run npm run schema:dump\n${firstDifference(checkedIn, actual)}`);
});
