import { act, actionButton } from '../actions.js';
import { api } from '../api.js';
import { append, type Child, clear, h } from '../dom.js';
import { limitText, num } from '../format.js';
import { READ_ONLY } from '../shell.js';
import type { View } from '../view.js';
import { badge, table, when } from '../widgets.js';
import type { KeyLimitWire, LimitRow, Queues, TypeLimitRow } from '../../wire.js';

/** The at-limit mark: the queue's due work waits for its limit, not for a worker. */
function heldCell(l: LimitRow) {
  return l.atLimit ? [num(l.heldTasks), ' ', badge('at limit', 'paused')] : num(l.heldTasks);
}

/** A panel of the page: its heading, a line on what it is about, then its tables and forms. */
function panel(id: string, title: string, about: string, children: Child): HTMLElement {
  return h('section', { id }, [h('h2', {}, title), h('p', { class: 'muted' }, about), children]);
}

/**
 * A text field of a form: `keep` keeps what is typed across refreshes; `field` is the body field
 * it sets (and its data-field, for tests and styles).
 */
function textField(keep: string, field: string, placeholder: string, size: number, value?: string | number | null) {
  return h('input', { type: 'text', placeholder, 'data-keep': keep, 'data-field': field, value: value ?? '', size });
}

/**
 * The fields that set a queue's limits (`key` keeps what is typed across refreshes), and what
 * they post: an empty field removes that limit; the rate is written as the CLI takes it (20/1s).
 * A max that is not a number is sent as typed, for the server to refuse naming the field.
 */
function limitFields(key: string, current: LimitRow | undefined) {
  const max = textField(`limit-maxRunning:${key}`, 'maxRunning', 'max running', 8, current?.maxRunning);
  const rate = textField(`limit-rate:${key}`, 'rate', 'rate, e.g. 20/1s', 12, current?.rate);
  const body = () => {
    const m = max.value.trim();
    const n = Number(m);
    return { maxRunning: m === '' ? null : Number.isInteger(n) ? n : m, rate: rate.value.trim() || null };
  };
  return { inputs: [max, ' ', rate], body };
}

/** The limits panel: each limit with how full it is, and the forms that set, change and clear them. */
function limitsPanel(d: Queues) {
  const limited = new Set(d.limits.map((l) => l.queue));
  const rows = d.limits.map((l) => {
    const base = `/api/queues/${encodeURIComponent(l.queue)}/limits`;
    const fields = limitFields(l.queue, l);
    return {
      attrs: { 'data-limit': l.queue },
      cells: [
        l.queue,
        l.maxRunning === null ? '' : num(l.maxRunning),
        num(l.running),
        l.rate ?? '',
        l.rate === null ? '' : num(l.started),
        heldCell(l),
        l.updatedBy,
        when(l.updatedAt),
        READ_ONLY
          ? ''
          : h('span', { class: 'row-actions' }, [
              fields.inputs,
              ' ',
              actionButton('Save', () => act(`Limit ${l.queue}`, base, fields.body())),
              ' ',
              actionButton(
                'Clear',
                () => act(`Clear limits of ${l.queue}`, `${base}/clear`, {}, `Remove every limit of ${l.queue}?`),
                'danger',
              ),
            ]),
      ],
    };
  });
  const free = d.queues.filter((q) => !limited.has(q.queue)).map((q) => q.queue);
  const queue = h('input', {
    type: 'text',
    list: 'limit-queues',
    placeholder: 'queue',
    'data-keep': 'limit-queue:new',
    size: 16,
  });
  const fields = limitFields('new', undefined);
  const add = () => {
    const name = queue.value;
    return act(`Limit ${name}`, `/api/queues/${encodeURIComponent(name)}/limits`, fields.body());
  };
  return panel(
    'limits',
    'Limits',
    'At most N tasks of a queue running at once, and at most N starts per interval, across every worker. Tasks already running count against a new limit. Held: due tasks waiting while the queue is at its limit. An empty field removes that limit.',
    [
      table(
        [
          'Queue',
          'Max running',
          'Running',
          'Rate',
          'Starts in interval',
          'Held',
          'Set by',
          'Since',
          READ_ONLY ? '' : 'Change',
        ],
        rows,
        'No queue is limited.',
      ),
      READ_ONLY
        ? ''
        : h('p', { class: 'row-actions', id: 'limit-new' }, [
            h(
              'datalist',
              { id: 'limit-queues' },
              free.map((q) => h('option', { value: q })),
            ),
            'Limit a queue: ',
            queue,
            ' ',
            fields.inputs,
            ' ',
            actionButton('Set limit', add),
          ]),
    ],
  );
}

