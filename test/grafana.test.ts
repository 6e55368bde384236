import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BerthMetrics } from '../src/metrics/catalogue.js';

const DASHBOARD = fileURLToPath(new URL('../deploy/grafana/berth-dashboard.json', import.meta.url));

interface Target {
  refId?: string;
  expr?: string;
  datasource?: { type?: string; uid?: string };
}
interface Panel {
  id: number;
  type: string;
  title: string;
  datasource?: { type?: string; uid?: string };
  targets?: Target[];
  panels?: Panel[];
}

/** JSON.parse throws on invalid JSON, which fails the test that reads it. */
function readDashboard(): {
  schemaVersion: number;
  uid: string;
  panels: Panel[];
  templating: { list: Record<string, unknown>[] };
} {
  return JSON.parse(readFileSync(DASHBOARD, 'utf8'));
}

/** Every panel, including those nested in (collapsed) rows; rows themselves are left out. */
function dataPanels(panels: Panel[]): Panel[] {
  return panels.flatMap((p) => (p.type === 'row' ? dataPanels(p.panels ?? []) : [p]));
}

/** The metric names an expression mentions. */
function metricNames(expr: string): string[] {
  return expr.match(/berth_[a-z_]+/g) ?? [];
}

async function exportedSeriesNames(): Promise<Set<string>> {
  const metrics = await new BerthMetrics().registry.getMetricsAsJSON();
  const histograms = metrics.filter((m) => String(m.type) === 'histogram');
  const suffixed = histograms.flatMap((m) => ['_bucket', '_sum', '_count'].map((s) => `${m.name}${s}`));
  return new Set([...metrics.map((m) => m.name), ...suffixed]);
}

// biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's variable syntax, meant literally
const PROMETHEUS_DS = { type: 'prometheus', uid: '${datasource}' };

// biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's variable syntax, meant literally
test('the dashboard is valid JSON with a prometheus ${datasource} variable', () => {
  const d = readDashboard();
  assert.ok(d.schemaVersion >= 36 && d.schemaVersion <= 41, `schemaVersion ${d.schemaVersion}`);
  assert.equal(d.uid, 'berth-overview');
  const ds = d.templating.list.find((v) => v.name === 'datasource');
  assert.ok(ds, 'no datasource template variable');
  assert.equal(ds.type, 'datasource');
  assert.equal(ds.query, 'prometheus');
});

// biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's variable syntax, meant literally
test('every panel has a target with an expression, on the ${datasource} variable', () => {
  const panels = dataPanels(readDashboard().panels);
  assert.ok(panels.length >= 20, `only ${panels.length} panels`);
  const ids = new Set<number>();
  for (const p of panels) {
    assert.ok(!ids.has(p.id), `panel id ${p.id} is used twice`);
    ids.add(p.id);
    assert.deepEqual(p.datasource, PROMETHEUS_DS, `${p.title}: datasource`);
    assert.ok((p.targets ?? []).length >= 1, `${p.title} has no target`);
    for (const t of p.targets ?? []) {
      assert.ok(t.expr?.trim(), `${p.title} target ${t.refId} has no expr`);
      assert.deepEqual(t.datasource, PROMETHEUS_DS, `${p.title} target ${t.refId}: datasource`);
    }
  }
});

test('every metric a panel or variable references is one berth exports', async () => {
  const exported = await exportedSeriesNames();
  const d = readDashboard();
  const exprs = dataPanels(d.panels).flatMap((p) =>
    (p.targets ?? []).map((t) => ({ where: p.title, expr: t.expr ?? '' })),
  );
  for (const v of d.templating.list) {
    if (typeof v.definition === 'string') exprs.push({ where: `variable ${String(v.name)}`, expr: v.definition });
  }
  for (const { where, expr } of exprs) {
    const used = metricNames(expr);
    assert.ok(used.length > 0 || where.startsWith('variable'), `${where}: references no berth metric: ${expr}`);
    for (const name of used)
      assert.ok(exported.has(name), `${where} references ${name}, which src/metrics/catalogue.ts does not export`);
  }
});

test('the dashboard covers every metric berth exports', async () => {
  const used = new Set(
    dataPanels(readDashboard().panels).flatMap((p) => (p.targets ?? []).flatMap((t) => metricNames(t.expr ?? ''))),
  );
  const bases = [...used].map((n) => n.replace(/_(bucket|sum|count)$/, ''));
  for (const m of await new BerthMetrics().registry.getMetricsAsJSON()) {
    assert.ok(used.has(m.name) || bases.includes(m.name), `no panel shows ${m.name}`);
  }
});

test('every panel expression parses as PromQL (promtool check rules)', (t) => {
  const exprs = dataPanels(readDashboard().panels).flatMap((p) => (p.targets ?? []).map((tg) => tg.expr ?? ''));
  // Grafana's variables, as Grafana would substitute them.
  const concrete = exprs.map((e) => e.replaceAll('$__rate_interval', '1m').replaceAll('$task_type', '.*'));
  const rules = concrete
    .map((expr, i) => `      - record: berth_dashboard:panel_${i}\n        expr: ${JSON.stringify(expr)}\n`)
    .join('');
  const dir = mkdtempSync(join(tmpdir(), 'berth-dashboard-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, 'panels.yaml');
  writeFileSync(file, `groups:\n  - name: dashboard\n    rules:\n${rules}`);
  const r = spawnSync('promtool', ['check', 'rules', file], { encoding: 'utf8' });
  if (r.error && (r.error as NodeJS.ErrnoException).code === 'ENOENT') {
    assert.fail(
      'promtool is not on PATH. Install it with `apt-get install prometheus` (the Debian package ships promtool), or run scripts/test-prereqs.sh.',
    );
  }
  assert.equal(r.status, 0, `promtool rejected a panel expression:\n${r.stdout}${r.stderr}`);
});
