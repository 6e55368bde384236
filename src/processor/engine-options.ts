import type { AnyTaskDefinition } from '../task.js';
import type { ResolvedUnknownTypeOptions } from './unknown-types.js';

/**
 * What the engine reads of the worker's resolved options (src/process/worker-options.ts
 * resolves them, in the composition-root layer; the engine sits below it and sees only this).
 */
/** The task definitions a worker runs, indexed once. */
export interface TaskRegistry {
  readonly defs: ReadonlyMap<string, AnyTaskDefinition>;
  /** Per type: the claim's lease is ceiling + margin. */
  readonly ceilings: ReadonlyMap<string, number>;
  /** Per type: the attempt limit a task enqueued by name takes at claim. */
  readonly maxAttempts: ReadonlyMap<string, number>;
  /** For a type with no definition here, and none at enqueue. */
  readonly defaultMaxAttempts: number;
}

/** The part of the resolved worker options that runs tasks. */
export interface EngineOptions {
  readonly tasks: TaskRegistry;
  readonly slots: number;
  /** The queues claimed from (null: every queue). */
  readonly queues: readonly string[] | null;
  /** What happens to a claimed task of a type with no definition here. */
  readonly unknownTypes: ResolvedUnknownTypeOptions;
  readonly schema: string;
  readonly leaseMarginMs: number;
  readonly prefetch: number;
  readonly pollIntervalMs: number;
  readonly defaultCeilingMs: number;
  readonly stopTimeoutMs: number;
  readonly workerId: string;
  readonly heartbeatIntervalMs: number | false;
  readonly stuckGraceMs: number;
  readonly exitOnStuckSlots: number | null;
  /** The cap on a handler's result, as JSON in UTF-8 bytes. */
  readonly resultMaxBytes: number;
}
