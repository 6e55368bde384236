/**
 * The registry and definitions the diagnostic fixtures enqueue (test/type-diagnostics.test.ts):
 * a registered name, an args-only definition and a definition typed by its handler.
 */
import { defineTask, defineTaskType, type Queryable } from '../../../src/index.js';

declare module '../../../src/index.js' {
  interface TaskRegistry {
    send_email: { orderId: string };
  }
}

export declare const db: Queryable;

export const resize = defineTaskType<{ url: string; width: number }>({ type: 'resize_image' });

export const mail = defineTask({
  type: 'send_email',
  ceilingMs: 1000,
  handler: async (p: { orderId: string }) => void p,
});
