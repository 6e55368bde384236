import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse, stringify } from 'yaml';
import { BerthMetrics } from '../src/metrics/catalogue.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const RULES = join(ROOT, 'deploy/prometheus/berth-alerts.yaml');
const RULE_TESTS = join(ROOT, 'deploy/prometheus/berth-alerts.test.yaml');
/** As the rules' runbook_url names it (relative to the repository). */
const OPERATIONS = 'docs/operations.md';

interface AlertRule {
  alert: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

function readRules(): { groups: { name: string; rules: AlertRule[] }[] } {
  return parse(readFileSync(RULES, 'utf8'));
}

function rulesOf(doc: ReturnType<typeof readRules>): AlertRule[] {
  return doc.groups.flatMap((g) => g.rules);
}

const PROMTOOL_MISSING =
  'promtool is not on PATH. Install it with `apt-get install prometheus` (the Debian package ships promtool), ' +
  'or run scripts/test-prereqs.sh.';

/** promtool, or a failure that says how to get it: these checks are never skipped. */
function promtool(...args: string[]): Promise<{ ok: boolean; output: string }> {
  return new Promise((resolve, reject) => {
    execFile('promtool', args, { encoding: 'utf8', maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err?.code === 'ENOENT') return reject(new assert.AssertionError({ message: PROMTOOL_MISSING }));
      // A number is promtool's exit status; anything else is a failure to run it at all.
      if (err && typeof err.code !== 'number') return reject(err);
      resolve({ ok: !err, output: `${stdout}${stderr}` });
    });
  });
}

