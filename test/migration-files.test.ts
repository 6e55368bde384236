/**
 * The migration files (src/schema/migrations/*.sql) and their loader, without a database.
 *
 * Checksums must not change: migrate() compares each applied migration's recorded SHA-256 with
 * the code's copy and refuses a database where they differ (MigrationChangedError). The
 * checksum is over the migration as it runs for one schema, so the files with their
 * placeholders replaced must give, byte for byte, the text the in-code template strings gave
 * before the move to files (main at 0cb6169). The values below are those templates' checksums,
 * for the default schema and for a name that exercises every kind of quoting.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { MIGRATIONS, parseMigration, RING_SLOTS } from '../src/schema/migrations.js';

const sha256 = (text: string) => createHash('sha256').update(text).digest('hex');

const TEMPLATE_CHECKSUMS: Record<string, [number, string][]> = {
  berth: [
    [1, 'e3356c7820c802770a6fd5e4cb5d8e1eadaeb9811dc0e0788e810562c20e6118'],
    [2, '66541a6503569c89e282559e799572526a41f95d147b0a46022f2c5fc83fb6b7'],
    [3, '6c0f6a80064121f85a607b1fa0238df5361eeaad778bcb7dfe4f9ee673300a75'],
    [4, '0c409e0730a2e728562732aaff5886b093dd39e2ca940d60772defcc364de978'],
    [5, 'f2c9c26621f6ae55034541ef3ce047a996ccd6cf1e8b7bda8bc197e6c8366c98'],
    [6, 'f5181e216fc5b01e37aa0cc62a35ffae78b8120a5b85b6ee506424b6cb42b5fe'],
    [7, 'e8c5b97ba6c22a6601ba89b298a02d135a93a999a4bc01682e26c68bdeb749d7'],
  ],
  'Tenant "A\'s" {{schema}} \\ queue': [
    [1, '1566d5c6fdf2e3915d7129aa3e473c0fd28d74ccdb28c3f68b912159a33aa418'],
    [2, '95787dd4125ebdd8ca2b7d7e547cde2f1b1df62b8640979e90f68afee03694c6'],
    [3, '650a22b7fee7314c930bacea93b5769d9901293e4174da91bae55aca12cc8155'],
    [4, '12aefc7383f0e5953d286b9aa504adf20ef4c713f444bea39410f349de010c95'],
    [5, 'bf9e7adb4206772d8c067b3c6921e827b52e2b30b0ce8024581c7100b729f883'],
    [6, '5f69c6ebe383d89a6dc101b368ddcb1d157818a6b0091992c10b56ff756efa5a'],
    [7, '739767f99c227eb2c2680736db8a0fae45d851d00a3befeaca6ed8068e267205'],
  ],
};

const NAMES: [number, string][] = [
  [1, 'core storage: lanes, ready ring, leases, settlements, deferred, dead letters'],
  [2, 'move a pending task to another queue or priority (tombstone and re-append)'],
  [3, 'runtime roles: no berth function is executable by PUBLIC'],
  [4, 'lane sequences: problems view, repair under a short lock timeout'],
  [5, 'operator surface: queue pause, worker heartbeats, per-minute outcome counts, dead-letter retry, audit log'],
  [6, 'overdue leases: a handler still running past its deadline keeps its lease while its holder lives'],
  [7, 'roles split by need: ring prune, dead-letter retention and promotion selection as definer functions'],
];

for (const [schema, pins] of Object.entries(TEMPLATE_CHECKSUMS)) {
  test(`every migration's checksum for schema ${JSON.stringify(schema)} is the one the in-code templates recorded`, () => {
    const sums = pins.map(([version]) => {
      const m = MIGRATIONS.find((x) => x.version === version);
      return [version, m && sha256(m.sql(schema))];
    });
    assert.deepEqual(sums, pins);
  });
}

test('the names recorded in schema_migrations are the ones the in-code migrations had', () => {
  assert.deepEqual(
    NAMES.map(([version]) => [version, MIGRATIONS.find((x) => x.version === version)?.name]),
    NAMES,
  );
});

test('placeholders become the schema quoted as an identifier or a literal, never raw, and none is left over', () => {
  // Unquoted, this name would end an identifier and a literal; quoted, each of its quotes is doubled.
  const schema = `evil"'name`;
  for (const m of MIGRATIONS) {
    const sql = m.sql(schema);
    assert.doesNotMatch(sql, /\{\{|\}\}/, `migration ${m.version} leaves no placeholder`);
    assert.ok(!sql.includes(schema), `migration ${m.version} never holds the raw name`);
    assert.ok(sql.includes(`"evil""'name"`), `migration ${m.version} names the schema as an identifier`);
  }
});

test('migration 1 creates RING_SLOTS partitions of each ring table', () => {
  const core = MIGRATIONS.find((m) => m.version === 1)!.sql('berth');
  for (const table of ['ready', 'leases', 'settlements', 'tombstones']) {
    const slots = [...core.matchAll(new RegExp(`PARTITION OF "berth"\\.${table} FOR VALUES IN \\((\\d+)\\)`, 'g'))].map(
      (m) => Number(m[1]),
    );
    assert.deepEqual(
      slots,
      Array.from({ length: RING_SLOTS }, (_, i) => i),
      table,
    );
  }
  assert.match(core, new RegExp(`VALUES \\(0, ${RING_SLOTS}, 0, now\\(\\)\\)`), 'ring_state.slot_count');
});

test('a malformed migration file is refused, naming the file', () => {
  const ok = '-- name: x\n-- why\n\nSELECT 1 FROM {{schema}}.lanes;\n';
  assert.equal(parseMigration('0009_x.sql', ok).sql('s'), '\nSELECT 1 FROM "s".lanes;\n');
  assert.equal(
    parseMigration('0009_x.sql', ok.replaceAll('\n', '\r\n')).sql('s'),
    '\nSELECT 1 FROM "s".lanes;\n',
    'CRLF reads as LF',
  );
  assert.throws(() => parseMigration('9_x.sql', ok), /9_x\.sql: the name must be NNNN_/);
  assert.throws(
    () => parseMigration('0009_x.sql', '-- x\n\nSELECT 1;\n'),
    /0009_x\.sql: the first line must be "-- name: <name>"/,
  );
  assert.throws(
    () => parseMigration('0009_x.sql', '-- name: x\nSELECT 1;\n'),
    /0009_x\.sql: the header .* holds comments only/,
  );
  assert.throws(
    () => parseMigration('0009_x.sql', '-- name: x\n\nSELECT {{shema}};\n'),
    /0009_x\.sql: unknown placeholder\(s\) \{\{shema\}\}/,
  );
});

test('each migration names the tables it locks, with the strongest mode its statements take (migrate takes them first)', () => {
  const locks = (v: number) => MIGRATIONS.find((m) => m.version === v)!.locks;
  assert.deepEqual(locks(31), [
    { table: 'deferred', mode: 'ACCESS EXCLUSIVE' },
    { table: 'ready', mode: 'ACCESS EXCLUSIVE' },
    { table: 'task_deps', mode: 'SHARE' },
    { table: 'dead_letters', mode: 'SHARE ROW EXCLUSIVE' },
  ]);
  assert.deepEqual(locks(25), [{ table: 'attempt_history', mode: 'SHARE' }]);
  assert.deepEqual(locks(23), [], 'functions only');
  const parsed = parseMigration(
    '0099_x.sql',
    [
      '-- name: x',
      '',
      'CREATE INDEX a_i ON {{schema}}.a (id);',
      'ALTER TABLE {{schema}}.a ADD COLUMN b int;',
      'CREATE TRIGGER t AFTER INSERT ON {{schema}}.c',
      '  FOR EACH ROW EXECUTE FUNCTION {{schema}}.f();',
      '  ALTER TABLE {{schema}}.inside_a_body ADD COLUMN x int;',
      'LOCK TABLE {{schema}}.d IN SHARE MODE;',
    ].join('\n'),
  );
  assert.deepEqual(parsed.locks, [
    { table: 'a', mode: 'ACCESS EXCLUSIVE' },
    { table: 'c', mode: 'SHARE ROW EXCLUSIVE' },
    { table: 'd', mode: 'ACCESS EXCLUSIVE' },
  ]);
});
