import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { metrics as otelApi } from '@opentelemetry/api';
import { DataPointType, MeterProvider, MetricReader, type MetricData } from '@opentelemetry/sdk-metrics';
import { Gauge, Registry } from 'prom-client';
import { BerthMetrics } from '../src/metrics/catalogue.js';
import {
  CounterMetric,
  GaugeMetric,
  HistogramMetric,
  histogramEntriesWritable,
  otelName,
} from '../src/metrics/instruments.js';
import { metricsRequestHandler, startMetricsServer } from '../src/observability/metrics-http.js';

/** A reader the test collects from on demand. */
class TestReader extends MetricReader {
  protected override async onForceFlush(): Promise<void> {}
  protected override async onShutdown(): Promise<void> {}
}

function sdk(): { meter: MeterProvider; reader: TestReader } {
  const reader = new TestReader();
  return { meter: new MeterProvider({ readers: [reader] }), reader };
}

async function collect(reader: TestReader): Promise<Map<string, MetricData>> {
  const { resourceMetrics, errors } = await reader.collect();
  assert.deepEqual(errors, []);
  const out = new Map<string, MetricData>();
  for (const sm of resourceMetrics.scopeMetrics) for (const m of sm.metrics) out.set(m.descriptor.name, m);
  return out;
}

/** Attribute sets compared as Prometheus label sets (sorted `k=v`). */
function key(labels: Record<string, unknown>): string {
  return Object.entries(labels)
    .filter(([k]) => k !== 'le')
    .map(([k, v]) => `${k}=${String(v)}`)
    .sort()
    .join(',');
}

type Instrument = CounterMetric | HistogramMetric | GaugeMetric;

/** Every instrument of a BerthMetrics, with its label names (prom-client keeps them on the metric). */
function instruments(m: BerthMetrics): { field: string; inst: Instrument; labelNames: string[] }[] {
  return Object.entries(m).flatMap(([field, inst]) => {
    if (!(inst instanceof CounterMetric || inst instanceof HistogramMetric || inst instanceof GaugeMetric)) return [];
    const labelNames = (inst.prom as unknown as { labelNames: unknown }).labelNames;
    assert.ok(Array.isArray(labelNames), `${field}: prom-client metric exposes labelNames`);
    return [{ field, inst, labelNames: labelNames as string[] }];
  });
}