/** Every series name berth exports (histograms also as _bucket, _sum and _count). */
async function exportedMetricNames(): Promise<Set<string>> {
  const names = new Set<string>();
  for (const m of await new BerthMetrics().registry.getMetricsAsJSON()) {
    names.add(m.name);
    if (String(m.type) === 'histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(`${m.name}${s}`);
  }
  return names;
}

/** GitHub's heading anchors for the headings of a Markdown file. */
function anchorsOf(markdown: string): Set<string> {
  const anchors = new Set<string>();
  for (const m of markdown.matchAll(/^#{1,6}\s+(.+?)\s*$/gm)) {
    anchors.add(
      m[1]!
        .toLowerCase()
        .replace(/[^\p{L}\p{N}\s_-]/gu, '')
        .replace(/\s/g, '-'),
    );
  }
  return anchors;
}

const squash = (s: string) => s.replace(/\s+/g, ' ').trim();

test('promtool check rules accepts the rule file', async () => {
  const r = await promtool('check', 'rules', RULES);
  assert.ok(r.ok, `promtool check rules ${RULES} failed:\n${r.output}`);
});

test('promtool unit tests of the alerts pass', async () => {
  const r = await promtool('test', 'rules', RULE_TESTS);
  assert.ok(r.ok, `promtool test rules ${RULE_TESTS} failed:\n${r.output}`);
});

test('the starvation alert is the seed expression with berth metric names', () => {
  const starvation = rulesOf(readRules()).find((r) => r.alert === 'BerthTaskStarvation');
  assert.ok(starvation, 'BerthTaskStarvation is missing');
  assert.equal(
    squash(starvation.expr),
    'max(berth_task_oldest_due_seconds) > 300 and (sum(max by (task_type) (berth_tasks_running)) or vector(0)) < sum(berth_task_slots)',
  );
});

/**
 * Each clause of an alert is there for a reason: remove it (or replace it with the obvious
 * alternative) and the promtool case that shows the reason must fail. A mutation that leaves
 * every case green would mean the unit tests do not cover that clause.
 */
const MUTATIONS: { alert: string; what: string; from: string; to: string; failing: string }[] = [
  {
    alert: 'BerthTaskStarvation',
    what: 'without the capacity clause a whole-fleet sweep fires',
    from: ' and (sum(max by (task_type) (berth_tasks_running)) or vector(0)) < sum(berth_task_slots)',
    to: '',
    failing: 'starvation / a whole-fleet sweep keeps every slot busy and does not fire',
  },
  {
    alert: 'BerthTaskStarvation',
    what: 'comparing against nothing running misses one busy slot of twelve',
    from: '< sum(berth_task_slots)',
    to: '== 0',
    failing: 'starvation / one busy slot of twelve with old due work fires (after 5m)',
  },
  {
    alert: 'BerthTaskStarvation',
    what: 'without or vector(0) nothing running at all is never starvation',
    from: '(sum(max by (task_type) (berth_tasks_running)) or vector(0))',
    to: 'sum(max by (task_type) (berth_tasks_running))',
    failing: 'starvation / nothing running at all (no berth_tasks_running series) fires; or vector(0)',
  },
  {
    alert: 'BerthTaskStarvation',
    what: 'without max by (task_type) a leadership hand-over counts leases twice',
    from: 'sum(max by (task_type) (berth_tasks_running))',
    to: 'sum(berth_tasks_running)',
    failing: 'starvation / a leadership hand-over exporting the same leases twice is not double counted',
  },
  {
    alert: 'BerthTaskStarvation',
    what: 'without the oldest-due clause an idle fleet with fresh work fires',
    from: 'max(berth_task_oldest_due_seconds) > 300 and ',
    to: '',
    failing: 'starvation / oldest due at or below 300 s does not fire, idle fleet or not',
  },
  {
    alert: 'BerthTaskFailureRate',
    what: 'without the volume clause a handful of runs fires',
    from: ' and sum by (task_type) (increase(berth_task_outcomes_total[15m])) >= 20',
    to: '',
    failing: 'failure rate / too few runs to judge does not fire',
  },
  {
    alert: 'BerthTaskFailureRate',
    what: 'counting every non-success as failure pages on a rollout',
    from: '{outcome=~"failure|timeout"}',
    to: '{outcome!="success"}',
    failing: 'failure rate / a rollout (cancelled, continued) is not a failure',
  },
  {
    alert: 'BerthDeadLettersGrowing',
    what: 'without the new-type branch a new type dead-lettering at once is missed',
    from: ' or ( (max by (task_type) (berth_tasks_dead) > 0) unless on (task_type) max by (task_type) (berth_tasks_dead offset 30m) ) and on () (count(berth_task_slots offset 30m) > 0)',
    to: '',
    failing: 'dead letters / a type whose first dead letters appear in the window fires',
  },
  {
    alert: 'BerthDeadLettersGrowing',
    what: 'without the history guard a fresh Prometheus fires on old dead letters',
    from: ' and on () (count(berth_task_slots offset 30m) > 0)',
    to: '',
    failing: 'dead letters / a fresh Prometheus (no history) does not fire on old dead letters',
  },
  {
    alert: 'BerthNoMaintenanceLeader',
    what: 'without the workers clause a fleet scaled to zero pages',
    from: ' and on () sum(berth_task_slots) > 0',
    to: '',
    failing: 'no leader / a fleet scaled to zero does not page',
  },
  {
    alert: 'BerthNoMaintenanceLeader',
    what: 'without or vector(0) no process exporting the gauge is not "no leader"',
    from: '(sum(berth_maintenance_leader) or vector(0))',
    to: 'sum(berth_maintenance_leader)',
    failing: 'no leader / no process exporting the gauge while workers are up fires; or vector(0)',
  },
  {
    alert: 'BerthPromotionWaiterTimedOut',
    what: 'increase() alone misses the first timeout of a process',
    from: '( berth_promote_lane_contention_total{outcome="waiter_timed_out"} unless berth_promote_lane_contention_total{outcome="waiter_timed_out"} offset 15m ) and on () (count(berth_task_slots offset 15m) > 0) or ',
    to: '',
    failing: 'waiter timed out / the first timeout of a process (a new series) fires, then resolves',
  },
  {
    alert: 'BerthPromotionWaiterTimedOut',
    what: 'without the history guard a fresh Prometheus fires on old counts',
    from: ' and on () (count(berth_task_slots offset 15m) > 0)',
    to: '',
    failing: 'waiter timed out / a fresh Prometheus does not fire on old counts',
  },
  {
    alert: 'BerthStuckHandlers',
    what: 'without sum by (task_type) each process pages on its own',
    from: 'sum by (task_type) (berth_task_stuck_handlers)',
    to: 'berth_task_stuck_handlers',
    failing: "stuck handlers / stuck for 5m fires once per type with the fleet's count",
  },
  {
    alert: 'BerthTasksBlocked',
    what: 'summing instead of max by (queue) doubles the count over a leadership hand-over',
    from: 'max by (queue) (berth_tasks_blocked)',
    to: 'sum by (queue) (berth_tasks_blocked)',
    failing: 'blocked / a leadership hand-over exporting the same count twice is not doubled',
  },
  {
    alert: 'BerthScheduleNotFiring',
    what: 'without the 30 s floor an every-second schedule pages on one slow tick',
    from: 'clamp_min(2 * berth_schedule_interval_seconds, 30)',
    to: '2 * berth_schedule_interval_seconds',
    failing: 'schedule / an every-second schedule a few seconds behind at the scrape does not fire',
  },
];

test('each clause matters: without it, the promtool case that shows why fails', { concurrency: 2 }, async (t) => {
  await Promise.all(MUTATIONS.map((m) => t.test(`${m.alert}: ${m.what}`, (st) => mutationFails(m, st))));
});

async function mutationFails(m: (typeof MUTATIONS)[number], t: TestContext): Promise<void> {
  const doc = readRules();
  const rule = rulesOf(doc).find((r) => r.alert === m.alert);
  assert.ok(rule, `${m.alert} is missing`);
  const expr = squash(rule.expr).replace(/\( /g, '(').replace(/ \)/g, ')');
  const from = m.from.replace(/\( /g, '(').replace(/ \)/g, ')');
  assert.ok(expr.includes(from), `${m.alert}: expected its expr to contain\n  ${from}\nbut it is\n  ${expr}`);
  rule.expr = expr.replace(from, m.to);
  const dir = mkdtempSync(join(tmpdir(), 'berth-alerts-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, 'berth-alerts.yaml'), stringify(doc));
  copyFileSync(RULE_TESTS, join(dir, 'berth-alerts.test.yaml'));
  const r = await promtool('test', 'rules', join(dir, 'berth-alerts.test.yaml'));
  assert.ok(!r.ok, `with the mutated expr\n  ${rule.expr}\nevery promtool case still passes:\n${r.output}`);
  assert.ok(
    r.output.includes(`name: ${m.failing},`),
    `expected the case "${m.failing}" to fail; promtool said:\n${r.output}`,
  );
}

test('every metric an alert references is one berth exports', async () => {
  const exported = await exportedMetricNames();
  for (const rule of rulesOf(readRules())) {
    const used = rule.expr.match(/\bberth_[a-z0-9_]+/g) ?? [];
    assert.ok(used.length > 0, `${rule.alert} references no berth metric`);
    for (const name of used)
      assert.ok(exported.has(name), `${rule.alert} references ${name}, which src/metrics/catalogue.ts does not export`);
  }
});

test('every alert has a severity, a summary, a description and a runbook section in docs/operations.md', () => {
  const doc = readRules();
  assert.deepEqual(
    doc.groups.map((g) => g.name),
    ['berth'],
  );
  const anchors = anchorsOf(readFileSync(join(ROOT, OPERATIONS), 'utf8'));
  for (const rule of rulesOf(doc)) {
    assert.match(rule.labels?.severity ?? '', /^(critical|warning)$/, `${rule.alert}: severity`);
    assert.ok(rule.annotations?.summary, `${rule.alert}: summary`);
    assert.ok(rule.annotations?.description, `${rule.alert}: description`);
    const url = rule.annotations?.runbook_url ?? '';
    const [file, anchor] = url.split('#');
    assert.equal(file, OPERATIONS, `${rule.alert}: runbook_url ${url} should point into ${OPERATIONS}`);
    assert.ok(anchor && anchors.has(anchor), `${rule.alert}: ${OPERATIONS} has no heading with the anchor #${anchor}`);
  }
});

test('docs/operations.md describes every metric berth exports', async () => {
  const ops = readFileSync(join(ROOT, OPERATIONS), 'utf8');
  for (const m of await new BerthMetrics().registry.getMetricsAsJSON()) {
    assert.ok(
      ops.includes(`\`${m.name}\``),
      `${m.name} is exported by src/metrics/catalogue.ts but not described in ${OPERATIONS} (add it to the metrics table)`,
    );
  }
});
