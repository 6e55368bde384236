/**
 * `berth keys list | set | clear` and the keys section of `berth stats`: audited under the CLI's
 * actor (key.limit, key.unlimit), bad input refused as one line naming the field with exit 2, a
 * clear of nothing exit 1, and the held keys (tasks waiting for their concurrency key).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { enqueueMany, type HeldKey, type KeyLimitRow, listAudit, listKeyLimits } from '../src/index.js';
import type { KeysSummary } from '../src/admin/limits.js';
import { DATABASE_URL, freshSchema } from './helpers.js';
import { cliOn } from './support/run-cli.js';

const { schema, pool } = await freshSchema('clikeys');
const S = `"${schema}"`;
process.env.BERTH_ACTOR = 'cli:tester';

const { berth, berthJson } = cliOn(schema, DATABASE_URL);

const oneLine = (text: string) => text.trim().split('\n').length === 1;

/** `n` tasks of `queue` with concurrency key `key`: each held until its key admits it. */
async function keyed(queue: string, key: string, n: number): Promise<void> {
  await enqueueMany(
    pool,
    Array.from({ length: n }, (_, i) => ({ type: 'cli_key', payload: { i }, queue, concurrencyKey: key })),
    { schema },
  );
}

test('no keys: stats has no keys section, its JSON has keys; keys list says so', async () => {
  const stats = await berth('stats');
  assert.equal(stats.code, 0, stats.err);
  assert.doesNotMatch(stats.out, /concurrency keys/);
  const json = await berthJson<{ keys: KeysSummary }>('stats', '--json');
  assert.deepEqual(json.keys, { heldTasks: 0, heldByQueue: {}, keysWaiting: 0, limits: [], top: [] });
  const list = await berth('keys', 'list');
  assert.equal(list.code, 0, list.err);
  assert.match(list.out, /no key limits set/);
  assert.match(list.out, /no tasks held for their keys/);
  assert.deepEqual(await berthJson('keys', 'list', '--json'), { limits: [], held: [] });
});

test('set, list, change and clear key limits; held keys listed; audited as the CLI actor; stats section', async () => {
  await keyed('mail', 'acme', 3);
  await keyed('mail', 'beta', 1);
  await keyed('reports', 'acme', 2);
  // One of acme's tasks admitted (in its lane): it counts as running under its key.
  await pool.query(`SELECT * FROM ${S}.promote_held(ARRAY['acme'], NULL)`);

  const set = await berth('keys', 'set', '--queue', 'mail', '--per-key', '3');
  assert.equal(set.code, 0, set.err);
  assert.match(set.out, /^queue "mail": at most 3 task\(s\) per key at once$/m);
  const setType = await berth('keys', 'set', '--type', 'cli_key', '--per-key', '2', '--json');
  assert.equal(setType.code, 0, setType.err);
  assert.deepEqual(
    (JSON.parse(setType.out) as { type: string; limit: KeyLimitRow }).limit.perKey,
    2,
    'the limit now in force is answered',
  );

  const { limits, held } = await berthJson<{ limits: KeyLimitRow[]; held: HeldKey[] }>('keys', 'list', '--json');
  assert.deepEqual(
    limits.map((l) => [l.scope, l.name, l.perKey, l.updatedBy]),
    [
      ['queue', 'mail', 3, 'cli:tester'],
      ['type', 'cli_key', 2, 'cli:tester'],
    ],
  );
  const byKey = Object.fromEntries(held.map((k) => [k.key, [k.held, k.running]]));
  assert.deepEqual(byKey, { acme: [4, 1], beta: [1, 0] });

  const list = await berth('keys', 'list');
  assert.match(list.out, /^SCOPE +NAME +PERKEY +UPDATEDBY +UPDATEDAT$/m);
  assert.match(list.out, /^queue +mail +3 +cli:tester +\d{4}-\d\d-\d\dT/m);
  assert.match(list.out, /^type +cli_key +2 +cli:tester +\d{4}-\d\d-\d\dT/m);
  assert.match(list.out, /^KEY +HELD +RUNNING +WAITINGSINCE$/m);
  assert.match(list.out, /^acme +4 +1 +\d{4}-\d\d-\d\dT/m);
  assert.match(list.out, /^beta +1 +0 +\d{4}-\d\d-\d\dT/m);

  const stats = await berth('stats');
  assert.match(stats.out, /^concurrency keys: 5 task\(s\) held, 2 key\(s\) waiting, 2 key limit\(s\) set$/m);
  assert.match(stats.out, /^KEY +HELD +RUNNING +WAITINGSINCE$/m);
  // The most held first.
  assert.ok(stats.out.indexOf('\nacme ') < stats.out.indexOf('\nbeta '), stats.out);
  const statsJson = await berthJson<{ keys: KeysSummary }>('stats', '--json');
  assert.deepEqual(
    [statsJson.keys.heldTasks, statsJson.keys.heldByQueue, statsJson.keys.keysWaiting],
    [5, { mail: 3, reports: 2 }, 2],
  );
  assert.deepEqual(
    statsJson.keys.top.map((k) => [k.key, k.held, k.running]),
    [
      ['acme', 4, 1],
      ['beta', 1, 0],
    ],
  );

  // Changed in place.
  assert.equal((await berth('keys', 'set', '--queue', 'mail', '--per-key', '5')).code, 0);
  assert.equal((await listKeyLimits(pool, schema)).find((l) => l.name === 'mail')?.perKey, 5);

  const cleared = await berth('keys', 'clear', '--queue', 'mail');
  assert.equal(cleared.code, 0, cleared.err);
  assert.match(cleared.out, /^queue "mail": key limit cleared$/m);
  const again = await berth('keys', 'clear', '--queue', 'mail');
  assert.equal(again.code, 1);
  assert.match(again.err, /^berth: queue "mail" has no key limit$/m);
  const json = await berth('keys', 'clear', '--type', 'cli_key', '--json');
  assert.equal(json.code, 0, json.err);
  assert.deepEqual(JSON.parse(json.out), { type: 'cli_key', cleared: true });
  assert.deepEqual(await listKeyLimits(pool, schema), []);

  const audit = (await listAudit(pool, schema)).filter((a) => a.action.startsWith('key.'));
  assert.deepEqual(
    audit.reverse().map((a) => [a.actor, a.action, a.target]),
    [
      ['cli:tester', 'key.limit', { queue: 'mail', perKey: 3 }],
      ['cli:tester', 'key.limit', { type: 'cli_key', perKey: 2 }],
      ['cli:tester', 'key.limit', { queue: 'mail', perKey: 5 }],
      ['cli:tester', 'key.unlimit', { queue: 'mail' }],
      ['cli:tester', 'key.unlimit', { queue: 'mail' }],
      ['cli:tester', 'key.unlimit', { type: 'cli_key' }],
    ],
  );
  // Held tasks but no limit: the section stays.
  assert.match((await berth('stats')).out, /concurrency keys: 5 task\(s\) held, 2 key\(s\) waiting, 0 key limit/);
});

