/**
 * Prepared statement names carry a hash of their text. Behind a transaction pooler the server's
 * connections, and what is prepared on them, are shared by every client: under a name alone, two
 * berth versions (a rolling upgrade) whose statement text differs could each bind what the other
 * prepared. A client's driver remembers which names it prepared, not on which server connection,
 * so once the server connection it prepared on is gone (here: its statement deallocated, as a
 * replaced server connection forgets it) and the other version has prepared its own text under
 * that name, the first client sends a Bind alone and runs the other version's SQL with its own
 * parameters. With the text's hash in the name the two never share one: the first client's Bind
 * finds nothing (26000, which berth's worker treats as a pooler that does not keep statements,
 * and retries unnamed) instead of the other text.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pg from 'pg';
import { positional } from '../src/statement.js';
import { DATABASE_URL } from './helpers.js';
import { fileBouncer } from './support/pgbouncer.js';

const { bouncer, skip, closeAtEnd } = await fileBouncer(DATABASE_URL, { txn1: { mode: 'transaction', size: 1 } });

/** A plain pg client on the one-server-connection, transaction-mode alias. */
async function pooled(): Promise<pg.Client> {
  const c = closeAtEnd(new pg.Client({ connectionString: bouncer!.url('txn1') }));
  c.on('error', () => undefined);
  await c.connect();
  return c;
}

// Two versions of one statement: the same kind and schema, different text.
const older = positional('SELECT $1::integer + 1 AS v', ['x'], 'berth-probe:s');
const newer = positional('SELECT $1::integer + 100 AS v', ['x'], 'berth-probe:s');

test('a name is its kind, schema and window with a hash of its text, within 63 bytes', () => {
  assert.notEqual(older.name, newer.name, 'two texts, two names');
  assert.equal(
    positional('SELECT $1::integer + 1 AS v', ['x'], 'berth-probe:s').name,
    older.name,
    'one text, one name',
  );
  for (const st of [older, newer]) assert.match(st.name!, /^berth-probe:s@[\w-]{10}$/);
  assert.equal(positional('SELECT 1', []).name, undefined, 'an unnamed statement stays unnamed');
  // Texts that differ in one place (a constant, a character, a window's segment list) and in length.
  const names = new Set<string>();
  const texts: string[] = [];
  for (let i = 0; i < 20_000; i++)
    texts.push(`${older.text} AND x.slot IN (${i % 16}, ${i >> 4}) -- ${'é水'.repeat(i % 7)}`);
  for (const text of texts) names.add(positional(text, ['x'], 'berth-probe:s').name!);
  assert.equal(names.size, texts.length, 'no two of 20,000 texts share a name');
  const long = positional('SELECT 1', [], `berth-claim-one-lane:${'s'.repeat(50)}:w1.2`);
  assert.ok(Buffer.byteLength(long.name!) <= 63, long.name);
  assert.ok(long.name!.startsWith('berth-claim-one-lane:#'), long.name);
});

test("behind a transaction pooler, a client never runs another version's text prepared under its statement's name", {
  skip,
}, async () => {
  const a = await pooled();
  const b = await pooled();
  const wiper = await pooled();
  const run = async (c: pg.Client, q: { name?: string; text: string; values: unknown[] }) =>
    (await c.query<{ v: number }>(q)).rows[0]!.v;
  const forget = async (name: string) => wiper.query(`DEALLOCATE "${name.replaceAll('"', '""')}"`);

  // The hazard, with one name for both texts (what berth did before): A prepares its text, the
  // server connection forgets it, B prepares its own under the name, and A's next call runs B's.
  const shared = 'berth-probe-unhashed:s';
  assert.equal(await run(a, { name: shared, text: older.text, values: [1] }), 2);
  await forget(shared);
  assert.equal(await run(b, { name: shared, text: newer.text, values: [1] }), 101);
  assert.equal(
    await run(a, { name: shared, text: older.text, values: [1] }),
    101,
    "A ran B's text: the hazard is real",
  );

  // With each text's hash in its name: the same steps.
  assert.equal(await run(a, older.query({ x: 1 })), 2);
  await forget(older.name!);
  assert.equal(await run(b, newer.query({ x: 1 })), 101);
  await assert.rejects(run(a, older.query({ x: 1 })), (err: unknown) => {
    assert.equal(
      (err as { code?: string }).code,
      '26000',
      'the name is not prepared there: an error the worker handles',
    );
    return true;
  });
  // Both texts can live on the one server connection, each under its own name.
  assert.equal(await run(b, newer.query({ x: 2 })), 102);
  assert.equal(await run(wiper, older.query({ x: 2 })), 3);
  assert.equal(await run(b, newer.query({ x: 3 })), 103);
});
