/**
 * Type-level test with the TaskRegistry empty (the test program's): any string is a task name
 * and its payload is unknown; definitions still type their payloads. Checked by
 * `tsc -p tsconfig.test.json` (npm run typecheck); `@ts-expect-error` lines must fail to compile.
 */
import { defineSchedule, defineTask, defineTaskType, enqueue, enqueueMany, type Queryable } from '../../src/index.js';

declare const db: Queryable;

await enqueue(db, 'anything', { any: 'payload' });
await enqueue(db, 'anything', 42);
await enqueueMany(db, [
  { type: 'a', payload: 1 },
  { type: 'b', payload: { x: [1, 2] }, queue: 'q' },
]);
const typed = defineTaskType<{ n: number }>({ type: 'typed' });
await enqueue(db, typed, { n: 1 });
// @ts-expect-error a definition types its payload even with an empty registry
await enqueue(db, typed, { n: 'one' });
const def = defineTask({ type: 'd', ceilingMs: 1, handler: async (p: { tags: string[] }) => void p });
await enqueueMany(db, [{ type: def, payload: { tags: ['a'] } }]);
// @ts-expect-error a definition's payload in a batch
await enqueueMany(db, [{ type: def, payload: { tags: 'a' } }]);

// Schedules type their payload by the definition, as enqueue does.
defineSchedule({ name: 'tags', cron: '* * * * *', task: def, payload: { tags: ['a'] } });
// @ts-expect-error a schedule's payload is the definition's
defineSchedule({ name: 'tags', cron: '* * * * *', task: def, payload: { tags: 'a' } });
// An empty registry: a name takes any payload.
defineSchedule({ name: 'named', cron: '* * * * *', task: 'anything', payload: 42 });
