import { enqueueMany } from '../../../src/index.js';
import { db } from './tasks.js';

await enqueueMany(db, [
  { type: 'send_email', payload: { orderId: 'a' } },
  { type: 'send_email', payload: { orderId: 'b' }, priorty: 1 },
]);
