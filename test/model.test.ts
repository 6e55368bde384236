/**
 * The Quint model of berth's storage protocol (spec/berth_protocol.qnt; spec/README.md says what
 * it models and how it maps to the code), run by Quint's simulator:
 * - with every fix on (module `berth`), a bounded simulation breaks none of the invariants of
 *   docs/architecture.md, and reaches the interleavings that matter (the ring wrapping, an append
 *   racing a rotation, a REPEATABLE READ producer appending with a snapshot older than the ring);
 * - with the append fix off (module `berth_stale_append`: the segment read from the transaction's
 *   snapshot, as before migration 18), it finds the stale-snapshot loss of issue 27 and names the
 *   invariant it breaks.
 * Each run has a fixed seed, so it is deterministic: the same runs on every machine, however
 * loaded (no timing is asserted; the timeouts are liveness bounds). Seeds lie 2^40 apart: Quint's
 * generator is a counter, so seeds 1, 2, 3… draw nearly the same runs (spec/README.md). The simulator is the
 * TypeScript backend of @informalsystems/quint (a devDependency): its default, the Rust one,
 * downloads a binary at run time.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const quintBin = join(root, 'node_modules', '.bin', 'quint');
const spec = join(root, 'spec', 'berth.qnt');
const summary = join(root, 'spec', 'trace-summary.mjs');
/** A liveness bound for a machine running several suites at once; never a timing assertion. */
const RUN_MS = 600_000;

/** docs/architecture.md's invariants, as spec/berth_protocol.qnt names them. */
const INVARIANTS = [
  'noTaskLost',
  'entriesVisibleInLaneOrder',
  'laneSegmentsInOrder',
  'windowsHoldOldest',
  'cursorNeverPassesUnleased',
  'atMostOneLiveHolder',
  'settlementsDisjointWithinCounted',
  'pruneNeverTruncatesUnsettled',
];

interface QuintRun {
  code: number;
  output: string;
}

function quint(args: string[]): Promise<QuintRun> {
  if (!existsSync(quintBin)) {
    assert.fail(
      `the Quint simulator is not installed (${quintBin} is missing): it is the devDependency ` +
        '@informalsystems/quint; run `npm install` in the repository',
    );
  }
  return new Promise((resolve, reject) => {
    execFile(
      quintBin,
      ['run', spec, '--backend=typescript', '--verbosity=1', ...args],
      { cwd: root, timeout: RUN_MS, maxBuffer: 64 * 1024 * 1024 },
      (err, stdout, stderr) => {
        const output = `${stdout}${stderr}`;
        if (err && typeof err.code !== 'number') {
          reject(new Error(`quint ${args.join(' ')} did not finish: ${err.message}\n${output}`));
          return;
        }
        if (/Class extends value undefined|XPathLexer/.test(output)) {
          reject(
            new Error(
              'quint cannot start: its parser dependency antlr4ts resolved to the broken 0.5.0-dev; ' +
                'package-lock.json pins 0.5.0-alpha.4, so run `npm install` from the lock file\n' +
                output,
            ),
          );
          return;
        }
        resolve({ code: err ? Number(err.code) : 0, output });
      },
    );
  });
}

/** The invariants a violation report names (`❌ <name>` lines). */
function violated(output: string): string[] {
  return [...output.matchAll(/❌ (\w+)/g)].map((m) => m[1]!);
}

/** How many runs reached each witness (`<name> was witnessed in <n> trace(s)`). */
function witnessed(output: string): Map<string, number> {
  return new Map([...output.matchAll(/(\w+) was witnessed in (\d+) trace/g)].map((m) => [m[1]!, Number(m[2])]));
}

/** One line per step of an ITF trace (spec/trace-summary.mjs), for the test's diagnostics. */
function summarise(itf: string): Promise<string> {
  return new Promise((resolve) => {
    execFile(process.execPath, [summary, itf], { cwd: root, timeout: RUN_MS }, (err, stdout, stderr) => {
      resolve(err ? `(no trace summary: ${err.message} ${stderr})` : stdout);
    });
  });
}

test('with every fix on, a bounded simulation breaks no invariant and reaches the interleavings that matter', {
  timeout: RUN_MS,
}, async (t) => {
  const witnesses = [
    'ringWrapped',
    'appendMoved',
    'staleSnapshotAppend',
    'rangeClaimed',
    'ranTwice',
    'pruneSawLateEntry',
    'pruneRecovered',
    'claimLeasedAcrossSegment',
  ];
  const run = await quint([
    '--main=berth',
    '--invariants',
    ...INVARIANTS,
    '--witnesses',
    ...witnesses,
    '--max-samples=300',
    '--max-steps=40',
    '--seed=0x10000000000',
  ]);
  assert.equal(run.code, 0, `the model with every fix on broke an invariant:\n${run.output}`);
  assert.match(run.output, /\[ok\] No violation found/);
  const seen = witnessed(run.output);
  t.diagnostic(`runs (of 300) that reached: ${[...seen].map(([w, n]) => `${w} ${n}`).join(', ')}`);
  for (const w of ['ringWrapped', 'appendMoved', 'staleSnapshotAppend', 'rangeClaimed', 'ranTwice']) {
    assert.ok((seen.get(w) ?? 0) > 0, `no run reached ${w}: the simulation no longer covers it\n${run.output}`);
  }
  // Never needed with the fixes: prune's last line of defence, a lease over another segment's entry.
  assert.equal(seen.get('pruneRecovered'), 0, run.output);
  assert.equal(seen.get('claimLeasedAcrossSegment'), 0, run.output);
});

test('with the append reading its segment from a stale snapshot (before migration 18), the simulation finds the loss', {
  timeout: RUN_MS,
}, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'berth-model-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  // The first invariant the stale append breaks: a lane goes back to an older segment.
  const first = await quint([
    '--main=berth_stale_append',
    '--invariants',
    'noTaskLost',
    'laneSegmentsInOrder',
    'cursorNeverPassesUnleased',
    '--max-samples=1000',
    '--max-steps=40',
    '--seed=0x10000000000',
  ]);
  assert.equal(first.code, 1, `expected a violation:\n${first.output}`);
  assert.match(first.output, /\[violation\] Found an issue/);
  const names = violated(first.output);
  assert.ok(names.length > 0, `the report names no invariant:\n${first.output}`);
  for (const name of names) {
    assert.ok(['noTaskLost', 'laneSegmentsInOrder', 'cursorNeverPassesUnleased'].includes(name), first.output);
  }
  // And the loss itself: a committed task that no claim will ever take (its lane's cursor passed it).
  const itf = join(dir, 'loss.itf.json');
  const loss = await quint([
    '--main=berth_stale_append',
    '--invariants',
    'noTaskLost',
    'cursorNeverPassesUnleased',
    '--max-samples=3000',
    '--max-steps=40',
    '--seed=0x20000000000',
    `--out-itf=${itf}`,
  ]);
  assert.equal(loss.code, 1, `expected a lost task:\n${loss.output}`);
  assert.deepEqual(violated(loss.output).sort(), ['cursorNeverPassesUnleased', 'noTaskLost'], loss.output);
  if (existsSync(itf)) {
    t.diagnostic('counterexample (spec/trace-summary.mjs):');
    for (const line of (await summarise(itf)).trimEnd().split('\n')) t.diagnostic(line);
  }
});
