import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { enqueue, listLaneSequenceProblems, migrate, repairLaneSequences } from '../src/index.js';
import { schemaLockKey } from '../src/storage/locks.js';
import { DATABASE_URL, urlAs, within } from './helpers.js';

// Roles are cluster-wide: every name carries the pid so parallel runs never share one.
const owner = `berth_owner_ls_${process.pid}`;
const other = `berth_other_ls_${process.pid}`;
const roles = [other, owner];
const schema = `t_laneseq_${process.pid}`;
const S = `"${schema}"`;

const admin = new pg.Pool({ connectionString: DATABASE_URL });
await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
for (const r of roles) await admin.query(`DROP ROLE IF EXISTS "${r}"`);
for (const r of roles) await admin.query(`CREATE ROLE "${r}" LOGIN NOSUPERUSER`);
// A non-superuser owns the schema and migrates it, so its definer functions run as that role
// and "who may repair" is not just "the superuser".
await admin.query(`CREATE SCHEMA ${S} AUTHORIZATION "${owner}"`);
await migrate({ connectionString: urlAs(owner), schema });
const asOwner = new pg.Pool({ connectionString: urlAs(owner), max: 2 });
const asOther = new pg.Pool({ connectionString: urlAs(other), max: 2 });

after(async () => {
  await Promise.all([asOwner.end(), asOther.end()]);
  await admin.query(`DROP SCHEMA IF EXISTS ${S} CASCADE`);
  for (const r of roles) {
    await admin.query(`DROP OWNED BY "${r}"`).catch(() => undefined);
    await admin.query(`DROP ROLE IF EXISTS "${r}"`);
  }
  await admin.end();
});

let lanes = 0;
/** A lane of its own (with `n` entries) for one test. */
async function newLane(n = 1): Promise<{ queue: string; laneId: number; seq: string }> {
  const queue = `q${++lanes}`;
  for (let i = 0; i < n; i++) await enqueue(admin, 'ls', { i }, { schema, queue, shard: 0 });
  const r = await admin.query<{ lane_id: number }>(`SELECT lane_id FROM ${S}.lanes WHERE queue = $1`, [queue]);
  const laneId = r.rows[0]!.lane_id;
  return { queue, laneId, seq: `${S}."lane_seq_${laneId}"` };
}

/** An open transaction that took a lock with `sql` and holds it until `release()`. */
async function holdLock(sql: string): Promise<{ release: () => Promise<void> }> {
  const c = new pg.Client({ connectionString: DATABASE_URL });
  await c.connect();
  await c.query('BEGIN');
  await c.query(sql);
  return {
    release: async () => {
      await c.query('ROLLBACK');
      await c.end();
    },
  };
}

/**
 * ACCESS EXCLUSIVE on a sequence, held by an open transaction. LOCK TABLE refuses sequences;
 * a no-op ALTER ... OWNER (to the owner it already has) takes the same lock the repair needs.
 */
function holdSequence(seq: string, currentOwner: string): Promise<{ release: () => Promise<void> }> {
  return holdLock(`ALTER SEQUENCE ${seq} OWNER TO "${currentOwner}"`);
}

/**
 * Run a repair while a lock it needs is held and never released meanwhile: if the repair waited
 * on the lock it would never return, so returning at all (within a deadline that only bounds a
 * hang) proves it gave up, however slow the machine. The time is returned for a lower bound.
 */
async function timed<T>(fn: () => Promise<T>): Promise<{ value: T; ms: number }> {
  const started = performance.now();
  const value = await within(fn(), 30_000, 'the call under a held lock');
  return { value, ms: performance.now() - started };
}

