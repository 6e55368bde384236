/**
 * OpenTelemetry traces (issue 13, item 6), with the SDK's in-memory exporter (a dev dependency;
 * berth itself uses @opentelemetry/api only): the producer's context is stored with the task at
 * enqueue and carried through every move (deferred, dead letters, retry, move), each attempt runs
 * in a CONSUMER span that is its child and links to it, settlement errors are on the span, and an
 * untraced producer stores nothing.
 */
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  context,
  propagation,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  type TextMapPropagator,
  trace,
} from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { defineTask, enqueue, enqueueMany, moveTask, retryDeadLetters, Worker } from '../src/index.js';
import { quoteIdent } from '../src/sql.js';
import type { AnyTaskDefinition } from '../src/task.js';
import {
  captureTraceContext,
  formatTraceparent,
  MAX_TRACE_CONTEXT_CHARS,
  parseTraceparent,
  restoreTraceContext,
  tracingEnabled,
} from '../src/tracing.js';
import { DATABASE_URL, FAST_MAINTENANCE, freshSchema, takeLeaseOver, testLogger, waitFor } from './helpers.js';

const { schema, pool } = await freshSchema('tracing');
const S = quoteIdent(schema);
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const contextManager = new AsyncLocalStorageContextManager();

before(() => {
  assert.equal(tracingEnabled(), false, 'nothing registered yet: the no-op provider');
  assert.ok(trace.setGlobalTracerProvider(provider));
  assert.ok(context.setGlobalContextManager(contextManager.enable()));
  assert.equal(tracingEnabled(), true);
});
after(async () => {
  trace.disable();
  context.disable();
  propagation.disable();
  await provider.shutdown();
});

const tracer = () => trace.getTracer('test');
const spansNamed = (name: string) => exporter.getFinishedSpans().filter((s) => s.name === name);
const processSpans = (id: string) =>
  exporter
    .getFinishedSpans()
    .filter((s) => s.kind === SpanKind.CONSUMER && s.attributes['messaging.message.id'] === id);

/** Run `fn` inside a fresh active span named `name`; returns its result and the span's context. */
async function inSpan<T>(name: string, fn: () => Promise<T>) {
  return tracer().startActiveSpan(name, async (span) => {
    try {
      return { result: await fn(), sc: span.spanContext() };
    } finally {
      span.end();
    }
  });
}

function worker(defs: AnyTaskDefinition[], opts: Partial<ConstructorParameters<typeof Worker>[0]> = {}) {
  return new Worker({
    connectionString: DATABASE_URL,
    schema,
    tasks: defs,
    queues: defs.map((d) => d.type),
    logger: testLogger,
    maintenance: false,
    heartbeatIntervalMs: false,
    ...opts,
  });
}

const storedContext = async (table: 'ready' | 'deferred' | 'dead_letters', id: string) =>
  (
    await pool.query<{ trace_context: string | null }>(
      `SELECT trace_context FROM ${S}.${table} WHERE id = $1 ORDER BY ${table === 'ready' ? 'appended_at DESC' : 'id'} LIMIT 1`,
      [id],
    )
  ).rows[0]?.trace_context;

test('one trace from enqueue to handler: the attempt is a CONSUMER span, child of the producer span and linked to it', async () => {
  let handlerSpan: { traceId: string; spanId: string } | undefined;
  const def = defineTask<{ n: number }>({
    type: 'tr_one',
    ceilingMs: 10_000,
    handler: async () => {
      // Spans the handler makes nest under the attempt's span.
      await tracer().startActiveSpan('handler work', async (s) => {
        handlerSpan = s.spanContext();
        s.end();
      });
    },
  });
  const { result, sc: producer } = await inSpan('http request', () =>
    enqueue(pool, def, { n: 1 }, { schema, queue: 'tr_q', priority: 3 }),
  );
  const id = result.id!;
  const stored = JSON.parse((await storedContext('ready', id))!) as Record<string, string>;
  assert.equal(stored.traceparent, formatTraceparent(producer), 'the W3C traceparent of the active span');
  const w = worker([def], { queues: ['tr_q'] });
  await w.start();
  try {
    await waitFor(() => processSpans(id).length === 1 && spansNamed('handler work').length === 1, 20_000, 'spans');
  } finally {
    await w.stop();
  }
  const span = processSpans(id)[0]!;
  assert.equal(span.name, 'process tr_one');
  assert.equal(span.kind, SpanKind.CONSUMER);
  assert.equal(span.spanContext().traceId, producer.traceId, 'the same trace as the producer');
  assert.equal(span.parentSpanContext?.spanId, producer.spanId, 'the producer span is its parent');
  assert.deepEqual(
    span.links.map((l) => [l.context.traceId, l.context.spanId]),
    [[producer.traceId, producer.spanId]],
  );
  assert.deepEqual(span.attributes, {
    'messaging.system': 'berth',
    'messaging.operation.type': 'process',
    'messaging.operation.name': 'process',
    'messaging.destination.name': 'tr_q',
    'messaging.message.id': id,
    'berth.task.type': 'tr_one',
    'berth.task.attempt': 1,
    'berth.task.max_attempts': 20,
    'berth.lane.priority': 3,
    'berth.lane.shard': span.attributes['berth.lane.shard'],
    'berth.worker.id': w.id,
    'berth.task.outcome': 'success',
  });
  assert.equal(span.status.code, SpanStatusCode.UNSET);
  const inner = spansNamed('handler work')[0]!;
  assert.equal(inner.spanContext().traceId, producer.traceId);
  assert.equal(inner.parentSpanContext?.spanId, span.spanContext().spanId);
  assert.equal(handlerSpan?.spanId, inner.spanContext().spanId);
});

