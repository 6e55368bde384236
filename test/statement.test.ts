/**
 * Statements with named parameters (src/statement.ts): positions are given by name, shared
 * fragments carry their names with them, and a statement whose values and placeholders disagree
 * is refused before it is sent. Pure: no database (the suite-wide check of every statement sent
 * is test/placeholder-guard.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { compile, p, placeholdersOf, positional, sql } from '../src/statement.js';
import { storageFor } from '../src/storage/storage.js';

test('names are numbered in the order they first appear; a name used twice is one placeholder', () => {
  const lane = sql`lane_id = ${p('laneId')}`;
  const st = compile(sql`SELECT 1 FROM t WHERE ${lane} AND seq > ${p('from')} AND other = ${p('laneId')}`);
  assert.equal(st.text, 'SELECT 1 FROM t WHERE lane_id = $1 AND seq > $2 AND other = $1');
  assert.deepEqual(st.names, ['laneId', 'from']);
  assert.deepEqual(st.values({ from: '7', laneId: 3 }), [3, '7']);
});

test('a fragment shared by two statements binds by name wherever it lands', () => {
  const entry = sql`(lane_id, lane_seq) = (${p('laneId')}, ${p('laneSeq')})`;
  const a = compile(sql`SELECT ${p('mode')}, ${entry}`);
  const b = compile(sql`SELECT ${entry}, ${p('mode')}`);
  const args = { mode: 'x', laneId: 1, laneSeq: '2' };
  assert.deepEqual(a.values(args), ['x', 1, '2']);
  assert.deepEqual(b.values(args), [1, '2', 'x']);
});

test('a missing, undefined or unknown value is an error naming the parameter, never a silent bind', () => {
  const st = compile(sql`SELECT ${p('a')}, ${p('b')}`, 'berth-test');
  assert.throws(() => st.values({ a: 1 } as never), /berth-test: no value for parameter "b"/);
  assert.throws(() => st.values({ a: 1, b: undefined }), /no value for parameter "b"/);
  assert.throws(() => st.values({ a: 1, b: 2, c: 3 } as never), /binds no parameter named "c"/);
  assert.deepEqual(st.values({ a: null, b: 0 }), [null, 0], 'null is SQL NULL');
});

test('a positional statement must have exactly $1 … $n for its n names', () => {
  assert.deepEqual(positional('SELECT $1, $2', ['a', 'b']).values({ a: 1, b: 2 }), [1, 2]);
  assert.throws(() => positional('SELECT $1, $3', ['a', 'b']), /placeholders \$1, \$3 but 2 names/);
  assert.throws(() => positional('SELECT $1', ['a', 'b']), /but 2 names/);
  assert.throws(() => positional('SELECT $1, $2', ['a']), /but 1 names/);
});

test('placeholders are read outside literals, quoted identifiers and comments', () => {
  assert.deepEqual([...placeholdersOf(`SELECT '$5', "$6", $1 -- $7\n, $2`)].sort(), [1, 2]);
});

test('a schema is bound once: one storage per name, each statement compiled once and kept', () => {
  const storage = storageFor('statement_test');
  assert.equal(storageFor('statement_test'), storage);
  assert.equal(storage.schema.q, '"statement_test"');
  let built = 0;
  const build = () => {
    built++;
    return compile(sql`SELECT ${p('x')}`);
  };
  const first = storage.statement('kept', build);
  assert.equal(storage.statement('kept', build), first);
  assert.equal(built, 1);
});
