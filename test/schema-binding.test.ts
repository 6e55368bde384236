import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bindSchema } from '../src/sql.js';

test('bindSchema quotes a name once and hands a bound schema back unchanged', () => {
  const bound = bindSchema('odd"name');
  assert.deepEqual({ ...bound }, { name: 'odd"name', q: '"odd""name"' });
  assert.equal(bindSchema(bound), bound, 'no second quoting');
  assert.ok(Object.isFrozen(bound));
  assert.throws(() => bindSchema(''), /must not be empty/);
  assert.throws(() => bindSchema('a\u0000b'), /NUL/);
});