test('the view lists a wrongly owned and a missing sequence with who can repair each; repair fixes both, a recreated sequence continues past the lane', async () => {
  const wrong = await newLane();
  const gone = await newLane(3);
  await admin.query(`ALTER SEQUENCE ${wrong.seq} OWNER TO "${other}"`);
  await admin.query(`DROP SEQUENCE ${gone.seq}`);
  // Why they are problems: the definer role may not draw from another role's sequence, and a
  // missing one fails every append to its lane.
  await assert.rejects(
    enqueue(admin, 'ls', {}, { schema, queue: wrong.queue, shard: 0 }),
    /permission denied for sequence/,
  );
  await assert.rejects(enqueue(admin, 'ls', {}, { schema, queue: gone.queue, shard: 0 }), /does not exist/);

  const problems = await listLaneSequenceProblems(admin, schema);
  assert.deepEqual(
    problems.map((p) => [p.laneId, p.problem, p.currentOwner, p.expectedOwner]),
    [
      [wrong.laneId, 'wrong_owner', other, owner],
      [gone.laneId, 'missing', null, owner],
    ],
  );
  const [w, m] = problems as [(typeof problems)[0], (typeof problems)[0]];
  assert.equal(w.statement, `ALTER SEQUENCE ${schema}.lane_seq_${wrong.laneId} OWNER TO ${owner}`);
  assert.equal(m.statement, `SELECT ${schema}.provision_lane_sequence(${gone.laneId})`);
  // Reassigning needs the current owner's rights and membership in the new owner: neither the
  // schema owner (not a member of `other`) nor `other` (not a member of the owner) qualifies.
  assert.ok(w.repairRoles.includes('postgres'));
  assert.ok(!w.repairRoles.includes(owner) && !w.repairRoles.includes(other), w.repairRoles.join());
  assert.ok(
    m.repairRoles.includes('postgres') && m.repairRoles.includes(owner) && !m.repairRoles.includes(other),
    m.repairRoles.join(),
  );

  // The schema owner may recreate the missing one but not take the other's sequence.
  const byOwner = await repairLaneSequences(asOwner, schema);
  assert.deepEqual(
    byOwner.repaired.map((p) => [p.laneId, p.result]),
    [[gone.laneId, 'created']],
  );
  assert.deepEqual(
    byOwner.notPermitted.map((p) => p.laneId),
    [wrong.laneId],
  );
  assert.deepEqual([byOwner.busy, byOwner.failed], [[], []]);

  // Once `other` is a member of the owner role it qualifies, and can repair it itself.
  await admin.query(`GRANT "${owner}" TO "${other}"`);
  try {
    const [again] = await listLaneSequenceProblems(admin, schema);
    assert.ok(again?.repairRoles.includes(other), again?.repairRoles.join());
    const byOther = await repairLaneSequences(asOther, schema);
    assert.deepEqual(
      byOther.repaired.map((p) => [p.laneId, p.result]),
      [[wrong.laneId, 'reassigned']],
    );
  } finally {
    await admin.query(`REVOKE "${owner}" FROM "${other}"`);
  }
  assert.deepEqual(await listLaneSequenceProblems(admin, schema), []);

  const owners = await admin.query(
    `SELECT pg_get_userbyid(relowner) AS o FROM pg_class WHERE oid IN ($1::regclass, $2::regclass)`,
    [wrong.seq, gone.seq],
  );
  assert.deepEqual(
    owners.rows.map((r) => r.o),
    [owner, owner],
  );
  const next = await enqueue(admin, 'ls', {}, { schema, queue: gone.queue, shard: 0 });
  const seq = await admin.query(`SELECT lane_seq::text FROM ${S}.ready WHERE id = $1`, [next.id]);
  assert.equal(seq.rows[0].lane_seq, '4', "the recreated sequence continues past the lane's 3 entries");
  assert.equal((await enqueue(admin, 'ls', {}, { schema, queue: wrong.queue, shard: 0 })).state, 'ready');
});

test('a repair reports a busy sequence after its 300 ms lock timeout instead of waiting', async () => {
  const lane = await newLane();
  await admin.query(`ALTER SEQUENCE ${lane.seq} OWNER TO "${other}"`);

  const locked = await holdSequence(lane.seq, other);
  try {
    const { value, ms } = await timed(() => repairLaneSequences(admin, schema));
    assert.deepEqual(
      value.busy.map((p) => p.laneId),
      [lane.laneId],
    );
    assert.deepEqual(value.repaired, []);
    assert.ok(ms >= 250, `gave up after its lock timeout, not before: ${ms} ms`);
  } finally {
    await locked.release();
  }

  // The usual holder: a transaction that drew from the sequence and is still open. Its lock
  // would make an unbounded ALTER wait, and every later append to the lane queue behind it.
  const drew = await holdLock(`SELECT nextval('${lane.seq}')`);
  try {
    const { value } = await timed(() => repairLaneSequences(admin, schema));
    assert.deepEqual(
      value.busy.map((p) => p.laneId),
      [lane.laneId],
    );
  } finally {
    await drew.release();
  }
  const done = await repairLaneSequences(admin, schema);
  assert.deepEqual(
    done.repaired.map((p) => [p.laneId, p.result]),
    [[lane.laneId, 'reassigned']],
  );

  // A missing sequence is recreated under the lane lock; a lane lock held elsewhere is busy too.
  const gone = await newLane();
  await admin.query(`DROP SEQUENCE ${gone.seq}`);
  const laneLock = await holdLock(`SELECT pg_advisory_xact_lock(${schemaLockKey(schema)}, ${gone.laneId})`);
  try {
    const { value } = await timed(() => repairLaneSequences(admin, schema));
    assert.deepEqual(
      value.busy.map((p) => [p.laneId, p.problem]),
      [[gone.laneId, 'missing']],
    );
  } finally {
    await laneLock.release();
  }
  assert.deepEqual(
    (await repairLaneSequences(admin, schema)).repaired.map((p) => p.result),
    ['created'],
  );
});

