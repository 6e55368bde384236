/**
 * Issue 10, item 5: every error berth raises on purpose extends BerthError and carries a stable
 * `code`; names, messages, `instanceof` and PermanentError's cross-copy brand are as before;
 * docs/api.md lists every code. No database.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import * as root from '../src/index.js';
import * as maintenance from '../src/maintenance-api.js';
import {
  BerthError,
  BerthInputError,
  ConnectError,
  DeadlineAbort,
  CancelAbort,
  isPermanentError,
  LeaseLostError,
  MigrationChangedError,
  PermanentError,
  SchemaNotMigratedError,
  SchemaTooNewError,
  ShutdownAbort,
  SliceLeaseLostError,
  type BerthErrorCode,
} from '../src/index.js';
import { CliFailure } from '../src/cli/common.js';
import { TooManyAttemptsError } from '../src/dashboard/auth.js';
import { HttpError } from '../src/dashboard/http.js';

/** Every code, once: the compiler fails this file when the union and this list disagree. */
const CODES: Record<BerthErrorCode, true> = {
  BERTH_INPUT: true,
  LEASE_LOST: true,
  PERMANENT: true,
  SCHEMA_NOT_MIGRATED: true,
  SCHEMA_TOO_NEW: true,
  MIGRATION_CHANGED: true,
  SLICE_LEASE_LOST: true,
  HTTP: true,
  TOO_MANY_ATTEMPTS: true,
  CLI_FAILURE: true,
  SHUTDOWN_ABORT: true,
  DEADLINE_ABORT: true,
  CANCEL_ABORT: true,
  CONNECT: true,
};

type ErrorClass = abstract new (...args: never[]) => Error;

/** One instance of each class, its code, the classes it must be an instance of, and its message. */
const CASES: { cls: ErrorClass; err: BerthError; code: BerthErrorCode; also: ErrorClass[]; message: string }[] = [
  { cls: BerthInputError, err: new BerthInputError('bad value'), code: 'BERTH_INPUT', also: [], message: 'bad value' },
  {
    cls: LeaseLostError,
    err: new LeaseLostError('42', 'Dequeue'),
    code: 'LEASE_LOST',
    also: [],
    message: 'lease on task 42 is no longer held; Dequeue refused',
  },
  {
    cls: PermanentError,
    err: new PermanentError('no retry helps'),
    code: 'PERMANENT',
    also: [],
    message: 'no retry helps',
  },
  {
    cls: SchemaNotMigratedError,
    err: new SchemaNotMigratedError('app', 'berth schema "app" is not migrated'),
    code: 'SCHEMA_NOT_MIGRATED',
    also: [BerthInputError],
    message: 'berth schema "app" is not migrated',
  },
  {
    cls: SchemaTooNewError,
    err: new SchemaTooNewError('app', 9, 7),
    code: 'SCHEMA_TOO_NEW',
    also: [],
    message:
      'berth schema "app" is at version 9 but this code only knows up to 7; upgrade berth before running it against this database',
  },
  {
    cls: MigrationChangedError,
    err: new MigrationChangedError('app', [1, 3]),
    code: 'MIGRATION_CHANGED',
    also: [],
    message:
      'berth schema "app": applied migration(s) 1, 3 differ from this code\'s copy; a shipped migration must never change. ' +
      'Restore the matching berth version or rebuild the schema.',
  },
  {
    cls: SliceLeaseLostError,
    err: new SliceLeaseLostError('42'),
    code: 'SLICE_LEASE_LOST',
    also: [],
    message: 'task 42: AdvanceCursor refused, lease lost; slice abandoned',
  },
  {
    cls: HttpError,
    err: new HttpError(404, 'task 42 not found'),
    code: 'HTTP',
    also: [],
    message: 'task 42 not found',
  },
  {
    cls: TooManyAttemptsError,
    err: new TooManyAttemptsError(30),
    code: 'TOO_MANY_ATTEMPTS',
    also: [HttpError],
    message: 'too many failed authentications: try again in 30 s',
  },
  {
    cls: CliFailure,
    err: new CliFailure('task 42 not found'),
    code: 'CLI_FAILURE',
    also: [],
    message: 'task 42 not found',
  },
  {
    cls: ShutdownAbort,
    err: new ShutdownAbort(),
    code: 'SHUTDOWN_ABORT',
    also: [],
    message: 'worker is shutting down',
  },
  {
    cls: DeadlineAbort,
    err: new DeadlineAbort(Date.UTC(2026, 0, 1)),
    code: 'DEADLINE_ABORT',
    also: [],
    message: 'handler deadline 2026-01-01T00:00:00.000Z passed',
  },
  {
    cls: CancelAbort,
    err: new CancelAbort(),
    code: 'CANCEL_ABORT',
    also: [],
    message: 'task was cancelled by an operator',
  },
  {
    cls: ConnectError,
    err: new ConnectError('db.example:5432, database "app"', false, {
      cause: new Error('connect ECONNREFUSED 10.0.0.1:5432'),
      timeoutMs: 10_000,
    }),
    code: 'CONNECT',
    also: [],
    message: 'could not connect to PostgreSQL at db.example:5432, database "app": connect ECONNREFUSED 10.0.0.1:5432',
  },
];

