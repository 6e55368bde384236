import { enqueue } from '../../../src/index.js';
import { db } from './tasks.js';

await enqueue(db, 'send_email', { orderId: 'o' }, { priorty: 1 });
