import { type Page, page } from '../view.js';
import { attempts } from './attempts.js';
import { dead } from './dead.js';
import { lanes } from './lanes.js';
import { maintenance } from './maintenance.js';
import { overview } from './overview.js';
import { queues } from './queues.js';
import { schedules } from './schedules.js';
import { task } from './task.js';
import { tasks } from './tasks.js';

/** Every page by route name (`#/<name>`; `task` is `#/tasks/<id>`). */
export const PAGES: ReadonlyMap<string, Page> = new Map([
  ['overview', page(overview)],
  ['lanes', page(lanes)],
  ['tasks', page(tasks)],
  ['task', page(task)],
  ['attempts', page(attempts)],
  ['dead', page(dead)],
  ['queues', page(queues)],
  ['schedules', page(schedules)],
  ['maintenance', page(maintenance)],
]);
