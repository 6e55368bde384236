/**
 * The dashboard's client: one small single-page app in plain JavaScript, served as
 * /assets/app.js (no build step; a module string so `tsc` output needs no copied files). It
 * polls the JSON API every 2.5 s while the tab is visible and draws everything with DOM calls:
 * data only ever lands in text nodes (never innerHTML), so payloads and errors cannot inject
 * markup. Keep it free of backticks and dollar-brace (it lives in a String.raw template).
 */
export const APP_JS = String.raw`'use strict';
(function () {
  function meta(name) {
    var m = document.querySelector('meta[name="' + name + '"]');
    return m ? m.getAttribute('content') || '' : '';
  }
  var BASE = meta('berth-base');
  var CSRF = meta('berth-csrf');
  var READ_ONLY = meta('berth-read-only') === '1';
  var REFRESH_MS = 2500;
  var STATES = ['ready', 'running', 'scheduled', 'retryable', 'dead', 'completed'];
  var main = document.getElementById('main');

  // ---- DOM helpers: every piece of data goes in as a text node, never as markup.
  function append(el, children) {
    (Array.isArray(children) ? children : [children]).forEach(function (c) {
      if (c === null || c === undefined || c === false) return;
      if (Array.isArray(c)) append(el, c);
      else el.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
    });
    return el;
  }
  function setAttrs(el, attrs) {
    Object.keys(attrs || {}).forEach(function (k) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) return;
      if (k.slice(0, 2) === 'on') el.addEventListener(k.slice(2), v);
      else if (k === 'text') el.textContent = String(v);
      else if (k === 'value') el.value = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    });
    return el;
  }
  function h(tag, attrs, children) {
    return append(setAttrs(document.createElement(tag), attrs), children);
  }
  var SVG = 'http://www.w3.org/2000/svg';
  function s(tag, attrs, children) {
    return append(setAttrs(document.createElementNS(SVG, tag), attrs), children);
  }
  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  // ---- Formatting.
  function num(n) {
    return Number(n || 0).toLocaleString('en-US');
  }
  function age(seconds) {
    var sec = Math.max(0, Math.round(Number(seconds) || 0));
    if (sec < 60) return sec + 's';
    if (sec < 3600) return Math.floor(sec / 60) + 'm ' + (sec % 60) + 's';
    if (sec < 86400) return Math.floor(sec / 3600) + 'h ' + Math.floor((sec % 3600) / 60) + 'm';
    return Math.floor(sec / 86400) + 'd ' + Math.floor((sec % 86400) / 3600) + 'h';
  }
  function pad(n) {
    return (n < 10 ? '0' : '') + n;
  }
  /** Local time: the clock alone for today, with the date otherwise. */
  function time(iso) {
    if (!iso) return '';
    var d = new Date(iso);
    if (isNaN(d.getTime())) return String(iso);
    var clock = pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
    if (d.toDateString() === new Date().toDateString()) return clock;
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' + clock;
  }
  /** A time as text (see time) with the full ISO timestamp, time zone included, in its tooltip. */
  function when(iso) {
    if (!iso) return '';
    var d = new Date(iso);
    return h('time', { datetime: iso, title: isNaN(d.getTime()) ? String(iso) : d.toISOString() + ' (UTC)' }, time(iso));
  }
  function ago(iso) {
    if (!iso) return '';
    return age((Date.now() - new Date(iso).getTime()) / 1000) + ' ago';
  }
  function json(v, indent) {
    try {
      return JSON.stringify(v, null, indent);
    } catch (e) {
      return String(v);
    }
  }
  function badge(text, kind) {
    return h('span', { class: 'badge ' + (kind || text) }, text);
  }
  /** A running task whose handler overran its deadline: "overdue", then "stuck" past the grace. */
  function stateBadges(state, overdue) {
    if (!overdue) return badge(state);
    var title = 'handler still running past its deadline since ' + new Date(overdue.since).toLocaleString() + ' on ' + overdue.worker +
      (overdue.protected ? '; its lease is kept from rescue while that worker lives' : '; its holder stopped refreshing, rescue takes the lease');
    var mark = h('span', { class: 'badge stuck', 'data-overdue': overdue.stuck ? 'stuck' : 'overdue', title: title }, overdue.stuck ? 'stuck' : 'overdue');
    return [badge(state), ' ', mark];
  }

  // ---- Talking to the API.
  function ApiError(status, message) {
    this.status = status;
    this.message = message;
  }
  function api(path, init) {
    init = init || {};
    init.credentials = 'same-origin';
    return fetch(BASE + path, init).then(function (res) {
      return res.text().then(function (text) {
        var body = null;
        try {
          body = text ? JSON.parse(text) : null;
        } catch (e) {
          body = null;
        }
        if (res.status === 401) {
          location.reload();
        }
        if (!res.ok) throw new ApiError(res.status, (body && body.error) || res.status + ' ' + res.statusText);
        return body;
      });
    });
  }
  function post(path, body) {
    return api(path, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-berth-csrf': CSRF },
      body: JSON.stringify(body || {}),
    });
  }
  function query(params) {
    var q = new URLSearchParams();
    Object.keys(params).forEach(function (k) {
      if (params[k] !== undefined && params[k] !== null && params[k] !== '') q.set(k, params[k]);
    });
    var text = q.toString();
    return text ? '?' + text : '';
  }

  // ---- Feedback.
  var toastTimer = null;
  function toast(message, isError) {
    var el = document.getElementById('toast');
    el.textContent = message;
    el.className = 'show' + (isError ? ' error' : '');
    clearTimeout(toastTimer);
    toastTimer = setTimeout(function () {
      el.className = '';
    }, 5000);
  }
  function confirmDialog(text) {
    var dialog = document.getElementById('confirm');
    document.getElementById('confirm-text').textContent = text;
    return new Promise(function (resolve) {
      dialog.returnValue = '';
      dialog.addEventListener('close', function onClose() {
        dialog.removeEventListener('close', onClose);
        resolve(dialog.returnValue === 'ok');
      });
      dialog.showModal();
    });
  }
  /** Run an action: confirm if asked, POST, report, refresh. */
  function act(label, path, body, confirmText) {
    var go = confirmText ? confirmDialog(confirmText) : Promise.resolve(true);
    return go.then(function (ok) {
      if (!ok) return;
      return post(path, body).then(
        function (result) {
          toast(label + ': ' + describe(result));
          refresh(true);
        },
        function (err) {
          toast(label + ' failed: ' + err.message, true);
        },
      );
    });
  }
  function describe(result) {
    if (!result) return 'done';
    if (typeof result.result === 'string') return result.result.replace(/_/g, ' ');
    if (typeof result.matched === 'number') {
      return num(result.matched) + ' matched, ' + num(result.changed) + ' changed' + (result.duplicates ? ', ' + num(result.duplicates) + ' left (duplicate key)' : '');
    }
    if (typeof result.lanes === 'number') return num(result.lanes) + ' lane(s) changed';
    return json(result);
  }
  function actionButton(label, onClick, kind) {
    if (READ_ONLY) return null;
    return h('button', { type: 'button', class: kind || '', onclick: onClick }, label);
  }

  // ---- Tables.
  function table(headers, rows, empty) {
    if (rows.length === 0) return h('p', { class: 'muted empty' }, empty || 'Nothing here.');
    return h('table', {}, [
      h('thead', {}, h('tr', {}, headers.map(function (x) { return h('th', {}, x); }))),
      h('tbody', {}, rows.map(function (r) {
        return h('tr', r.attrs || {}, r.cells.map(function (c) { return h('td', {}, c); }));
      })),
    ]);
  }
  function taskLink(id) {
    return h('a', { href: '#/tasks/' + encodeURIComponent(id), class: 'mono' }, id);
  }
  function clip(text, n) {
    if (!text) return '';
    return text.length > n ? text.slice(0, n) + '…' : text;
  }

  // ---- Charts: inline SVG bars, one per minute.
  function barChart(title, points, key, cls) {
    var W = 600, H = 150, PAD = 28, TOP = 10;
    var max = 0;
    points.forEach(function (p) { max = Math.max(max, p[key]); });
    // Room on the left for the y-axis label (10px text: about 6px a character), "1,000,000" included.
    var LEFT = Math.max(PAD, 8 + num(max).length * 6);
    var scale = max > 0 ? (H - PAD - TOP) / max : 0;
    var bw = (W - LEFT) / Math.max(points.length, 1);
    var total = points.reduce(function (n, p) { return n + p[key]; }, 0);
    var bars = points.map(function (p, i) {
      if (!(p[key] > 0)) return null;
      var bh = Math.max(1, p[key] * scale);
      return s('rect', { x: (LEFT + i * bw + 1).toFixed(1), y: (H - PAD - bh).toFixed(1), width: Math.max(bw - 2, 1).toFixed(1), height: bh.toFixed(1), class: 'bar ' + cls },
        s('title', {}, new Date(p.minute).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' }) + ': ' + num(p[key])));
    });
    var axis = [
      s('line', { x1: LEFT, y1: H - PAD, x2: W, y2: H - PAD, class: 'axis' }),
      s('text', { x: LEFT - 4, y: TOP + 8, class: 'label end' }, num(max)),
      s('text', { x: LEFT - 4, y: H - PAD, class: 'label end' }, '0'),
      s('text', { x: LEFT, y: H - 8, class: 'label' }, '-' + points.length + ' min'),
      s('text', { x: LEFT + (W - LEFT) / 2, y: H - 8, class: 'label middle' }, '-' + Math.round(points.length / 2) + ' min'),
      s('text', { x: W, y: H - 8, class: 'label end' }, 'now'),
    ];
    return h('figure', { class: 'chart' }, [
      h('figcaption', {}, [title, ' ', h('span', { class: 'muted' }, '(' + num(total) + ' in the last hour)')]),
      s('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': title }, axis.concat(bars)),
    ]);
  }

  // ---- Filter forms (their values live in the URL hash, so a page can be linked).
  function filterForm(page, fields, params) {
    var inputs = {};
    var form = h('form', { class: 'filters', onsubmit: function (e) {
      e.preventDefault();
      var next = {};
      Object.keys(inputs).forEach(function (k) { next[k] = inputs[k].value.trim(); });
      go('#/' + page + query(next));
    } }, fields.map(function (f) {
      var input;
      if (f.options) {
        input = h('select', { name: f.name }, [h('option', { value: '' }, 'any')].concat(f.options.map(function (o) { return h('option', { value: o }, o); })));
        input.value = params.get(f.name) || '';
        input.addEventListener('change', function () { form.requestSubmit(); });
      } else {
        input = h('input', { name: f.name, type: 'search', placeholder: f.placeholder || 'any', value: params.get(f.name) || '' });
      }
      inputs[f.name] = input;
      return h('label', {}, [f.label, ' ', input]);
    }).concat([h('button', { type: 'submit' }, 'Apply'), h('a', { href: '#/' + page, class: 'reset' }, 'Clear')]));
    return form;
  }

  /** Keyset paging: the cursors of the pages before this one. */
  function Pager() {
    this.stack = [];
    this.after = undefined;
  }
  Pager.prototype.controls = function (next, count) {
    var self = this;
    return h('div', { class: 'pager' }, [
      h('span', { class: 'muted' }, 'page ' + (this.stack.length + 1) + ' · ' + num(count) + ' shown'),
      h('button', { type: 'button', disabled: this.stack.length === 0, onclick: function () { self.after = self.stack.pop(); refresh(true); } }, '← Previous page'),
      h('button', { type: 'button', disabled: !next, 'data-next': next || '', onclick: function () { self.stack.push(self.after); self.after = next; refresh(true); } }, 'Next page →'),
    ]);
  };

  // ---- Views. Each has mount(el, route) once, then load() and render(el, data) on every refresh.
  var views = {};

  views.overview = {
    title: 'Overview',
    load: function () { return api('/api/overview'); },
    render: function (el, d) {
      var t = d.counts.total;
      var stats = h('div', { class: 'cards' }, [
        card('Pending', num(t.pending), 'not finished yet', 'pending'),
        card('Running', num(t.running), 'under a live lease', 'running'),
        card('Dead letters', num(t.dead), 'out of attempts', t.dead > 0 ? 'dead' : ''),
        card('Oldest due', d.oldestDue.seconds > 0 ? age(d.oldestDue.seconds) : '—', d.oldestDue.queue ? 'in ' + d.oldestDue.queue : 'nothing waiting', 'oldest'),
        card('Workers', num(d.workers.alive), num(d.workers.busy) + ' of ' + num(d.workers.slots) + ' slots busy', 'workers'),
        card('Leader', d.leader ? (d.leader.workerId || 'pid ' + d.leader.pid) : 'none', d.leader ? 'session since ' + time(d.leader.since) : 'no maintenance leader', d.leader ? 'leader' : 'dead'),
      ]);
      var charts = h('div', { class: 'charts' }, [
        barChart('Completed per minute', d.throughput, 'completed', 'ok'),
        barChart('Failures per minute', d.throughput, 'failed', 'bad'),
      ]);
      var byQueue = table(['Queue', 'Pending', 'Running', 'Dead', 'Depth', 'Oldest due', ''], d.queues.map(function (q) {
        return { attrs: { 'data-queue': q.queue }, cells: [
          h('a', { href: '#/tasks' + query({ queue: q.queue }) }, q.queue), num(q.pending), num(q.running),
          q.dead > 0 ? h('a', { href: '#/dead' + query({ queue: q.queue }), class: 'dead-count' }, num(q.dead)) : '0',
          num(q.depth), q.oldestDueSeconds > 0 ? age(q.oldestDueSeconds) : '—', q.paused ? badge('paused') : '',
        ] };
      }), 'No queues yet.');
      var byType = table(['Task type', 'Pending', 'Running', 'Dead'], d.counts.byType.map(function (c) {
        return { attrs: { 'data-type': c.type }, cells: [h('a', { href: '#/tasks' + query({ type: c.type }) }, c.type), num(c.pending), num(c.running), num(c.dead)] };
      }), 'No task types yet.');
      append(clear(el), [
        stats, charts,
        h('div', { class: 'columns' }, [
          h('section', {}, [h('h2', {}, 'By queue'), byQueue]),
          h('section', {}, [h('h2', {}, 'By task type'), byType]),
        ]),
        h('p', { class: 'muted small' }, 'Counts are cached for a few seconds (read ' + age(d.counts.ageMs / 1000) + ' ago); charts come from the workers\u2019 per-minute heartbeats.'),
      ]);
    },
  };
  function card(label, value, note, kind) {
    return h('div', { class: 'card ' + (kind || ''), 'data-card': label.toLowerCase().replace(/\s+/g, '-') }, [
      h('div', { class: 'card-label' }, label), h('div', { class: 'card-value', title: value }, value), h('div', { class: 'card-note' }, note),
    ]);
  }

  /** A lane's contention counts, the non-zero ones, compact; the full breakdown in the tooltip. */
  function contentionCell(c) {
    if (!c) return '';
    var parts = [['handedOff', 'handed off'], ['waiterLimit', 'waiter limit'], ['waiterTimedOut', 'waiter timed out'], ['failed', 'failed']];
    var shown = parts.filter(function (p) { return c[p[0]] > 0; }).map(function (p) { return num(c[p[0]]) + ' ' + p[1]; });
    var full = parts.map(function (p) { return p[1] + ': ' + num(c[p[0]]); }).join(', ');
    return h('span', { class: c.failed || c.waiterTimedOut ? 'error-text' : '', title: full, 'data-contention': '' }, shown.join(' · '));
  }

  views.lanes = {
    title: 'Lanes',
    load: function () { return api('/api/lanes'); },
    render: function (el, d) {
      append(clear(el), [
        h('p', { class: 'muted' }, 'A lane is (queue, priority, shard). Depth counts entries past the claim cursor; due deferred rows wait for promotion. ' +
          'Contention is what the leader\u2019s promotion met on a busy lane (handed to a waiter, waiter limit reached, waiter timed out, failed) since it started. ' +
          (d.waitingLanes.length ? d.waitingLanes.length + ' lane(s) have a promotion waiter.' : 'No promotion waiters.')),
        table(['Queue', 'Priority', 'Shard', 'Depth', 'Due deferred', 'Oldest due', 'Running', 'Dead', 'Contention', 'Last contention', 'State', 'Waiter'], d.lanes.map(function (l) {
          var key = { queue: l.queue };
          return { attrs: { 'data-lane': l.queue + '/' + l.priority + '/' + l.shard }, cells: [l.queue, String(l.priority), String(l.shard), num(l.depth), l.dueDeferred >= 10000 ? '10,000+' : num(l.dueDeferred),
            l.oldestDueSeconds > 0 ? age(l.oldestDueSeconds) : '—', num(l.running),
            l.dead > 0 ? h('a', { href: '#/dead' + query(key), class: 'dead-count' }, num(l.dead)) : '0',
            contentionCell(l.contention),
            l.contention ? h('span', { title: l.contention.lastAt + ' (' + l.contention.lastOutcome.replace(/_/g, ' ') + ')' }, ago(l.contention.lastAt)) : '',
            l.paused ? badge('paused') : badge('active', 'ok'), l.waiting ? badge('waiting') : ''] };
        }), 'No lanes yet: nothing has been enqueued.'),
        h('p', { class: 'muted small' }, 'Running and dead are counted rows, cached for a few seconds (read ' + age(d.activityAgeMs / 1000) + ' ago).'),
      ]);
    },
  };

  var taskPager = new Pager();
  views.tasks = {
    title: 'Tasks',
    mount: function (el, r) {
      taskPager = new Pager();
      return [filterForm('tasks', [
        { name: 'state', label: 'State', options: STATES },
        { name: 'queue', label: 'Queue' },
        { name: 'type', label: 'Type' },
      ], r.params)];
    },
    load: function (r) {
      return api('/api/tasks' + query({ state: r.params.get('state'), queue: r.params.get('queue'), type: r.params.get('type'), after: taskPager.after }));
    },
    render: function (el, d) {
      append(clear(el), [
        table(['ID', 'Type', 'State', 'Queue', 'Priority', 'Attempts', 'Created', 'Due / finished', 'Last error'], d.tasks.map(function (t) {
          return { attrs: { 'data-task': t.id, class: 'clickable', onclick: function (e) { if (e.target.tagName !== 'A') go('#/tasks/' + t.id); } }, cells: [
            taskLink(t.id), t.type, stateBadges(t.state, t.overdue), t.queue, String(t.priority), t.attempts + (t.maxAttempts ? ' / ' + t.maxAttempts : ''),
            when(t.createdAt), when(t.finishedAt || t.runAt), h('span', { class: 'error-text' }, clip(t.lastError, 80)),
          ] };
        }), 'No tasks match.'),
        taskPager.controls(d.next, d.tasks.length),
      ]);
    },
  };

  /** Which actions apply to a task in each state (the rest could only answer "not found" or "running"). */
  var TASK_ACTIONS = {
    dead: ['retry', 'delete'],
    ready: ['cancel', 'move', 'delete'],
    scheduled: ['retry', 'cancel', 'move', 'delete'],
    retryable: ['retry', 'cancel', 'move', 'delete'],
    running: [],
    completed: [],
  };
  function taskActions(t) {
    var allowed = TASK_ACTIONS[t.state] || [];
    if (READ_ONLY || allowed.length === 0) return null;
    var base = '/api/tasks/' + encodeURIComponent(t.id);
    var has = function (a) { return allowed.indexOf(a) >= 0; };
    var queue = h('input', { type: 'text', placeholder: 'queue', 'data-keep': 'move-queue', size: 12 });
    var priority = h('input', { type: 'number', placeholder: 'priority', 'data-keep': 'move-priority', min: -32768, max: 32767 });
    return h('div', { class: 'actions', id: 'task-actions' }, [
      has('retry') ? actionButton(t.state === 'dead' ? 'Retry' : 'Run now', function () { act(t.state === 'dead' ? 'Retry' : 'Run now', base + '/retry'); }) : null,
      has('cancel') ? actionButton('Cancel', function () { act('Cancel', base + '/cancel', {}, 'Cancel task ' + t.id + '? It is removed before it runs.'); }) : null,
      has('delete') ? actionButton('Delete', function () { act('Delete', base + '/delete', {}, 'Delete task ' + t.id + '? This cannot be undone.'); }, 'danger') : null,
      has('move') ? h('span', { class: 'move' }, ['Move to ', queue, ' ', priority, ' ', actionButton('Move', function () {
        var body = {};
        if (queue.value.trim()) body.queue = queue.value.trim();
        if (priority.value !== '') body.priority = Number(priority.value);
        act('Move', base + '/move', body);
      })]) : null,
    ]);
  }

  views.task = {
    title: 'Task',
    load: function (r) { return api('/api/tasks/' + encodeURIComponent(r.id)); },
    render: function (el, d) {
      var t = d.task;
      var fields = [
        ['State', stateBadges(t.state, t.lease && t.lease.overdue)], ['Type', t.type], ['Queue', t.queue], ['Priority', String(t.priority)], ['Shard', String(t.shard)],
        ['Attempts', t.attempts + (t.maxAttempts ? ' of ' + t.maxAttempts : ' (type default)')], ['Dedupe key', t.dedupeKey || '—'],
        ['Created', when(t.createdAt)], ['Due', t.runAt ? when(t.runAt) : '—'],
        ['Lease', t.lease ? 'attempt ' + t.lease.attempt + ' on ' + (t.lease.worker || '?') + ', expires ' + time(t.lease.expiresAt) : '—'],
      ];
      append(clear(el), [
        taskActions(t),
        h('h2', {}, ['Task ', h('span', { class: 'mono' }, t.id)]),
        h('dl', { class: 'fields' }, fields.map(function (f) { return [h('dt', {}, f[0]), h('dd', { 'data-field': f[0].toLowerCase() }, f[1])]; })),
        t.lastError ? [h('h3', {}, 'Last error'), h('pre', { class: 'error-text', id: 'last-error' }, t.lastError)] : null,
        h('h3', {}, 'Payload'), h('pre', { id: 'payload' }, json(t.payload, 2)),
        h('h3', {}, 'Timeline'),
        h('ol', { class: 'timeline', id: 'timeline' }, d.timeline.map(function (e) {
          return h('li', { 'data-event': e.event }, [h('span', { class: 'when' }, when(e.at)), ' ', h('strong', {}, e.event), ' ', h('span', { class: 'mono muted' }, json(e.detail))]);
        })),
      ]);
    },
  };

  var deadPager = new Pager();
  views.dead = {
    title: 'Dead letters',
    mount: function (el, r) {
      deadPager = new Pager();
      var filter = { queue: r.params.get('queue') || undefined, type: r.params.get('type') || undefined, error: r.params.get('error') || undefined };
      var scoped = filter.queue || filter.type || filter.error;
      var what = scoped ? 'matching this filter' : '(all of them)';
      function bulk(action, label) {
        return actionButton(label + (scoped ? ' all matching' : ' all'), function () {
          api('/api/dead/count' + query(filter)).then(function (c) {
            var body = scoped ? filter : { all: true };
            return act(label, '/api/dead/' + action, body, label + ' ' + num(c.count) + ' dead letter(s) ' + what + '?');
          }, function (err) { toast(err.message, true); });
        }, action === 'purge' ? 'danger' : '');
      }
      return [
        filterForm('dead', [{ name: 'queue', label: 'Queue' }, { name: 'type', label: 'Type' }, { name: 'error', label: 'Error contains' }], r.params),
        READ_ONLY ? null : h('div', { class: 'actions bulk' }, [bulk('retry', 'Retry'), bulk('purge', 'Purge')]),
      ];
    },
    load: function (r) {
      return api('/api/dead' + query({ queue: r.params.get('queue'), type: r.params.get('type'), error: r.params.get('error'), after: deadPager.after }));
    },
    render: function (el, d) {
      append(clear(el), [
        table(['ID', 'Type', 'Queue', 'Attempts', 'Died', 'Last error', READ_ONLY ? '' : 'Actions'], d.deadLetters.map(function (x) {
          return { attrs: { 'data-task': x.id }, cells: [
            taskLink(x.id), x.type, x.queue, String(x.attempts), h('span', { title: time(x.diedAt) + ' (' + x.diedAt + ')' }, ago(x.diedAt)),
            h('span', { class: 'error-text', title: x.lastError || '' }, clip(x.lastError, 120)),
            READ_ONLY ? '' : h('span', { class: 'row-actions' }, [
              actionButton('Retry', function () { act('Retry ' + x.id, '/api/tasks/' + x.id + '/retry'); }),
              actionButton('Delete', function () { act('Delete ' + x.id, '/api/tasks/' + x.id + '/delete', {}, 'Delete dead letter ' + x.id + '?'); }, 'danger'),
            ]),
          ] };
        }), 'No dead letters match.'),
        deadPager.controls(d.next, d.deadLetters.length),
      ]);
    },
  };

  views.queues = {
    title: 'Queues',
    load: function () { return api('/api/queues'); },
    render: function (el, d) {
      append(clear(el), [
        h('p', { class: 'muted' }, 'A paused queue keeps accepting tasks; workers stop claiming from it until it is resumed. Running tasks finish.'),
        table(['Queue', 'Lanes', 'State', 'Paused by', 'Since', 'Reason', READ_ONLY ? '' : 'Action'], d.queues.map(function (q) {
          var reason = h('input', { type: 'text', placeholder: 'reason (optional)', 'data-keep': 'reason:' + q.queue, size: 18 });
          var base = '/api/queues/' + encodeURIComponent(q.queue);
          return { attrs: { 'data-queue': q.queue }, cells: [
            q.queue, String(q.lanes), q.paused ? badge('paused') : badge('active', 'ok'), q.pausedBy || '', q.pausedAt ? when(q.pausedAt) : '', q.reason || '',
            READ_ONLY ? '' : q.paused
              ? actionButton('Resume', function () { act('Resume ' + q.queue, base + '/resume'); })
              : h('span', { class: 'row-actions' }, [reason, ' ', actionButton('Pause', function () {
                act('Pause ' + q.queue, base + '/pause', reason.value.trim() ? { reason: reason.value.trim() } : {});
              }, 'danger')]),
          ] };
        }), 'No queues yet.'),
      ]);
    },
  };

  views.maintenance = {
    title: 'Maintenance',
    load: function () { return api('/api/maintenance'); },
    render: function (el, d) {
      var l = d.leader;
      var branches = (l.worker && l.worker.maintenance && l.worker.maintenance.branches) || {};
      var waiting = (l.worker && l.worker.maintenance && l.worker.maintenance.waitingLanes) || [];
      append(clear(el), [
        h('h2', {}, 'Leader'),
        l.session
          ? h('p', { id: 'leader' }, ['Session pid ' + l.session.pid + ' (' + l.session.applicationName + ')' + (l.session.clientAddr ? ' from ' + l.session.clientAddr : '') +
            ', connected since ' + time(l.session.since) + '.', l.worker ? ' Worker ' + l.worker.workerId + '.' : ' Its heartbeat is not fresh.'])
          : h('p', { class: 'error-text', id: 'leader' }, 'No maintenance leader: nothing is promoting, rescuing or pruning.'),
        table(['Branch', 'Runs', 'Last', 'Max', 'Overruns', 'Failures', 'Last run'], Object.keys(branches).sort().map(function (k) {
          var b = branches[k];
          return { cells: [k, num(b.runs), b.lastMs.toFixed(1) + ' ms', b.maxMs.toFixed(1) + ' ms', num(b.overruns), b.failures ? h('span', { class: 'error-text' }, num(b.failures)) : '0', ago(b.lastRunAt)] };
        }), 'No branch statistics yet.'),
        h('h3', {}, 'Lanes waiting for promotion'),
        waiting.length
          ? h('ul', {}, waiting.map(function (w) { return h('li', {}, w.queue + ' / priority ' + w.priority + ' / shard ' + w.shard); }))
          : h('p', { class: 'muted' }, 'None.'),
        h('h2', {}, 'Workers'),
        table(['Worker', 'Host', 'PID', 'Queues', 'Slots', 'Busy', 'Prefetched', 'Leader', 'Started', 'Heartbeat'], d.workers.map(function (w) {
          // A row the server could not read as written (forged or corrupt) says so, with the reason on hover.
          var heartbeat = w.invalid ? h('span', { class: 'badge dead', title: w.invalid, 'data-invalid': '' }, 'invalid')
            : w.alive ? age(w.heartbeatAgeSeconds) + ' ago' : badge('stale', 'dead');
          return { cells: [h('span', { class: 'mono' }, w.workerId), w.host, String(w.pid), w.queues ? w.queues.join(', ') : 'all', String(w.slots), String(w.busy), String(w.prefetched),
            w.leader ? badge('leader') : '', when(w.startedAt), heartbeat] };
        }), 'No workers are running.'),
        h('h2', {}, 'Recent operator actions'),
        table(['When', 'Who', 'Action', 'Target', 'Result'], d.audit.map(function (a) {
          return { cells: [when(a.at), a.actor, a.action, h('span', { class: 'mono' }, clip(json(a.target), 120)), h('span', { class: 'mono' }, clip(json(a.result), 120))] };
        }), 'No operator actions yet.'),
      ]);
    },
  };

  // ---- Routing (#/page?filters, #/tasks/<id>) and live refresh.
  function parseRoute() {
    var hash = location.hash.replace(/^#\/?/, '');
    var q = hash.indexOf('?');
    var path = q < 0 ? hash : hash.slice(0, q);
    var params = new URLSearchParams(q < 0 ? '' : hash.slice(q + 1));
    var parts = path.split('/').filter(Boolean).map(function (p) {
      try { return decodeURIComponent(p); } catch (e) { return p; }
    });
    if (parts[0] === 'tasks' && parts[1]) return { page: 'task', nav: 'tasks', id: parts[1], params: params };
    var page = views[parts[0]] && parts[0] !== 'task' ? parts[0] : 'overview';
    return { page: page, nav: page, params: params };
  }
  function go(hash) {
    if (location.hash === hash) refresh(true);
    else location.hash = hash;
  }

  var state = { route: null, view: null, body: null, timer: null, generation: 0, lastJson: null };

  function mount() {
    var r = parseRoute();
    var view = views[r.page];
    state.route = r;
    state.view = view;
    state.generation++;
    state.lastJson = null;
    document.title = view.title + ' · berth';
    document.querySelectorAll('[data-nav]').forEach(function (a) {
      a.classList.toggle('active', a.getAttribute('data-nav') === r.nav);
    });
    var top = view.mount ? view.mount(main, r) : [];
    state.body = h('div', { class: 'view-body' }, h('p', { class: 'muted' }, 'Loading…'));
    append(clear(main), [h('h1', {}, view.title)].concat(top, [state.body]));
    main.setAttribute('data-page', r.page);
    refresh(true);
  }

  /** Keep what the operator is typing (and where) across a re-render. */
  function keepInputs(el, draw) {
    var kept = {};
    var focused = document.activeElement && document.activeElement.getAttribute && document.activeElement.getAttribute('data-keep');
    el.querySelectorAll('[data-keep]').forEach(function (i) { kept[i.getAttribute('data-keep')] = i.value; });
    draw();
    el.querySelectorAll('[data-keep]').forEach(function (i) {
      var k = i.getAttribute('data-keep');
      if (kept[k]) i.value = kept[k];
      if (k === focused) i.focus();
    });
  }

  function refresh(now) {
    clearTimeout(state.timer);
    state.timer = null;
    if (document.hidden) {
      setLive('paused');
      return;
    }
    var gen = state.generation;
    var r = state.route;
    state.view.load(r).then(function (data) {
      if (gen !== state.generation) return;
      var text = JSON.stringify(data);
      if (text !== state.lastJson || now) {
        state.lastJson = text;
        keepInputs(state.body, function () { state.view.render(state.body, data, r); });
      }
      setLive('live');
    }, function (err) {
      if (gen !== state.generation) return;
      setLive('error');
      state.lastJson = null;
      append(clear(state.body), h('p', { class: 'error-text', role: 'alert' }, err.message));
    }).then(function () {
      if (gen !== state.generation || document.hidden) return;
      clearTimeout(state.timer);
      state.timer = setTimeout(function () { refresh(false); }, REFRESH_MS);
    });
  }
  function setLive(mode) {
    var el = document.getElementById('live');
    if (!el) return;
    el.textContent = mode;
    el.className = 'live ' + mode;
  }

  document.addEventListener('visibilitychange', function () {
    if (document.hidden) {
      clearTimeout(state.timer);
      setLive('paused');
    } else {
      refresh(true);
    }
  });
  window.addEventListener('hashchange', mount);
  var logout = document.getElementById('logout');
  if (logout) {
    logout.addEventListener('click', function () {
      fetch(BASE + '/logout', { method: 'POST', credentials: 'same-origin', headers: { 'x-berth-csrf': CSRF } }).then(function () {
        location.href = BASE + '/login';
      });
    });
  }
  mount();
})();
`;
