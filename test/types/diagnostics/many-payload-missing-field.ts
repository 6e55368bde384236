import { enqueueMany } from '../../../src/index.js';
import { db, resize } from './tasks.js';

await enqueueMany(db, [
  { type: resize, payload: { url: 'u', width: 1 } },
  { type: 'send_email', payload: {}, priority: 2 },
]);
