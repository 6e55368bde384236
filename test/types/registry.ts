/**
 * Type-level test of typed producers with a populated TaskRegistry (issue 12, item 6). Checked by
 * `tsc -p tsconfig.types.json` (npm run typecheck; test/types.test.ts runs it): every
 * `@ts-expect-error` line must fail to compile, or tsc reports the directive as unused. It has a
 * program of its own because the augmentation below would type every other test's names too.
 */
import { z } from 'zod';
import {
  defineSchedule,
  defineTask,
  defineTaskType,
  enqueue,
  enqueueMany,
  implement,
  type Queryable,
  type TaskPayload,
  type TaskSpec,
  type TaskTypeName,
} from '../../src/index.js';

declare module '../../src/index.js' {
  interface TaskRegistry {
    send_email: { orderId: string };
    resize_image: { url: string; width: number };
  }
}

declare const db: Queryable;

// Names from the registry, their payloads checked.
await enqueue(db, 'send_email', { orderId: 'one' });
await enqueue(db, 'resize_image', { url: 'u', width: 10 }, { queue: 'images', delay: 5 });
// @ts-expect-error a misspelt name is not a registered task
await enqueue(db, 'send_emial', { orderId: 'one' });
// @ts-expect-error the payload of send_email has an orderId string
await enqueue(db, 'send_email', { orderId: 1 });
// @ts-expect-error a missing field
await enqueue(db, 'send_email', {});
// @ts-expect-error a payload of another type
await enqueue(db, 'send_email', { url: 'u', width: 10 });
// @ts-expect-error an option that does not exist
await enqueue(db, 'send_email', { orderId: 'one' }, { dealy: 5 });

const name: TaskTypeName = 'resize_image';
// @ts-expect-error only registered names are task names
const unknownName: TaskTypeName = 'nope';
const payload: TaskPayload<'send_email'> = { orderId: 'x' };
void [name, unknownName, payload];

// An args-only definition (the producer's import) and its implementation (the worker's).
const resize = defineTaskType({
  type: 'resize_image',
  schema: z.object({ url: z.string(), width: z.number() }),
  queue: 'images',
});
await enqueue(db, resize, { url: 'u', width: 1 });
// @ts-expect-error width is a number
await enqueue(db, resize, { url: 'u', width: '1' });
const resizeTask = implement(resize, {
  ceilingMs: 60_000,
  handler: async (p) => {
    const w: number = p.width;
    void w;
  },
});
await enqueue(db, resizeTask, { url: 'u', width: 2 });
// @ts-expect-error the implemented definition keeps the payload type
await enqueue(db, resizeTask, { url: 'u' });
// @ts-expect-error the handler's payload is the type's
implement(resize, { ceilingMs: 1000, handler: async (p: { other: string }) => void p });
// @ts-expect-error ceilingMs is required
implement(resize, { handler: async () => {} });

// A definition typed by its handler, without a schema, and one spread from an args-only type.
const mail = defineTask({ type: 'send_email', ceilingMs: 1000, handler: async (p: { orderId: string }) => void p });
await enqueue(db, mail, { orderId: 'x' });
// @ts-expect-error the definition's payload type
await enqueue(db, mail, { orderId: 7 });
const mailType = defineTaskType<{ orderId: string }>({ type: 'send_email' });
const mailTask = defineTask({ ...mailType, ceilingMs: 1000, handler: async (p) => void p.orderId });
await enqueue(db, mailTask, { orderId: 'x' });
// @ts-expect-error ceiling is no option (its name before 0.2; the ceiling is ceilingMs)
defineTask({ type: 'x', ceiling: 1, handler: async () => {} });

// enqueueMany: every entry checked, names and definitions mixed.
await enqueueMany(db, [
  { type: 'send_email', payload: { orderId: 'a' } },
  { type: resize, payload: { url: 'u', width: 3 }, priority: 1 },
  { type: mail, payload: { orderId: 'b' } },
]);
// @ts-expect-error an unknown name in a batch
await enqueueMany(db, [{ type: 'send_emial', payload: { orderId: 'a' } }]);
// @ts-expect-error a wrong payload for a name in a batch
await enqueueMany(db, [{ type: 'send_email', payload: { orderId: 1 } }]);
await enqueueMany(db, [
  { type: 'send_email', payload: { orderId: 'a' } },
  // @ts-expect-error a payload of the other registered type, in a batch of both
  { type: 'resize_image', payload: { orderId: 'a' } },
]);
// @ts-expect-error a wrong payload for a definition in a batch
await enqueueMany(db, [{ type: resize, payload: { url: 'u', width: 'wide' } }]);
await enqueueMany(db, [
  { type: mail, payload: { orderId: 'b' } },
  // @ts-expect-error a definition with another definition's payload
  { type: resize, payload: { orderId: 'b' } },
]);
// A batch built elsewhere, typed as TaskSpec, is taken as it is (the runtime checks each entry).
const built: TaskSpec[] = [{ type: 'send_email', payload: { orderId: 'c' } }];
await enqueueMany(db, built);

// Schedules of registered names: the name checked, its payload the registry's.
defineSchedule({ name: 'mail', cron: '0 * * * *', task: 'send_email', payload: { orderId: 'one' } });
// @ts-expect-error a schedule of a misspelt name
defineSchedule({ name: 'mail', cron: '0 * * * *', task: 'send_emial', payload: { orderId: 'one' } });
// @ts-expect-error a schedule's payload is the registry's
defineSchedule({ name: 'mail', cron: '0 * * * *', task: 'send_email', payload: { orderId: 1 } });