test('migrate repairs lane sequences after its commit and reports repaired, busy and not permitted', async () => {
  const fixable = await newLane();
  const busy = await newLane();
  await admin.query(`ALTER SEQUENCE ${fixable.seq} OWNER TO "${other}"`);
  await admin.query(`ALTER SEQUENCE ${busy.seq} OWNER TO "${other}"`);

  // As the owner: may not take `other`'s sequences, says so, and still succeeds.
  const asOwnerReport = await migrate({ connectionString: urlAs(owner), schema });
  assert.deepEqual(asOwnerReport.applied, []);
  assert.deepEqual(
    asOwnerReport.laneSequences.notPermitted.map((p) => p.laneId),
    [fixable.laneId, busy.laneId],
  );
  assert.ok(asOwnerReport.laneSequences.notPermitted.every((p) => p.repairRoles.includes('postgres')));

  const locked = await holdSequence(busy.seq, other);
  try {
    const { value: report } = await timed(() => migrate({ connectionString: DATABASE_URL, schema }));
    assert.deepEqual(
      report.laneSequences.repaired.map((p) => [p.laneId, p.result]),
      [[fixable.laneId, 'reassigned']],
    );
    assert.deepEqual(
      report.laneSequences.busy.map((p) => p.laneId),
      [busy.laneId],
    );
    assert.deepEqual([report.laneSequences.notPermitted, report.laneSequences.failed], [[], []]);
  } finally {
    await locked.release();
  }
  const after = await migrate({ connectionString: DATABASE_URL, schema });
  assert.deepEqual(
    after.laneSequences.repaired.map((p) => p.laneId),
    [busy.laneId],
  );
  assert.deepEqual(await listLaneSequenceProblems(admin, schema), []);
});

const cli = fileURLToPath(new URL('../src/cli.ts', import.meta.url));
const run = (args: string[]) =>
  spawnSync(process.execPath, ['--import', 'tsx', cli, ...args], {
    encoding: 'utf8',
    env: { ...process.env, DATABASE_URL },
  });

test('berth storage lane-sequences prints what remains with the statement to run; exit 1 while problems remain, 0 after --repair', async () => {
  const clean = run(['storage', 'lane-sequences', '--schema', schema]);
  assert.equal(clean.status, 0, clean.stderr);
  assert.match(clean.stdout, /no lane sequence problems/);

  const lane = await newLane();
  await admin.query(`ALTER SEQUENCE ${lane.seq} OWNER TO "${other}"`);
  const statement = `ALTER SEQUENCE ${schema}.lane_seq_${lane.laneId} OWNER TO ${owner};`;
  const listed = run(['storage', 'lane-sequences', '--schema', schema]);
  assert.equal(listed.status, 1);
  assert.ok(listed.stdout.includes(statement), listed.stdout);
  assert.match(listed.stdout, new RegExp(`owned by ${other}, should be ${owner}`));
  assert.match(listed.stdout, /run as one of: .*postgres/);
  assert.match(listed.stderr, /1 lane sequence problem\(s\) remain/);

  const json = run(['storage', 'lane-sequences', '--schema', schema, '--json']);
  assert.equal(json.status, 1);
  const out = JSON.parse(json.stdout);
  assert.equal(out.repair, null);
  assert.deepEqual(
    out.remaining.map((p: { laneId: number; statement: string }) => [p.laneId, `${p.statement};`]),
    [[lane.laneId, statement]],
  );

  const locked = await holdSequence(lane.seq, other);
  try {
    const busy = run(['storage', 'lane-sequences', '--schema', schema, '--repair']);
    assert.equal(busy.status, 1);
    assert.match(busy.stdout, /busy: lane_seq_\d+/);
    assert.ok(busy.stdout.includes(statement), busy.stdout);
    // migrate succeeds (exit 0) but says on stderr what it left behind.
    const migrated = run(['migrate', '--schema', schema, '--runtime-role', other]);
    assert.equal(migrated.status, 0, migrated.stderr);
    assert.match(migrated.stdout, new RegExp(`granted runtime privileges to "${other}"`));
    assert.match(migrated.stdout, /busy: lane_seq_\d+/);
    assert.match(migrated.stderr, /1 lane sequence problem\(s\) remain; see: berth storage lane-sequences/);
  } finally {
    await locked.release();
  }

  const repaired = run(['storage', 'lane-sequences', '--schema', schema, '--repair']);
  assert.equal(repaired.status, 0, repaired.stderr);
  assert.match(
    repaired.stdout,
    new RegExp(`repaired lane_seq_${lane.laneId} \\(lane ${lane.laneId}\\): owner ${other} -> ${owner}`),
  );
  assert.match(repaired.stdout, /no lane sequence problems/);

  const help = run(['storage', 'lane-sequences', '--help']);
  assert.equal(help.status, 0);
  assert.match(help.stdout, /Exit status: 0 when no problem remains, 1 when problems remain/);
  const unmigrated = run(['storage', 'lane-sequences', '--schema', `t_nothing_${process.pid}`]);
  assert.equal(unmigrated.status, 1);
  assert.match(unmigrated.stderr, /migrate it first/);
});
