import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bindSchema } from '../src/sql.js';
import { storageFor } from '../src/storage/storage.js';

test('a schema name is bound once: quoted, frozen, and one storage per name holds it', () => {
  const bound = bindSchema('odd"name');
  assert.deepEqual({ ...bound }, { name: 'odd"name', q: '"odd""name"' });
  assert.ok(Object.isFrozen(bound));
  assert.throws(() => bindSchema(''), /must not be empty/);
  assert.throws(() => bindSchema('a\u0000b'), /NUL/);
  const storage = storageFor('odd"name');
  assert.equal(storageFor('odd"name'), storage, 'the same storage for the same name');
  assert.equal(storage.schema.q, '"odd""name"');
  assert.throws(() => storageFor(''), /must not be empty/);
});
