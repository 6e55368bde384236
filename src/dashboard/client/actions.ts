import { messageOf, post } from './api.js';
import { h } from './dom.js';
import { confirmDialog, toast } from './feedback.js';
import { json, limitText, num } from './format.js';
import { refresh } from './live.js';
import { READ_ONLY } from './shell.js';
import type { ActionAnswer } from '../wire.js';

/** An action's answer in words: "retried", "3 matched, 3 changed", "2 lane(s) changed". */
function describe(answer: ActionAnswer | null): string {
  if (!answer) return 'done';
  if ('result' in answer && typeof answer.result === 'string') return answer.result.replace(/_/g, ' ');
  if ('matched' in answer && typeof answer.matched === 'number') {
    return `${num(answer.matched)} matched, ${num(answer.changed)} changed${answer.duplicates ? `, ${num(answer.duplicates)} left (duplicate key)` : ''}`;
  }
  if ('lanes' in answer && typeof answer.lanes === 'number') return `${num(answer.lanes)} lane(s) changed`;
  if ('keyLimit' in answer) return answer.keyLimit ? `at most ${num(answer.keyLimit.perKey)} per key` : 'done';
  if ('keyLimitCleared' in answer) return answer.keyLimitCleared ? 'key limit cleared' : 'it had no key limit';
  if ('type' in answer) {
    if ('limit' in answer) return `at most ${answer.limit.rate}`;
    return answer.cleared ? 'rate limit cleared' : 'it had no rate limit';
  }
  if ('limit' in answer) return answer.limit ? limitText(answer.limit) : 'no limits left';
  if ('cleared' in answer) return answer.cleared ? 'limits cleared' : 'it had no limits';
  if ('taskId' in answer && typeof answer.taskId === 'string') return `task ${answer.taskId} enqueued`;
  if ('changed' in answer && typeof answer.changed === 'boolean') return answer.changed ? 'done' : 'no change';
  return json(answer);
}

/** Run an action: confirm if asked, POST, report, refresh. */
export async function act(label: string, path: string, body?: object, confirmText?: string): Promise<void> {
  const ok = confirmText ? await confirmDialog(confirmText) : true;
  if (!ok) return;
  let answer: ActionAnswer | null;
  try {
    answer = await post(path, body);
  } catch (err) {
    toast(`${label} failed: ${messageOf(err)}`, true);
    return;
  }
  toast(`${label}: ${describe(answer)}`);
  refresh(true);
}

/** A button that runs `onClick`; none at all on a read-only dashboard. */
export function actionButton(label: string, onClick: () => void | Promise<void>, kind = ''): HTMLButtonElement | null {
  if (READ_ONLY) return null;
  // act() reports its own failures (a toast), so the click has nothing to await.
  return h('button', { type: 'button', class: kind, onclick: () => void onClick() }, label);
}