/** Starts in the type's window, with the at-limit mark: its next task to start is handed back. */
function startedCell(l: TypeLimitRow) {
  return l.atLimit ? [num(l.started), ' ', badge('at limit', 'paused')] : num(l.started);
}

/**
 * The task type rate limits panel: each limit with how full it is and what it paced and refused,
 * a clear per row, and the form that sets or changes a type's rate (as the CLI writes it, 20/1s).
 */
function typeLimitsPanel(d: Queues) {
  const rows = d.typeLimits.map((l) => ({
    attrs: { 'data-type-limit': l.type },
    cells: [
      l.type,
      l.rate,
      startedCell(l),
      num(l.paced),
      num(l.refused),
      l.updatedBy,
      when(l.updatedAt),
      READ_ONLY
        ? ''
        : actionButton(
            'Clear',
            () =>
              act(
                `Clear rate limit of type ${l.type}`,
                `/api/types/${encodeURIComponent(l.type)}/limits/clear`,
                {},
                `Remove the rate limit of type ${l.type}? The tasks it paced are due again at once.`,
              ),
            'danger',
          ),
    ],
  }));
  const type = textField('type-limit-type:new', 'type', 'task type', 16);
  const rate = textField('type-limit-rate:new', 'rate', 'rate, e.g. 20/1s', 12);
  const add = () => {
    const name = type.value;
    return act(`Rate limit of type ${name}`, `/api/types/${encodeURIComponent(name)}/limits`, {
      rate: rate.value.trim(),
    });
  };
  return panel(
    'type-limits',
    'Task type rate limits',
    'At most N starts of a task type per interval, across every worker and every queue its tasks are in. A task that would start past the limit is handed back unstarted (no attempt spent) and comes back when the limit has room; other types are not held up. Paced: tasks handed back that are not due again yet. Refused: starts refused since the limit was set.',
    [
      table(
        ['Type', 'Rate', 'Starts in interval', 'Paced', 'Refused', 'Set by', 'Since', READ_ONLY ? '' : 'Change'],
        rows,
        'No task type is rate limited.',
      ),
      READ_ONLY
        ? ''
        : h('p', { class: 'row-actions', id: 'type-limit-new' }, [
            'Limit a task type: ',
            type,
            ' ',
            rate,
            ' ',
            actionButton('Set rate limit', add),
          ]),
    ],
  );
}

/** A per-key field: a number is sent as one, anything else as typed for the server to refuse. */
function perKeyInput(key: string, current: number | undefined) {
  const input = h('input', {
    type: 'text',
    placeholder: 'per key',
    'data-keep': `key-perKey:${key}`,
    'data-field': 'perKey',
    value: current ?? '',
    size: 6,
  });
  const value = () => {
    const t = input.value.trim();
    const n = Number(t);
    return t !== '' && Number.isInteger(n) ? n : t;
  };
  return { input, value };
}

/** A key limit's target as the API takes it: `{ queue }` or `{ type }`. */
function keyTarget(l: Pick<KeyLimitWire, 'scope' | 'name'>): Record<string, string> {
  return { [l.scope]: l.name };
}

/**
 * The concurrency keys panel: each key limit (set, change, clear), and the keys with tasks held
 * for them, the longest waiting first.
 */
