import {
  context,
  isSpanContextValid,
  propagation,
  ProxyTracerProvider,
  ROOT_CONTEXT,
  type Context,
  type SpanContext,
  trace,
  type Tracer,
  type TracerProvider,
} from '@opentelemetry/api';

/**
 * OpenTelemetry traces through `@opentelemetry/api` only: berth ships no SDK, and everything
 * here is a no-op until the application registers a TracerProvider (and, for the handler's
 * spans to nest, a context manager). The producer stores its active context with the task
 * (`captureTraceContext`, at enqueue); the worker restores it (`restoreTraceContext`) as the
 * parent of, and a link from, each attempt's consumer span (processor/task-observer.ts).
 */

/** The instrumentation scope of berth's spans. */
export const TRACER_NAME = 'berth-queue';

/**
 * The stored context's size bound, in characters: a propagator that injects large baggage is cut
 * back to the W3C `traceparent` / `tracestate` rather than making every task row carry it.
 */
export const MAX_TRACE_CONTEXT_CHARS = 1024;

/** The api's own no-op provider (every ProxyTracerProvider without a delegate answers it). */
const NOOP_PROVIDER: TracerProvider = new ProxyTracerProvider().getDelegate();

/**
 * Where `@opentelemetry/api` 1.x keeps whatever is registered globally (a provider, a context
 * manager, a propagator, of any signal): the object does not exist until the first registration.
 */
const API_GLOBAL = Symbol.for('opentelemetry.js.api.1');

/** Nothing of OpenTelemetry's is registered in this process: no provider, no context manager. */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
const nothingRegistered = (function (): boolean {
  return (globalThis as Record<symbol, unknown>)[API_GLOBAL] === undefined;
});

/**
 * Whether a TracerProvider other than the no-op one is registered globally. Asked per task, so it
 * allocates nothing: with nothing registered, one global read (the api's own
 * `trace.getTracerProvider()` path measured ~100 ns more per call, its version check included);
 * otherwise the public route, an identity check against the no-op provider. A provider from
 * another copy of the api package (not a ProxyTracerProvider of ours) counts as registered.
 */
export function tracingEnabled(): boolean {
  if (nothingRegistered()) return false;
  const provider = trace.getTracerProvider();
  return !(provider instanceof ProxyTracerProvider) || provider.getDelegate() !== NOOP_PROVIDER;
}

/** berth's tracer from the global provider (the api caches nothing: ask it when a span is wanted). */
export function berthTracer(): Tracer {
  return trace.getTracer(TRACER_NAME);
}

/** A span context as a W3C `traceparent` header value (version 00). */
export function formatTraceparent(sc: SpanContext): string {
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/**
 * A W3C `traceparent` value as a remote span context, or undefined when it is not one. Without
 * an SDK the api has no TraceState implementation, so a `tracestate` is not restored here.
 */
export function parseTraceparent(value: string): SpanContext | undefined {
  const m = TRACEPARENT.exec(value.trim());
  if (!m || m[1] === 'ff' || (m[1] === '00' && m[5] !== undefined)) return undefined;
  const sc: SpanContext = { traceId: m[2]!, spanId: m[3]!, traceFlags: Number.parseInt(m[4]!, 16), isRemote: true };
  return isSpanContextValid(sc) ? sc : undefined;
}

/**
 * The active trace context, serialised for storage with a task: the global propagator's carrier
 * as JSON, always with a W3C `traceparent` (formatted here when the registered propagator writes
 * none, e.g. none is registered). Null when no valid span is active, so an untraced producer
 * stores nothing.
 */
// biome-ignore format: parenthesised, V8 compiles it as the module loads (architecture.md, "Eager compilation")
export const captureTraceContext = (function (ctx?: Context): string | null {
  // No context manager registered: the active context is the root, which holds no span.
  if (ctx === undefined && nothingRegistered()) return null;
  const sc = trace.getSpanContext(ctx ?? context.active());
  if (sc === undefined || !isSpanContextValid(sc)) return null;
  const carrier: Record<string, string> = {};
  propagation.inject(ctx ?? context.active(), carrier);
  carrier.traceparent ??= formatTraceparent(sc);
  const json = JSON.stringify(carrier);
  if (json.length <= MAX_TRACE_CONTEXT_CHARS) return json;
  const small: Record<string, string> = { traceparent: carrier.traceparent };
  if (carrier.tracestate !== undefined && carrier.tracestate.length <= 512) small.tracestate = carrier.tracestate;
  return JSON.stringify(small);
});

/**
 * A stored trace context back as a context whose span context is the producer's (remote), or
 * undefined when there is none or it cannot be read (a bad value never fails a task). The global
 * propagator reads it first; its own W3C fields are the fallback.
 */
export function restoreTraceContext(stored: string | null): Context | undefined {
  if (stored === null) return undefined;
  let carrier: unknown;
  try {
    carrier = JSON.parse(stored);
  } catch {
    return undefined;
  }
  if (typeof carrier !== 'object' || carrier === null || Array.isArray(carrier)) return undefined;
  const fields: Record<string, string> = {};
  for (const [k, v] of Object.entries(carrier)) if (typeof v === 'string') fields[k] = v;
  const extracted = propagation.extract(ROOT_CONTEXT, fields);
  if (trace.getSpanContext(extracted) !== undefined) return extracted;
  const sc = fields.traceparent === undefined ? undefined : parseTraceparent(fields.traceparent);
  return sc === undefined ? undefined : trace.setSpanContext(ROOT_CONTEXT, sc);
}