test('failures are recorded on the span; the context survives deferred storage, the dead letters and an operator retry', async () => {
  let runs = 0;
  const def = defineTask<unknown>({
    type: 'tr_fail',
    ceilingMs: 10_000,
    maxAttempts: 2,
    backoff: { baseMs: 10, maxMs: 10 },
    handler: async () => {
      runs++;
      if (runs <= 2) throw new Error(`boom ${runs}`);
    },
  });
  const { result, sc: producer } = await inSpan('producer', () => enqueue(pool, def, {}, { schema, queue: def.type }));
  const id = result.id!;
  const w = worker([def], { maintenance: FAST_MAINTENANCE });
  await w.start();
  try {
    await waitFor(() => processSpans(id).length === 2, 30_000, 'two failed attempts');
    const dead = await waitFor(() => storedContext('dead_letters', id), 10_000, 'the dead letter');
    assert.equal(JSON.parse(dead).traceparent, formatTraceparent(producer), 'kept in the dead letters');
    assert.deepEqual(await retryDeadLetters(pool, schema, [id]), [{ id, result: 'retried' }]);
    await waitFor(() => processSpans(id).length === 3, 30_000, 'the retried attempt');
  } finally {
    await w.stop();
  }
  const spans = processSpans(id).sort((a, b) => a.startTime[0] - b.startTime[0] || a.startTime[1] - b.startTime[1]);
  for (const s of spans) {
    assert.equal(s.spanContext().traceId, producer.traceId, 'every attempt in the producer trace');
    assert.equal(s.parentSpanContext?.spanId, producer.spanId);
  }
  const [first, second, third] = spans as [ReadableSpan, ReadableSpan, ReadableSpan];
  assert.equal(first.status.code, SpanStatusCode.ERROR);
  assert.equal(first.status.message, 'boom 1');
  assert.equal(first.attributes['berth.task.outcome'], 'failure');
  assert.equal(first.attributes['berth.task.retry_in_ms'], 10);
  const exception = first.events.find((e) => e.name === 'exception');
  assert.equal(exception?.attributes?.['exception.message'], 'boom 1');
  assert.match(String(exception?.attributes?.['exception.stacktrace']), /boom 1/);
  assert.equal(second.attributes['berth.task.dead'], true);
  assert.equal(second.status.message, 'boom 2');
  assert.equal(third.status.code, SpanStatusCode.UNSET);
  assert.equal(third.attributes['berth.task.outcome'], 'success');
});

test('a lease lost at settlement is an error on the span', async () => {
  const def = defineTask<unknown>({
    type: 'tr_lost',
    ceilingMs: 10_000,
    handler: async (_p, ctx) => {
      await takeLeaseOver(pool, schema, ctx.id);
    },
  });
  const { id } = await enqueue(pool, def, {}, { schema, queue: def.type });
  const w = worker([def]);
  await w.start();
  try {
    await waitFor(() => processSpans(id!).length === 1, 20_000, 'the span');
  } finally {
    await w.stop();
  }
  const span = processSpans(id!)[0]!;
  assert.equal(span.attributes['berth.task.outcome'], 'lost');
  assert.equal(span.status.code, SpanStatusCode.ERROR);
  assert.match(span.status.message ?? '', /lease lost/);
});

test('an untraced producer stores nothing, and its attempt starts a trace of its own', async () => {
  const def = defineTask<unknown>({ type: 'tr_root', ceilingMs: 10_000, handler: async () => {} });
  // Inside a span that is active for the worker's start, not for the enqueue: the attempt must not nest under it.
  const { id } = await enqueue(pool, def, {}, { schema, queue: def.type });
  assert.equal(await storedContext('ready', id!), null);
  const w = worker([def]);
  await inSpan('unrelated', () => w.start());
  try {
    await waitFor(() => processSpans(id!).length === 1, 20_000, 'the span');
  } finally {
    await w.stop();
  }
  const span = processSpans(id!)[0]!;
  assert.equal(span.parentSpanContext, undefined, 'a root span');
  assert.deepEqual(span.links, []);
});

