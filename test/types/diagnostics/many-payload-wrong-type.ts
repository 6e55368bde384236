import { enqueueMany } from '../../../src/index.js';
import { db, resize } from './tasks.js';

await enqueueMany(db, [
  { type: 'send_email', payload: { orderId: 'a' } },
  { type: resize, payload: { url: 'u', width: '1' } },
]);
