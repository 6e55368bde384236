// Correct calls: no diagnostic under either compiler.
import { enqueue, enqueueMany, type TaskContext } from '../../../src/index.js';
import { db, mail, resize } from './tasks.js';

await enqueue(db, resize, { url: 'u', width: 1 });
await enqueue(db, resize, { url: 'u', width: 1 }, { queue: 'images', priority: 1 });
await enqueue(db, mail, { orderId: 'o' }, { dedupeKey: 'k' });
await enqueue(db, 'send_email', { orderId: 'o' }, { delay: 5 });
const r = await enqueue(db, 'send_email', { orderId: 'o' });
if (r.state !== 'duplicate') r.id.toUpperCase();
else if (r.duplicateOf !== undefined) r.duplicateOf.toUpperCase();
const rs = await enqueueMany(db, [
  { type: 'send_email', payload: { orderId: 'a' } },
  { type: resize, payload: { url: 'u', width: 3 }, priority: 1 },
  { type: mail, payload: { orderId: 'b' }, queue: 'mail' },
]);
for (const x of rs) if (x.state === 'ready' || x.state === 'scheduled') x.id.toUpperCase();
const ctx = {} as TaskContext;
void ctx.id;
