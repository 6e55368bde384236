import { enqueueMany } from '../../../src/index.js';
import { db, mail } from './tasks.js';

await enqueueMany(db, [{ type: mail, payload: { orderId: 'a' }, queu: 'mail' }]);