test('scheduled tasks keep the context through promotion; a moved task keeps it; one context per enqueueMany', async () => {
  const def = defineTask<unknown>({ type: 'tr_later', ceilingMs: 10_000, handler: async () => {} });
  const { result, sc: producer } = await inSpan('producer', () =>
    enqueueMany(
      pool,
      [
        { type: def.type, payload: 1, queue: def.type, delay: 300 },
        { type: def.type, payload: 2, queue: 'tr_elsewhere' },
        { type: def.type, payload: 3, queue: 'tr_elsewhere', dedupeKey: 'tr-k' },
      ],
      { schema },
    ),
  );
  const [later, moved, keyed] = result.map((r) => r.id!) as [string, string, string];
  const tp = formatTraceparent(producer);
  assert.equal(JSON.parse((await storedContext('deferred', later))!).traceparent, tp);
  assert.equal(JSON.parse((await storedContext('ready', keyed))!).traceparent, tp, 'the dedupe path stores it too');
  assert.equal(await moveTask(pool, schema, moved, { queue: def.type }), 'moved');
  assert.equal(JSON.parse((await storedContext('ready', moved))!).traceparent, tp);
  const w = worker([def], { maintenance: FAST_MAINTENANCE });
  await w.start();
  try {
    await waitFor(() => processSpans(later).length === 1 && processSpans(moved).length === 1, 30_000, 'spans');
  } finally {
    await w.stop();
  }
  assert.equal(processSpans(later)[0]!.parentSpanContext?.spanId, producer.spanId);
  assert.equal(processSpans(moved)[0]!.parentSpanContext?.spanId, producer.spanId);
});

test('the registered propagator is used both ways; the stored context is bounded; a bad one is ignored', () => {
  const sc = { traceId: 'a'.repeat(32), spanId: 'b'.repeat(16), traceFlags: 1 };
  const active = trace.setSpanContext(ROOT_CONTEXT, sc);
  // No propagator registered: berth writes the W3C traceparent itself and reads it back.
  assert.equal(
    captureTraceContext(active),
    JSON.stringify({ traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01` }),
  );
  assert.deepEqual(trace.getSpanContext(restoreTraceContext(captureTraceContext(active))!), { ...sc, isRemote: true });
  assert.equal(captureTraceContext(ROOT_CONTEXT), null, 'no active span: nothing stored');
  // A propagator of the application's (here one header carrying both ids, and big baggage).
  let baggage = 'x';
  const custom: TextMapPropagator = {
    inject: (ctx, carrier, setter) => {
      const s = trace.getSpanContext(ctx)!;
      setter.set(carrier, 'x-ids', `${s.traceId}:${s.spanId}`);
      setter.set(carrier, 'x-baggage', baggage);
    },
    extract: (ctx, carrier, getter) => {
      const v = getter.get(carrier, 'x-ids');
      if (typeof v !== 'string') return ctx;
      const [traceId, spanId] = v.split(':') as [string, string];
      return trace.setSpanContext(ctx, { traceId, spanId: spanId.replace(/./g, 'c'), traceFlags: 1, isRemote: true });
    },
    fields: () => ['x-ids', 'x-baggage'],
  };
  assert.ok(propagation.setGlobalPropagator(custom));
  try {
    const stored = captureTraceContext(active)!;
    assert.deepEqual(Object.keys(JSON.parse(stored)).sort(), ['traceparent', 'x-baggage', 'x-ids']);
    assert.equal(
      trace.getSpanContext(restoreTraceContext(stored)!)?.spanId,
      'c'.repeat(16),
      'extracted by the propagator',
    );
    baggage = 'y'.repeat(MAX_TRACE_CONTEXT_CHARS);
    assert.deepEqual(JSON.parse(captureTraceContext(active)!), {
      traceparent: `00-${'a'.repeat(32)}-${'b'.repeat(16)}-01`,
    });
  } finally {
    propagation.disable();
  }
  for (const bad of ['not json', '[]', '"x"', '{}', '{"traceparent":"00-zz-yy-01"}', '{"traceparent":1}'])
    assert.equal(restoreTraceContext(bad), undefined, bad);
  assert.equal(parseTraceparent(`00-${'0'.repeat(32)}-${'b'.repeat(16)}-01`), undefined, 'an all-zero trace id');
  assert.equal(parseTraceparent(`ff-${'a'.repeat(32)}-${'b'.repeat(16)}-01`), undefined, 'version ff');
  assert.equal(parseTraceparent(`01-${'a'.repeat(32)}-${'b'.repeat(16)}-01-future`)?.spanId, 'b'.repeat(16));
});

test("an attempt's span does not leak into the next task's dispatch or the settled events", async () => {
  const def = defineTask<unknown>({ type: 'tr_leak', ceilingMs: 10_000, handler: async () => {} });
  const w = worker([def], { slots: 1 });
  const activeAtSettled: (string | undefined)[] = [];
  w.events.on('task:settled', () => void activeAtSettled.push(trace.getActiveSpan()?.spanContext().spanId));
  await inSpan('producer', () =>
    enqueueMany(
      pool,
      [1, 2, 3, 4].map((i) => ({ type: def.type, payload: i, queue: def.type })),
      { schema },
    ),
  );
  await w.start();
  try {
    await waitFor(() => activeAtSettled.length === 4, 20_000, 'four settled events');
  } finally {
    await w.stop();
  }
  assert.deepEqual(activeAtSettled, [undefined, undefined, undefined, undefined]);
});
