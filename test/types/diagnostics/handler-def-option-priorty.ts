import { enqueue } from '../../../src/index.js';
import { db, mail } from './tasks.js';

await enqueue(db, mail, { orderId: 'o' }, { priorty: 1 });
