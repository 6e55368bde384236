/**
 * Where a task stands (getTask, listTasks). `held`: due, waiting in deferred storage until its
 * concurrency key admits it. `waiting`: in deferred storage until every task it depends on has
 * completed (`dependsOn`). In a module of its own so that what tasks.ts reads (its dependencies)
 * can name it without importing tasks.ts back.
 */
export type TaskState =
  | 'ready'
  | 'running'
  | 'completed'
  | 'scheduled'
  | 'retryable'
  | 'held'
  | 'waiting'
  | 'dead'
  | 'cancelled';