test('every Prometheus instrument has an OpenTelemetry twin with the same name, labels and values', async () => {
  const { meter, reader } = sdk();
  const m = new BerthMetrics({ meter: meter.getMeter('berth') });
  const all = instruments(m);
  assert.ok(all.length >= 30, `found ${all.length} instruments`);
  // Exercise each instrument twice with two label sets, the way the call sites do.
  for (const { inst, labelNames } of all) {
    for (const [i, suffix] of ['a', 'b'].entries()) {
      const labels = Object.fromEntries(labelNames.map((l) => [l, `${l}_${suffix}`]));
      const v = (i + 1) * 0.004;
      if (inst instanceof CounterMetric) labelNames.length ? inst.inc(labels, i + 2) : inst.inc(i + 2);
      else if (inst instanceof HistogramMetric) labelNames.length ? inst.observe(labels, v) : inst.observe(v);
      else labelNames.length ? inst.set(labels, i + 5) : inst.set(i + 5);
    }
  }
  const otel = await collect(reader);
  const prom = await m.registry.getMetricsAsJSON();
  assert.equal(prom.length, all.length);
  for (const pm of prom) {
    const om = otel.get(otelName(pm.name));
    assert.ok(om, `OpenTelemetry has ${otelName(pm.name)} (for ${pm.name})`);
    assert.equal(om.descriptor.description, pm.help);
    const points = new Map(om.dataPoints.map((p) => [key(p.attributes), p]));
    const values = pm.values as { labels: Record<string, string | number>; value: number; metricName?: string }[];
    const labelSets = new Set(values.map((v) => key(v.labels)));
    assert.deepEqual([...points.keys()].sort(), [...labelSets].sort(), `${pm.name}: label sets`);
    for (const v of values) {
      const p = points.get(key(v.labels))!;
      assert.deepEqual(
        Object.keys(p.attributes).sort(),
        Object.keys(v.labels)
          .filter((k) => k !== 'le')
          .sort(),
        `${pm.name}: label keys`,
      );
    }
    const type = String(pm.type);
    if (type === 'counter') {
      assert.ok(pm.name.endsWith('_total'), pm.name);
      assert.equal(om.descriptor.name, pm.name.slice(0, -'_total'.length));
      assert.equal(om.dataPointType, DataPointType.SUM);
      assert.ok(om.dataPointType === DataPointType.SUM && om.isMonotonic);
      for (const v of values) assert.equal(points.get(key(v.labels))!.value, v.value, `${pm.name} ${key(v.labels)}`);
    } else if (type === 'gauge') {
      assert.equal(om.descriptor.name, pm.name);
      assert.equal(om.dataPointType, DataPointType.GAUGE);
      for (const v of values) assert.equal(points.get(key(v.labels))!.value, v.value, `${pm.name} ${key(v.labels)}`);
    } else {
      assert.equal(type, 'histogram');
      assert.equal(om.descriptor.name, pm.name);
      assert.equal(om.dataPointType, DataPointType.HISTOGRAM);
      if (om.dataPointType !== DataPointType.HISTOGRAM) continue;
      if (pm.name.endsWith('_seconds')) assert.equal(om.descriptor.unit, 's');
      for (const [k, p] of om.dataPoints.map((d) => [key(d.attributes), d] as const)) {
        const mine = values.filter((v) => key(v.labels) === k);
        const count = mine.find((v) => v.metricName === `${pm.name}_count`)!.value;
        const sum = mine.find((v) => v.metricName === `${pm.name}_sum`)!.value;
        assert.equal(p.value.count, count);
        assert.ok(Math.abs((p.value.sum ?? NaN) - sum) < 1e-12);
        // Same boundaries; Prometheus buckets are cumulative, OpenTelemetry's are not.
        const promBuckets = mine.filter((v) => v.metricName === `${pm.name}_bucket` && v.labels.le !== '+Inf');
        assert.deepEqual(
          p.value.buckets.boundaries,
          promBuckets.map((b) => Number(b.labels.le)),
        );
        let running = 0;
        p.value.buckets.boundaries.forEach((_, i) => {
          running += p.value.buckets.counts[i]!;
          assert.equal(running, promBuckets[i]!.value, `${pm.name} le=${promBuckets[i]!.labels.le}`);
        });
      }
    }
  }
});

test('a gauge reset carries over: the label set it dropped reads 0, the others their new values', async () => {
  const { meter, reader } = sdk();
  const m = new BerthMetrics({ meter: meter.getMeter('berth') });
  m.pending.set({ task_type: 'g' }, 6);
  m.pending.set({ task_type: 'h' }, 2);
  m.oldestDueSeconds.set(42);
  const before = await collect(reader);
  assert.deepEqual(
    before.get('berth_tasks_pending')!.dataPoints.map((p) => [p.attributes, p.value]),
    [
      [{ task_type: 'g' }, 6],
      [{ task_type: 'h' }, 2],
    ],
  );
  m.pending.reset();
  m.pending.set({ task_type: 'h' }, 3);
  m.oldestDueSeconds.reset();
  const after = await collect(reader);
  const pending = new Map(after.get('berth_tasks_pending')!.dataPoints.map((p) => [p.attributes.task_type, p.value]));
  assert.equal(pending.get('g'), 0, 'no stale 6 from before the reset');
  assert.equal(pending.get('h'), 3);
  assert.equal(after.get('berth_task_oldest_due_seconds')!.dataPoints[0]!.value, 0);
  assert.equal(after.get('berth_task_oldest_due_seconds')!.descriptor.unit, 's');
});

