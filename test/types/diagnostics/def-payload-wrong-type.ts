import { enqueue } from '../../../src/index.js';
import { db, resize } from './tasks.js';

await enqueue(db, resize, { url: 'u', width: '1' });