function keysPanel(d: Queues) {
  const rows = d.keyLimits.map((l) => {
    const perKey = perKeyInput(`${l.scope}:${l.name}`, l.perKey);
    const label = `${l.scope} ${l.name}`;
    return {
      attrs: { 'data-key-limit': `${l.scope}:${l.name}` },
      cells: [
        l.scope,
        l.name,
        num(l.perKey),
        l.updatedBy,
        when(l.updatedAt),
        READ_ONLY
          ? ''
          : h('span', { class: 'row-actions' }, [
              perKey.input,
              ' ',
              actionButton('Save', () =>
                act(`Key limit of ${label}`, '/api/keys/limits', { ...keyTarget(l), perKey: perKey.value() }),
              ),
              ' ',
              actionButton(
                'Clear',
                () =>
                  act(
                    `Clear key limit of ${label}`,
                    '/api/keys/limits/clear',
                    keyTarget(l),
                    `Remove the key limit of ${label}? Its keys run one task at a time again.`,
                  ),
                'danger',
              ),
            ]),
      ],
    };
  });
  const scope = h('select', { 'data-keep': 'key-scope:new', 'data-field': 'scope' }, [
    h('option', { value: 'queue' }, 'queue'),
    h('option', { value: 'type' }, 'task type'),
  ]);
  const name = h('input', {
    type: 'text',
    list: 'key-queues',
    placeholder: 'queue or task type',
    'data-keep': 'key-name:new',
    'data-field': 'name',
    size: 16,
  });
  const perKey = perKeyInput('new', undefined);
  const add = () =>
    act(`Key limit of ${scope.value} ${name.value}`, '/api/keys/limits', {
      [scope.value]: name.value,
      perKey: perKey.value(),
    });
  return panel(
    'keys',
    'Concurrency keys',
    "At most N tasks with the same concurrency key run at once, across every worker: a task type's limit, else its queue's, else one. The rest wait, held, until their key admits them.",
    [
      table(
        ['Scope', 'Name', 'Per key', 'Set by', 'Since', READ_ONLY ? '' : 'Change'],
        rows,
        'No key limits set: every key runs one task at a time.',
      ),
      READ_ONLY
        ? ''
        : h('p', { class: 'row-actions', id: 'key-limit-new' }, [
            h(
              'datalist',
              { id: 'key-queues' },
              d.queues.map((q) => h('option', { value: q.queue })),
            ),
            'Set a key limit: ',
            scope,
            ' ',
            name,
            ' ',
            perKey.input,
            ' ',
            actionButton('Set key limit', add),
          ]),
      h('h3', {}, 'Keys with held tasks'),
      table(
        ['Key', 'Held', 'Running', 'Waiting since'],
        d.heldKeys.map((k) => ({
          attrs: { 'data-held-key': k.key },
          cells: [k.key, num(k.held), num(k.running), when(k.since)],
        })),
        'No tasks are held for their keys.',
      ),
    ],
  );
}

export const queues: View<Queues> = {
  title: 'Queues',
  load: () => api<Queues>('/api/queues'),
  render: (el, d) => {
    const limits = new Map(d.limits.map((l) => [l.queue, l]));
    append(clear(el), [
      h(
        'p',
        { class: 'muted' },
        'A paused queue keeps accepting tasks; workers stop claiming from it until it is resumed. Running tasks finish.',
      ),
      table(
        ['Queue', 'Lanes', 'State', 'Paused by', 'Since', 'Reason', 'Limits', READ_ONLY ? '' : 'Action'],
        d.queues.map((q) => {
          const reason = h('input', {
            type: 'text',
            placeholder: 'reason (optional)',
            'data-keep': `reason:${q.queue}`,
            size: 18,
          });
          const base = `/api/queues/${encodeURIComponent(q.queue)}`;
          const pause = () =>
            act(`Pause ${q.queue}`, `${base}/pause`, reason.value.trim() ? { reason: reason.value.trim() } : {});
          const limit = limits.get(q.queue);
          return {
            attrs: { 'data-queue': q.queue },
            cells: [
              q.queue,
              String(q.lanes),
              q.paused ? badge('paused') : badge('active', 'ok'),
              q.pausedBy || '',
              q.pausedAt ? when(q.pausedAt) : '',
              q.reason || '',
              limit ? [limitText(limit), limit.atLimit ? [' ', badge('at limit', 'paused')] : ''] : '',
              READ_ONLY
                ? ''
                : q.paused
                  ? actionButton('Resume', () => act(`Resume ${q.queue}`, `${base}/resume`))
                  : h('span', { class: 'row-actions' }, [reason, ' ', actionButton('Pause', pause, 'danger')]),
            ],
          };
        }),
        'No queues yet.',
      ),
      limitsPanel(d),
      typeLimitsPanel(d),
      keysPanel(d),
    ]);
  },
};