test('bound counters and histograms export exactly what the same calls through prom-client do', async () => {
  assert.equal(histogramEntriesWritable(), true, 'this prom-client keeps histogram entries where publish writes them');
  const { meter, reader } = sdk();
  const bound = new BerthMetrics({ meter: meter.getMeter('berth') });
  const direct = new BerthMetrics({ registry: new Registry() });
  const values = [0, 0.0004, 0.001, 0.0049, 0.005, 0.3, 7, 59.9, 60, 301, 4000, 1e-9];
  const h = bound.handlerSeconds.bind({ task_type: 'a' });
  const w = bound.taskWaitSeconds.bind({ task_type: 'a' });
  const ok = bound.outcomes.bind({ task_type: 'a', outcome: 'success' });
  const failed = bound.outcomes.bind({ task_type: 'b', outcome: 'failure' });
  const read = async (m: BerthMetrics) =>
    (await m.registry.metrics()).split('\n').filter((l) => /^berth_(task_handler|task_wait|task_outcomes)/.test(l));
  // Twice, with a read between: a read publishes what was pending and nothing twice.
  for (let round = 0; round < 2; round++) {
    for (const v of values) {
      h.observe(v);
      w.observe(v * 2);
      direct.handlerSeconds.observe({ task_type: 'a' }, v);
      direct.taskWaitSeconds.observe({ task_type: 'a' }, v * 2);
      ok.inc();
      direct.outcomes.inc({ task_type: 'a', outcome: 'success' });
    }
    failed.inc(3);
    direct.outcomes.inc({ task_type: 'b', outcome: 'failure' }, 3);
    assert.deepEqual(await read(bound), await read(direct), `round ${round}`);
    assert.deepEqual(await read(bound), await read(direct), `round ${round}, read again`);
  }
  // The OpenTelemetry side still records every call.
  const otel = await collect(reader);
  const hp = otel.get('berth_task_handler_seconds')!.dataPoints[0]!.value as { count: number; sum: number };
  assert.equal(hp.count, 2 * values.length);
  assert.ok(Math.abs(hp.sum - 2 * values.reduce((a, b) => a + b, 0)) < 1e-6);
  assert.equal(otel.get('berth_task_outcomes')!.dataPoints.find((p) => p.attributes.outcome === 'success')!.value, 24);
  // A reset drops what was counted and not yet read, as it drops what was.
  h.observe(1);
  ok.inc(5);
  bound.handlerSeconds.reset();
  bound.outcomes.reset();
  const after = await bound.registry.metrics();
  assert.doesNotMatch(after, /berth_task_handler_seconds_count/);
  assert.doesNotMatch(after, /berth_task_outcomes_total\{/);
  h.observe(0.002);
  assert.match(await bound.registry.metrics(), /^berth_task_handler_seconds_count\{task_type="a"\} 1$/m);
});

test('binding a label set again shares its counts; prom-client resets and removes drop unread counts', async () => {
  const m = new BerthMetrics({ registry: new Registry() });
  // Each worker (and runDueTasks call) on a shared BerthMetrics binds its task types again.
  for (let i = 0; i < 50; i++) {
    m.outcomes.bind({ task_type: 'a', outcome: 'success' }).inc();
    m.handlerSeconds.bind({ task_type: 'a' }).observe(0.002);
  }
  const held = (inst: object) => (inst as unknown as { bound: Map<string, unknown> }).bound.size;
  assert.equal(held(m.outcomes), 1, 'one pending count per label set, not per bind');
  assert.equal(held(m.handlerSeconds), 1);
  let text = await m.registry.metrics();
  assert.match(text, /^berth_task_outcomes_total\{task_type="a",outcome="success"\} 50$/m);
  assert.match(text, /^berth_task_handler_seconds_count\{task_type="a"\} 50$/m);
  // Unread counts go with prom-client's own reset (registry.resetMetrics) and remove.
  const c = m.outcomes.bind({ task_type: 'a', outcome: 'success' });
  const h = m.handlerSeconds.bind({ task_type: 'a' });
  const other = m.handlerSeconds.bind({ task_type: 'b' });
  c.inc(5);
  h.observe(1);
  m.registry.resetMetrics();
  text = await m.registry.metrics();
  assert.doesNotMatch(text, /berth_task_outcomes_total\{/);
  assert.doesNotMatch(text, /berth_task_handler_seconds_count/);
  h.observe(1);
  other.observe(1);
  m.handlerSeconds.prom.remove({ task_type: 'a' });
  text = await m.registry.metrics();
  assert.doesNotMatch(text, /berth_task_handler_seconds_count\{task_type="a"\}/);
  assert.match(text, /^berth_task_handler_seconds_count\{task_type="b"\} 1$/m);
  c.inc(2);
  m.outcomes.prom.remove('a', 'success');
  assert.doesNotMatch(await m.registry.metrics(), /berth_task_outcomes_total\{/);
});

test('a bound instrument refuses an unknown label at bind and a bad value at once', () => {
  const m = new BerthMetrics({ registry: new Registry() });
  assert.throws(() => m.outcomes.bind({ task_type: 'a', nope: 'x' } as never), /label/i);
  assert.throws(() => m.handlerSeconds.bind({ nope: 'x' } as never), /label/i);
  const h = m.handlerSeconds.bind({ task_type: 'a' });
  assert.throws(() => h.observe(Number.NaN), TypeError);
  assert.throws(() => h.observe(Number.POSITIVE_INFINITY), TypeError);
  const c = m.outcomes.bind({ task_type: 'a', outcome: 'success' });
  assert.throws(() => c.inc(-1), RangeError);
});

test('a sampled gauge reads the sum of its readers when read; removing one leaves the rest', async () => {
  const { meter, reader } = sdk();
  const m = new BerthMetrics({ meter: meter.getMeter('berth') });
  let a = 3;
  let b = 4;
  const stopA = m.busySlots.sample(() => a);
  const stopB = m.busySlots.sample(() => b);
  assert.match(await m.registry.metrics(), /^berth_task_slots_busy 7$/m);
  a = 1;
  assert.match(await m.registry.metrics(), /^berth_task_slots_busy 5$/m);
  assert.equal((await collect(reader)).get('berth_task_slots_busy')!.dataPoints[0]!.value, 5);
  stopA();
  stopA();
  assert.match(await m.registry.metrics(), /^berth_task_slots_busy 4$/m);
  stopB();
  b = 9;
  assert.match(await m.registry.metrics(), /^berth_task_slots_busy 0$/m);
});

test('several BerthMetrics on one meter: counters add up, slots add up, leader gauges take the largest', async () => {
  const { meter, reader } = sdk();
  const a = new BerthMetrics({ meter: meter.getMeter('berth') });
  const b = new BerthMetrics({ meter: meter.getMeter('berth') });
  a.claimedTasks.inc(2);
  b.claimedTasks.inc(3);
  a.slots.set(4);
  b.slots.set(2);
  a.isLeader.set(1);
  b.isLeader.set(0);
  a.queuePaused.set({ queue: 'q' }, 1);
  const otel = await collect(reader);
  assert.equal(otel.get('berth_claimed_tasks')!.dataPoints[0]!.value, 5);
  assert.equal(otel.get('berth_task_slots')!.dataPoints[0]!.value, 6);
  assert.equal(otel.get('berth_maintenance_leader')!.dataPoints[0]!.value, 1);
  assert.deepEqual(
    otel.get('berth_queue_paused')!.dataPoints.map((p) => [p.attributes, p.value]),
    [[{ queue: 'q' }, 1]],
  );
  // Each keeps its own Prometheus registry.
  assert.match(await a.registry.metrics(), /^berth_claimed_tasks_total 2$/m);
  assert.match(await b.registry.metrics(), /^berth_claimed_tasks_total 3$/m);
});

test('the default meter is the global one; new BerthMetrics(registry) still works', async () => {
  const registry = new Registry();
  const byRegistry = new BerthMetrics(registry);
  assert.equal(byRegistry.registry, registry);
  const { meter, reader } = sdk();
  assert.ok(otelApi.setGlobalMeterProvider(meter));
  try {
    const m = new BerthMetrics();
    m.outcomes.inc({ task_type: 't', outcome: 'success' });
    m.handlerSeconds.observe({ task_type: 't' }, 0.02);
    const otel = await collect(reader);
    assert.deepEqual(
      otel.get('berth_task_outcomes')!.dataPoints.map((p) => [p.attributes, p.value]),
      [[{ task_type: 't', outcome: 'success' }, 1]],
    );
    assert.equal(otel.get('berth_task_handler_seconds')!.dataPoints.length, 1);
    assert.match(await m.registry.metrics(), /berth_task_outcomes_total\{task_type="t",outcome="success"\} 1/);
  } finally {
    otelApi.disable();
  }
  // With no provider registered, the instruments are no-ops and Prometheus is unaffected.
  const quiet = new BerthMetrics({ registry: new Registry() });
  quiet.claims.inc({ result: 'hit' });
  assert.match(await quiet.registry.metrics(), /^berth_claims_total\{result="hit"\} 1$/m);
});

test('GET /metrics from a standalone server: berth_ metrics, the registry content type; 405, 404', async () => {
  const m = new BerthMetrics({ registry: new Registry() });
  m.outcomes.inc({ task_type: 'demo', outcome: 'success' });
  const server = await startMetricsServer({ port: 0, registry: m.registry });
  try {
    assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
    const res = await fetch(server.url);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), m.registry.contentType);
    const body = await res.text();
    assert.match(body, /^berth_task_outcomes_total\{task_type="demo",outcome="success"\} 1$/m);
    for (const name of ['berth_task_slots', 'berth_claim_seconds_bucket', 'berth_queue_paused', 'berth_workers']) {
      assert.match(body, new RegExp(`^# TYPE ${name.replace(/_bucket$/, '')} `, 'm'), name);
    }
    const post = await fetch(server.url, { method: 'POST' });
    assert.equal(post.status, 405);
    assert.equal(post.headers.get('allow'), 'GET, HEAD');
    await post.text();
    const other = await fetch(server.url.replace('/metrics', '/other'));
    assert.equal(other.status, 404);
    await other.text();
    assert.equal((await fetch(`${server.url}?x=1`)).status, 200, 'a query string is still /metrics');
  } finally {
    await server.close();
  }
});

test('metricsRequestHandler merges registries and leaves other paths to the caller', async () => {
  const m = new BerthMetrics({ registry: new Registry() });
  const app = new Registry();
  new Gauge({ name: 'app_up', help: 'the app', registers: [app] }).set(1);
  const handle = metricsRequestHandler([m.registry, app]);
  const clash = metricsRequestHandler([m.registry, new BerthMetrics({ registry: new Registry() }).registry]);
  const server = createServer(async (req, res) => {
    if (req.url === '/clash') {
      req.url = '/metrics';
      await clash(req, res);
      return;
    }
    if (await handle(req, res)) return;
    res.writeHead(200);
    res.end('routed on');
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  try {
    const body = await (await fetch(`${base}/metrics`)).text();
    assert.match(body, /^app_up 1$/m);
    assert.match(body, /^# TYPE berth_task_outcomes_total counter$/m);
    assert.equal(await (await fetch(`${base}/dashboard`)).text(), 'routed on');
    const clashed = await fetch(`${base}/clash`);
    assert.equal(clashed.status, 500, 'two registries with the same names cannot be merged');
    assert.match(await clashed.text(), /already been registered/);
  } finally {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});
