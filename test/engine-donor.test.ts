/**
 * The engine's shape donor (src/process/engine-donor.ts): made once per process when a worker
 * first stops, never started, and taken through an observation of its instruments so their
 * shapes are the ones a running engine's get. What it must not do: report that observation to
 * anyone (an OpenTelemetry SDK the application registered, prom-client's default registry),
 * open a connection, or keep the process alive. Its shapes against a running engine's are
 * compared in shape-anchor.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { metrics as otelApi } from '@opentelemetry/api';
import { MeterProvider, MetricReader } from '@opentelemetry/sdk-metrics';
import { register } from 'prom-client';
import { anchorEngineShapes } from '../src/process/engine-donor.js';
import { anchoredShapes } from '../src/util/shape-anchor.js';

class TestReader extends MetricReader {
  protected override async onForceFlush(): Promise<void> {}
  protected override async onShutdown(): Promise<void> {}
}

test('the donor engine reports nothing to an OpenTelemetry SDK or to the default registry, and connects nowhere', async () => {
  const reader = new TestReader();
  assert.ok(otelApi.setGlobalMeterProvider(new MeterProvider({ readers: [reader] })));
  try {
    assert.equal(anchoredShapes().get('Engine'), undefined, 'no worker has stopped in this process');
    anchorEngineShapes();
    const donor = anchoredShapes().get('Engine') as Record<string, unknown> | undefined;
    assert.ok(donor !== undefined, 'the donor is kept');
    anchorEngineShapes();
    assert.equal(anchoredShapes().get('Engine'), donor, 'made once per process');
    const { resourceMetrics, errors } = await reader.collect();
    assert.deepEqual(errors, []);
    const points = resourceMetrics.scopeMetrics.flatMap((s) => s.metrics).filter((m) => m.dataPoints.length > 0);
    assert.deepEqual(points, [], "the donor's observations reach no exporter");
    assert.deepEqual(register.getMetricsAsArray(), [], "prom-client's default registry holds nothing of it");
    const deps = donor.deps as { write: { totalCount: number }; claims: { totalCount: number } };
    assert.equal(deps.write.totalCount + deps.claims.totalCount, 0, 'its pools never connected');
  } finally {
    otelApi.disable();
  }
  // The file's process ends on its own: the donor holds no timer, socket or listener that keeps it alive.
});