test('bad input: one line naming the field, exit 2, and no limit set', async () => {
  const cases: [string[], RegExp][] = [
    [
      ['set', '--queue', 'q', '--per-key', '0'],
      /option '--per-key <k>' argument '0' is invalid\. expected an integer from 1 to 1000000/,
    ],
    [['set', '--queue', 'q', '--per-key', '2.5'], /option '--per-key <k>' argument '2\.5' is invalid/],
    [['set', '--queue', 'q', '--per-key', 'many'], /option '--per-key <k>' argument 'many' is invalid/],
    [['set', '--queue', 'q'], /keys set: give --per-key <k>/],
    [['set', '--per-key', '2'], /keys set: give exactly one of --queue <queue> or --type <type>/],
    [['set', '--queue', 'q', '--type', 't', '--per-key', '2'], /keys set: give exactly one of --queue/],
    [['set', '--type', '', '--per-key', '2'], /setKeyLimit: type must be a non-empty string/],
    [
      ['set', '--queue', 'q'.repeat(300), '--per-key', '2'],
      /queue must be a string of at most 255 UTF-8 bytes \(got 300 bytes\)/,
    ],
    [['set', '--frobnicate'], /unknown option '--frobnicate'/],
    [['clear'], /keys clear: give exactly one of --queue <queue> or --type <type>/],
    [['clear', '--type', 'x'.repeat(300)], /clearKeyLimit: type must be/],
  ];
  for (const [args, message] of cases) {
    const r = await berth('keys', ...args);
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.err}`);
    assert.ok(oneLine(r.err), r.err);
    assert.match(r.err, /^berth: /);
    assert.match(r.err, message, args.join(' '));
  }
  const unknownVerb = await berth('keys', 'raise');
  assert.equal(unknownVerb.code, 2);
  assert.match(unknownVerb.err, /unknown command "raise" \(commands here: list, set, clear\)/);
  assert.deepEqual(await listKeyLimits(pool, schema), []);
});

test('keys list escapes control characters in a key; its JSON keeps them exact', async () => {
  const key = `k\u001b]0;pwned\u0007-${process.pid}`;
  await keyed('escapes', key, 1);
  const text = await berth('keys', 'list');
  // biome-ignore lint/suspicious/noControlCharactersInRegex: the test looks for raw control characters
  assert.doesNotMatch(text.out, /[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/);
  assert.ok(text.out.includes('k\\x1b]0;pwned\\x07'), text.out);
  const json = await berthJson<{ held: HeldKey[] }>('keys', 'list', '--json');
  assert.ok(json.held.some((k) => k.key === key));
});