test('every error class has its own stable code, its name and message, and is a BerthError and an Error', () => {
  for (const { cls, err, code, also, message } of CASES) {
    assert.equal(err.code, code, `${cls.name}.code`);
    assert.equal(err.name, cls.name, `${cls.name}.name`);
    assert.equal(err.message, message, `${cls.name}.message`);
    assert.ok(err instanceof cls, `${cls.name} instanceof itself`);
    assert.ok(err instanceof BerthError, `${cls.name} instanceof BerthError`);
    assert.ok(err instanceof Error, `${cls.name} instanceof Error`);
    for (const base of also) assert.ok(err instanceof base, `${cls.name} instanceof ${base.name}`);
    assert.ok(typeof err.stack === 'string' && err.stack.includes(message), `${cls.name} keeps a stack`);
  }
  assert.deepEqual(
    CASES.map((c) => c.code).sort(),
    Object.keys(CODES).sort(),
    'one class per code, one code per class',
  );
});

test('the code is an own, enumerable property, so structured logs (pino) carry it', () => {
  for (const { cls, err, code } of CASES) {
    assert.deepEqual(Object.getOwnPropertyDescriptor(err, 'code')?.value, code, cls.name);
    assert.equal(JSON.parse(JSON.stringify(err)).code, code, cls.name);
  }
});

test('errors keep their extra fields and the cause', () => {
  const lost = new LeaseLostError('42', 'Dequeue');
  assert.equal(lost.taskId, '42');
  const cause = new Error('disk full');
  assert.equal(new PermanentError('gave up', { cause }).cause, cause);
  const tooNew = new SchemaTooNewError('app', 9, 7);
  assert.deepEqual([tooNew.schema, tooNew.databaseVersion, tooNew.codeVersion], ['app', 9, 7]);
  assert.deepEqual(new MigrationChangedError('app', [1, 3]).versions, [1, 3]);
  const refused = new Error('connect ECONNREFUSED');
  const connect = new ConnectError('h:5432, database "d"', true, { cause: refused, timeoutMs: 2000 });
  assert.deepEqual([connect.where, connect.timedOut, connect.cause], ['h:5432, database "d"', true, refused]);
  assert.match(connect.message, /no answer within 2 s/);
  assert.equal(new SchemaNotMigratedError('app', 'x').schema, 'app');
  const http = new HttpError(400, 'bad', { 'x-a': '1' });
  assert.deepEqual([http.status, http.headers], [400, { 'x-a': '1' }]);
  const limited = new TooManyAttemptsError(30);
  assert.deepEqual([limited.status, limited.retryAfterSeconds, limited.headers], [429, 30, { 'retry-after': '30' }]);
});

test('PermanentError keeps its brand: a copy from another module system still counts, a plain error does not', () => {
  assert.equal(isPermanentError(new PermanentError('x')), true);
  // What another copy of berth (loaded as CommonJS by tsx) creates: a different class, the same brand.
  const copy = Object.assign(new Error('x'), { [Symbol.for('berth.PermanentError')]: true });
  assert.equal(isPermanentError(copy), true);
  assert.equal(isPermanentError(new Error('x')), false);
  assert.equal(isPermanentError(new BerthInputError('x')), false);
  assert.equal(isPermanentError(null), false);
});

test('every error class the package exports is covered here, and the root exports BerthError', () => {
  const covered = new Set<unknown>([BerthError, ...CASES.map((c) => c.cls)]);
  for (const [name, value] of [...Object.entries(root), ...Object.entries(maintenance)]) {
    if (typeof value === 'function' && value.prototype instanceof Error)
      assert.ok(covered.has(value), `${name} has a case (and a code)`);
  }
  assert.equal(root.BerthError, BerthError);
});

test('docs/api.md lists every code with its class', () => {
  const doc = readFileSync(new URL('../docs/api.md', import.meta.url), 'utf8');
  for (const { cls, code } of CASES) {
    assert.match(doc, new RegExp(`^\\| \`${code}\` \\| \`${cls.name}\``, 'm'), `docs/api.md has a row for ${code}`);
  }
});
