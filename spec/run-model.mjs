// `npm run model`: the long simulation of spec/berth.qnt, for on-demand use (CI runs the short one in
// test/model.test.ts). Each job is one `quint run` with a fixed seed, so a result is reproducible
// with the command it prints. Jobs with every fix on must find no violation; jobs with a fix off
// must find the one they are there for. Runs as many jobs at once as the machine has cores.
//
//   npm run model                 every job
//   npm run model -- berth_two    only the jobs whose name contains "berth_two"
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const quintBin = join(root, 'node_modules', '.bin', 'quint');
const ALL = [
  'noTaskLost',
  'entriesVisibleInLaneOrder',
  'laneSegmentsInOrder',
  'windowsHoldOldest',
  'cursorNeverPassesUnleased',
  'atMostOneLiveHolder',
  'settlementsDisjointWithinCounted',
  'pruneNeverTruncatesUnsettled',
];
const WITNESSES = [
  'pruneSawLateEntry',
  'ringWrapped',
  'appendMoved',
  'staleSnapshotAppend',
  'rangeClaimed',
  'rotationRepaired',
  'cancelledRunning',
  'promoted',
  'ranTwice',
  'pruneRecovered',
  'claimLeasedAcrossSegment',
];

/** name, module, invariants (or one expression), samples, steps, seed, expected violation (null: none). */
const fixed = (main, seed, samples = 3000, steps = 40) => ({
  name: `${main} seed ${seed}`,
  args: [`--main=${main}`, '--invariants', ...ALL, '--witnesses', ...WITNESSES],
  samples,
  steps,
  seed,
  expect: null,
});
/**
 * Seeds 2^40 apart: Quint's generator is a counter (squares64 of seed + n), so nearby seeds draw
 * nearly the same runs once their streams fall into step.
 */
const spread = (k) => `0x${(BigInt(k) << 40n).toString(16)}`;
const JOBS = [
  fixed('berth', spread(1)),
  fixed('berth', spread(2)),
  fixed('berth', spread(3)),
  fixed('berth', spread(4), 600, 100),
  fixed('berth_two_lanes', spread(5)),
  fixed('berth_two_lanes', spread(6)),
  fixed('berth_filter_claim', spread(7)),
  fixed('berth_no_exact_prune', spread(8)),
  {
    name: 'berth_stale_append: a committed task lost',
    args: ['--main=berth_stale_append', '--invariants', 'noTaskLost', 'cursorNeverPassesUnleased'],
    samples: 3000,
    steps: 40,
    seed: spread(6),
    expect: ['noTaskLost', 'cursorNeverPassesUnleased'],
  },
  {
    name: 'berth_stale_append_filter_claim: a lane read across segments leased as one range',
    args: ['--main=berth_stale_append_filter_claim', '--invariants', 'cursorNeverPassesUnleased', 'claimStopsAtSegment'],
    samples: 3000,
    steps: 40,
    seed: spread(3),
    expect: ['claimStopsAtSegment'],
  },
  {
    name: 'berth_window_epoch_only: a window read while a rotation is in flight misses a committed entry',
    args: ['--main=berth_window_epoch_only', '--invariants', 'noTaskLost', 'cursorNeverPassesUnleased'],
    samples: 3000,
    steps: 40,
    seed: spread(3),
    expect: ['noTaskLost', 'cursorNeverPassesUnleased'],
  },
  {
    name: 'berth_before_18: prune truncates an unsettled entry',
    args: ['--main=berth_before_18', '--invariants', 'pruneNeverTruncatesUnsettled', 'atMostOneLiveHolder'],
    samples: 3000,
    steps: 60,
    seed: spread(1),
    expect: ['pruneNeverTruncatesUnsettled'],
  },
];

function run(job) {
  const args = [
    'run',
    'spec/berth.qnt',
    '--backend=typescript',
    '--verbosity=1',
    ...job.args,
    `--max-samples=${job.samples}`,
    `--max-steps=${job.steps}`,
    `--seed=${job.seed}`,
  ];
  const started = Date.now();
  return new Promise((resolve) => {
    execFile(quintBin, args, { cwd: root, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      const output = `${stdout}${stderr}`;
      const seconds = (Date.now() - started) / 1000;
      const violated = [...output.matchAll(/❌ (\w+)/g)].map((m) => m[1]);
      const ok = /\[ok\] No violation found/.test(output);
      const found = /\[violation\] Found an issue/.test(output);
      const pass = job.expect
        ? found && job.expect.some((name) => violated.includes(name))
        : ok && !found && (!err || err.code === 0);
      const witnesses = [...output.matchAll(/(\w+) was witnessed in (\d+) trace/g)].map((m) => `${m[1]} ${m[2]}`);
      resolve({ job, pass, seconds, violated, witnesses, output, command: `npx quint ${args.join(' ')}` });
    });
  });
}

if (!existsSync(quintBin)) {
  console.error(`quint is not installed (${quintBin}): run npm install (devDependency @informalsystems/quint)`);
  process.exit(2);
}
const filter = process.argv[2];
const jobs = JOBS.filter((j) => !filter || j.name.includes(filter));
const width = Math.max(1, availableParallelism());
const results = [];
const started = Date.now();
let next = 0;
async function worker() {
  while (next < jobs.length) {
    const job = jobs[next++];
    const r = await run(job);
    results.push(r);
    const what = r.job.expect ? `expected a violation; found: ${r.violated.join(', ') || 'none'}` : 'no violation';
    console.log(`${r.pass ? 'PASS' : 'FAIL'} ${r.job.name} (${r.seconds.toFixed(1)} s): ${what}`);
    if (r.witnesses.length > 0) console.log(`     witnessed in runs of ${r.job.samples}: ${r.witnesses.join(', ')}`);
    if (!r.pass) console.log(`     ${r.command}\n${r.output}`);
  }
}
await Promise.all(Array.from({ length: Math.min(width, jobs.length) }, worker));
const failed = results.filter((r) => !r.pass).length;
console.log(
  `${results.length - failed} passed, ${failed} failed (${((Date.now() - started) / 1000).toFixed(1)} s, ${width} at once)`,
);
process.exit(failed > 0 ? 1 : 0);
