import { enqueueMany } from '../../../src/index.js';
import { db } from './tasks.js';

await enqueueMany(db, [{ type: 'send_emial', payload: { orderId: 'a' } }]);
