// AtomRL dashboard: browser front end.
// Plain JavaScript, no build step. Charts use the vendored uPlot (global `uPlot`).
// Data from the API is only ever put into the page with textContent / text nodes /
// setAttribute, never as HTML.
(() => {
  'use strict';

  const LIST_POLL_MS = 5000;
  const DETAIL_POLL_MS = 5000;
  const metricsPollMs = () => Number(window.ATOMRL_POLL_MS) || 2000;
  const CHART_HEIGHT = 200;
  const DEFAULT_SMOOTHING = 0.6;
  const KNOWN_STATUSES = ['running', 'finished', 'failed', 'killed', 'unknown'];
  const PALETTE = [
    '#1f77b4', '#e6550d', '#2ca02c', '#d62728', '#9467bd',
    '#8c564b', '#e377c2', '#17becf', '#bcbd22', '#7f7f7f',
  ];
  // Groups shown first on the charts tab; the rest follow alphabetically, `time` last.
  const GROUP_ORDER = ['reward', 'eval', 'loss', 'kl'];

  // ---------------------------------------------------------------- DOM helpers

  const PROPS = new Set(['value', 'checked', 'disabled', 'selected', 'open', 'hidden', 'type', 'min', 'max', 'step']);

  // h('div', {class: 'x', 'data-y': 1, onclick: fn}, child, 'text', [more]) -> element.
  // Strings become text nodes, so data is never parsed as HTML.
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v == null || v === false) continue;
        if (k === 'class') el.className = v;
        else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
        else if (PROPS.has(k)) el[k] = v;
        else el.setAttribute(k, v === true ? '' : String(v));
      }
    }
    appendAll(el, children);
    return el;
  }

  function appendAll(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c == null || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
  }

  const $ = (sel, root = document) => root.querySelector(sel);

  function debounce(fn, ms) {
    let t = 0;
    return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
  }

  // ---------------------------------------------------------------- formatting

  function isNum(v) { return typeof v === 'number' && Number.isFinite(v); }

  function fmtNum(v, digits = 4) {
    if (!isNum(v)) return '—';
    if (v === 0) return '0';
    const a = Math.abs(v);
    if (a >= 1e6 || a < 1e-4) return v.toExponential(2);
    return String(Number(v.toPrecision(digits)));
  }

  function fmtSigned(v) {
    if (!isNum(v)) return '—';
    return (v > 0 ? '+' : '') + fmtNum(v, 3);
  }

  function fmtPct(v) { return isNum(v) ? (v * 100).toFixed(1) + '%' : '—'; }

  function fmtTime(unixSeconds) {
    if (!isNum(unixSeconds)) return '—';
    return new Date(unixSeconds * 1000).toLocaleString();
  }

  function fmtDuration(s) {
    if (!isNum(s) || s < 0) return '—';
    s = Math.round(s);
    const hh = Math.floor(s / 3600), mm = Math.floor((s % 3600) / 60), ss = s % 60;
    if (hh > 0) return `${hh}h ${mm}m ${ss}s`;
    if (mm > 0) return `${mm}m ${ss}s`;
    return `${ss}s`;
  }

  function fmtSteps(done, planned, budget) {
    if (done == null && planned == null) return '—';
    const steps = `${done == null ? '?' : done} / ${planned == null ? '?' : planned}`;
    // A run with a time budget stops at whichever comes first.
    return isNum(budget) && budget > 0 ? `${steps} or ${fmtDuration(budget)}` : steps;
  }

  function statusBadge(summary) {
    const raw = typeof summary.status === 'string' && summary.status ? summary.status : 'unknown';
    const cls = raw.replace(/[^a-zA-Z0-9_-]/g, '') || 'unknown';
    const badge = h('span', { class: `status status-${cls}`, title: summary.error || null }, raw);
    if (raw === 'killed' && summary.resumable) {
      badge.append(h('span', { class: 'resumable', title: 'This run can be resumed from its last checkpoint' }, ' · resumable'));
    }
    return badge;
  }

  function faint(hex, alpha = 0.28) {
    const m = /^#([0-9a-f]{6})$/i.exec(hex);
    if (!m) return hex;
    const n = parseInt(m[1], 16);
    return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${alpha})`;
  }

  // ---------------------------------------------------------------- URLs and routing

  const encPath = (name) => String(name).split('/').map(encodeURIComponent).join('/');

  function queryString(params) {
    return Object.entries(params)
      .filter(([, v]) => v != null && v !== '')
      .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`)
      .join('&');
  }

  function runHref(name, params) {
    const q = params ? queryString(params) : '';
    return `#/run/${encPath(name)}${q ? '?' + q : ''}`;
  }

  function compareHref(names) {
    return `#/compare?runs=${names.map(encodeURIComponent).join(',')}`;
  }

  const apiRun = (name, rest = '') => `/api/run/${encPath(name)}${rest}`;

  function safeDecode(s) {
    try { return decodeURIComponent(s); } catch { return s; }
  }

  function parseRoute() {
    let hash = location.hash.replace(/^#/, '');
    if (!hash.startsWith('/')) hash = '/' + hash;
    const qi = hash.indexOf('?');
    const path = qi < 0 ? hash : hash.slice(0, qi);
    const query = qi < 0 ? '' : hash.slice(qi + 1);
    const params = {}, raw = {};
    for (const part of query.split('&')) {
      if (!part) continue;
      const eq = part.indexOf('=');
      const k = safeDecode(eq < 0 ? part : part.slice(0, eq));
      const v = eq < 0 ? '' : part.slice(eq + 1);
      raw[k] = v;
      params[k] = safeDecode(v);
    }
    if (path.startsWith('/run/') && path.length > 5) {
      const name = path.slice(5).replace(/\/+$/, '').split('/').map(safeDecode).join('/');
      return { kind: 'run', name, params, raw, key: 'run:' + name };
    }
    if (path === '/compare' || path === '/compare/') {
      const runs = (raw.runs || '').split(',').filter(Boolean).map(safeDecode);
      return { kind: 'compare', runs, params, raw, key: 'compare:' + runs.join('\n') };
    }
    return { kind: 'list', params, raw, key: 'list' };
  }

  // ---------------------------------------------------------------- API access

  class ApiError extends Error {}

  const etagCache = new Map(); // url -> {etag, data}

  // GET a JSON endpoint. Throws ApiError with a readable message on network errors
  // and 4xx/5xx. With {etag: true} it sends If-None-Match and answers a 304 from
  // the last body (notModified: true).
  async function api(url, { etag = false } = {}) {
    const headers = {};
    const cached = etag ? etagCache.get(url) : null;
    if (cached) headers['If-None-Match'] = cached.etag;
    let res;
    try {
      res = await fetch(url, { headers, cache: 'no-store' });
    } catch (e) {
      throw new ApiError(`Network error: cannot reach the dashboard server (GET ${url}: ${e.message})`);
    }
    if (res.status === 304 && cached) return { data: cached.data, notModified: true };
    let text = '', body = null;
    try {
      text = await res.text();
      body = text ? JSON.parse(text) : null;
    } catch {
      body = null;
    }
    if (!res.ok) {
      const detail = body && typeof body.error === 'string' ? body.error : (text.trim().slice(0, 300) || res.statusText);
      throw new ApiError(`${detail} (HTTP ${res.status}, GET ${url})`);
    }
    if (body == null || typeof body !== 'object') throw new ApiError(`Invalid JSON from GET ${url}`);
    if (etag) {
      const tag = res.headers.get('ETag');
      if (tag) etagCache.set(url, { etag: tag, data: body });
    }
    return { data: body, notModified: false };
  }

  // ---------------------------------------------------------------- messages

  // Messages are kept per source (one API endpoint of the current page) so that a
  // poll replaces its own messages instead of piling them up.
  const Messages = {
    sources: new Map(),
    sig: '',
    set(source, list) {
      this.sources.set(source, (list || []).filter((m) => m != null && m !== '').map(String));
      this.sources.delete(source + '!');
      this.render();
    },
    error(source, err) {
      const text = err instanceof Error ? err.message : String(err);
      this.sources.set(source + '!', [text]);
      this.render();
    },
    clear() {
      this.sources.clear();
      this.render();
    },
    render() {
      const box = document.getElementById('messages');
      if (!box) return;
      const seen = new Set(), items = [];
      for (const [src, list] of this.sources) {
        const isErr = src.endsWith('!');
        for (const text of list) {
          const k = (isErr ? 'E' : 'M') + text;
          if (seen.has(k)) continue;
          seen.add(k);
          items.push({ isErr, text });
        }
      }
      items.sort((a, b) => Number(b.isErr) - Number(a.isErr));
      const sig = JSON.stringify(items);
      if (sig === this.sig) return;
      this.sig = sig;
      box.replaceChildren(...items.map((m) => h('div', { class: m.isErr ? 'message error' : 'message', role: m.isErr ? 'alert' : null }, m.text)));
    },
  };

  window.addEventListener('error', (e) => {
    Messages.error('js', `Dashboard error: ${e.message}`);
  });
  window.addEventListener('unhandledrejection', (e) => {
    const r = e.reason;
    Messages.error('js', `Dashboard error: ${r && r.message ? r.message : String(r)}`);
  });

  // ---------------------------------------------------------------- metric helpers

  function groupOf(metric) {
    const i = metric.indexOf('/');
    return i < 0 ? metric : metric.slice(0, i);
  }

  function groupRank(g) {
    const i = GROUP_ORDER.indexOf(g);
    if (i >= 0) return i;
    return g === 'time' ? 1000 : GROUP_ORDER.length;
  }

  function cmpMetric(a, b) {
    const ga = groupOf(a), gb = groupOf(b);
    if (ga !== gb) {
      const d = groupRank(ga) - groupRank(gb);
      if (d) return d;
      return ga < gb ? -1 : 1;
    }
    return a < b ? -1 : a > b ? 1 : 0;
  }

  function groupColor(group) {
    const i = GROUP_ORDER.indexOf(group);
    if (i >= 0) return PALETTE[i];
    let hsh = 0;
    for (const ch of group) hsh = (hsh * 31 + ch.charCodeAt(0)) >>> 0;
    return PALETTE[4 + (hsh % (PALETTE.length - 4))];
  }

  // Clean one {x, y} series: numeric x, y number or null, x ascending.
  function cleanSeries(s) {
    const xs = [], ys = [];
    if (!s || !Array.isArray(s.x)) return { xs, ys };
    const yIn = Array.isArray(s.y) ? s.y : [];
    let sorted = true, prev = -Infinity;
    for (let i = 0; i < s.x.length; i++) {
      const x = s.x[i];
      if (!isNum(x)) continue;
      if (x < prev) sorted = false;
      prev = x;
      xs.push(x);
      ys.push(isNum(yIn[i]) ? yIn[i] : null);
    }
    if (!sorted) {
      const idx = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b]);
      return { xs: idx.map((i) => xs[i]), ys: idx.map((i) => ys[i]) };
    }
    return { xs, ys };
  }

  // TensorBoard-style exponential moving average with debiasing.
  function smooth(ys, weight) {
    if (!(weight > 0)) return ys.slice();
    const out = new Array(ys.length);
    let last = 0, n = 0;
    for (let i = 0; i < ys.length; i++) {
      const y = ys[i];
      if (y == null) { out[i] = null; continue; }
      last = last * weight + (1 - weight) * y;
      n++;
      out[i] = last / (1 - Math.pow(weight, n));
    }
    return out;
  }

  function lastValue(arr) {
    if (!arr) return null;
    for (let i = arr.length - 1; i >= 0; i--) if (arr[i] != null) return arr[i];
    return null;
  }

  const countPoints = (ys) => ys.reduce((n, y) => n + (y == null ? 0 : 1), 0);

  // Align several (xs, ys) series on the union of their x values (null elsewhere).
  function alignSeries(list) {
    const all = new Set();
    for (const s of list) if (s) for (const x of s.xs) all.add(x);
    const xs = [...all].sort((a, b) => a - b);
    const pos = new Map(xs.map((x, i) => [x, i]));
    const cols = list.map((s) => {
      const col = new Array(xs.length).fill(null);
      if (s) s.xs.forEach((x, i) => { col[pos.get(x)] = s.ys[i]; });
      return col;
    });
    return { xs, cols };
  }

  function axisSize(u, values) {
    if (!values || !values.length) return 48;
    const len = Math.max(...values.map((v) => String(v).length));
    return Math.max(40, len * 7 + 20);
  }

  // Controls shared by the run page and the compare page.
  function chartControls(onSmoothing, onXAxis, withFilter, onFilter) {
    const smoothingValue = h('span', { id: 'smoothing-value', class: 'control-value' }, DEFAULT_SMOOTHING.toFixed(2));
    const slider = h('input', {
      id: 'smoothing', type: 'range', min: '0', max: '0.99', step: '0.01',
      'aria-label': 'Smoothing',
    });
    slider.value = String(DEFAULT_SMOOTHING);
    slider.addEventListener('input', () => {
      const v = Number(slider.value);
      smoothingValue.textContent = v.toFixed(2);
      onSmoothing(v);
    });
    const xSel = h('select', { id: 'x-axis', 'aria-label': 'X axis' },
      h('option', { value: 'step' }, 'step'),
      h('option', { value: 'wall' }, 'wall time'));
    xSel.addEventListener('change', () => onXAxis(xSel.value));
    const items = [
      h('label', { class: 'control' }, 'Smoothing ', slider, smoothingValue),
      h('label', { class: 'control' }, 'X axis ', xSel),
    ];
    if (withFilter) {
      const filter = h('input', { id: 'metric-filter', type: 'search', placeholder: 'Filter metrics (regex)', 'aria-label': 'Filter metrics' });
      filter.addEventListener('input', debounce(() => onFilter(filter.value), 120));
      items.push(h('label', { class: 'control' }, filter));
    }
    return items;
  }

  // ---------------------------------------------------------------- chart set

  // Keeps one uPlot chart per metric inside `container`, grouped in sections.
  // sync() rebuilds all charts only when the key (set of metrics, x mode, runs)
  // changes; otherwise it updates them in place with setData.
  class ChartSet {
    constructor(container, syncKey) {
      this.el = container;
      this.syncKey = syncKey;
      this.key = null;
      this.charts = new Map();
      this.lastWidth = 480;
      this.raf = 0;
      this.filter = null;
      this.ro = new ResizeObserver(() => this.scheduleResize());
      this.ro.observe(container);
      this.onWinResize = () => this.scheduleResize();
      window.addEventListener('resize', this.onWinResize);
    }

    sync(key, specs, timeX, emptyText) {
      if (!specs.length) {
        this.destroyCharts();
        this.el.replaceChildren(h('p', { class: 'empty' }, emptyText));
        this.key = key;
        return;
      }
      if (key !== this.key) this.rebuild(specs, timeX);
      else this.update(specs);
      this.key = key;
    }

    innerWidth(div) {
      const w = div.clientWidth;
      if (!w) return this.lastWidth;
      const cs = getComputedStyle(div);
      const inner = Math.max(160, Math.floor(w - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight)));
      this.lastWidth = inner;
      return inner;
    }

    rebuild(specs, timeX) {
      this.destroyCharts();
      this.el.replaceChildren();
      const groups = new Map();
      for (const s of specs) {
        if (!groups.has(s.group)) groups.set(s.group, []);
        groups.get(s.group).push(s);
      }
      const pending = [];
      for (const [group, list] of groups) {
        const grid = h('div', { class: 'chart-grid' });
        const sec = h('section', { class: 'chart-group', 'data-group': group }, h('h3', null, group), grid);
        sec.style.setProperty('--n', String(Math.min(list.length, 3)));
        this.el.append(sec);
        for (const s of list) {
          const div = h('div', { class: 'chart', 'data-metric': s.metric });
          grid.append(div);
          pending.push([s, div]);
        }
      }
      this.applyFilter();
      for (const [s, div] of pending) this.create(s, div, timeX);
    }

    create(s, div, timeX) {
      const ch = { div, u: null, zoomed: false };
      // Legend values: the hovered point, or the latest value when the cursor is elsewhere.
      const valueFmt = (u, v, si, idx) => {
        if (idx == null) v = lastValue(u.data[si]);
        return v == null ? '—' : fmtNum(v, 5);
      };
      const xSeries = {
        label: timeX ? 'time' : 'step',
        value: (u, v, si, idx) => {
          if (idx == null) v = lastValue(u.data[0]);
          if (v == null) return '—';
          return timeX ? new Date(v * 1000).toLocaleString() : String(Number(v.toPrecision(8)));
        },
      };
      const opts = {
        title: s.title || s.metric,
        width: this.innerWidth(div),
        height: CHART_HEIGHT,
        scales: { x: { time: timeX } },
        cursor: { sync: { key: this.syncKey }, drag: { x: true, y: false } },
        legend: { live: true },
        series: [xSeries, ...s.series.map((so) => Object.assign({ spanGaps: true, value: valueFmt }, so))],
        axes: [
          { grid: { stroke: '#eef0f3' }, ticks: { stroke: '#dfe3e8' } },
          { size: axisSize, grid: { stroke: '#eef0f3' }, ticks: { stroke: '#dfe3e8' } },
        ],
        hooks: {
          setSelect: [(u) => { if (u.select.width > 2) ch.zoomed = true; }],
        },
      };
      ch.u = new uPlot(opts, s.data, div);
      div.addEventListener('dblclick', () => { ch.zoomed = false; });
      if (s.hideLegend) {
        const rows = ch.u.root.querySelectorAll('.u-legend .u-series');
        for (const i of s.hideLegend) if (rows[i]) rows[i].style.display = 'none';
      }
      div.setAttribute('data-points', String(s.points));
      this.charts.set(s.metric, ch);
    }

    update(specs) {
      for (const s of specs) {
        const ch = this.charts.get(s.metric);
        if (!ch) continue;
        if (ch.zoomed) {
          ch.u.setData(s.data, false);
          ch.u.redraw();
        } else {
          ch.u.setData(s.data);
        }
        ch.div.setAttribute('data-points', String(s.points));
      }
    }

    setFilter(text) {
      this.filter = null;
      if (text) {
        try { this.filter = new RegExp(text, 'i'); } catch { this.filter = { test: (m) => m.toLowerCase().includes(text.toLowerCase()) }; }
      }
      this.applyFilter();
      this.scheduleResize();
    }

    applyFilter() {
      for (const sec of this.el.querySelectorAll('section.chart-group')) {
        let any = false;
        for (const div of sec.querySelectorAll('div.chart')) {
          const show = !this.filter || this.filter.test(div.getAttribute('data-metric'));
          div.hidden = !show;
          any = any || show;
        }
        sec.hidden = !any;
      }
    }

    scheduleResize() {
      if (this.raf) return;
      this.raf = requestAnimationFrame(() => { this.raf = 0; this.resize(); });
    }

    resize() {
      for (const ch of this.charts.values()) {
        if (!ch.div.clientWidth) continue; // hidden (other tab or filtered out)
        const w = this.innerWidth(ch.div);
        if (Math.abs(w - ch.u.width) > 1) ch.u.setSize({ width: w, height: CHART_HEIGHT });
      }
    }

    destroyCharts() {
      for (const ch of this.charts.values()) ch.u.destroy();
      this.charts.clear();
    }

    destroy() {
      this.destroyCharts();
      this.ro.disconnect();
      window.removeEventListener('resize', this.onWinResize);
      if (this.raf) cancelAnimationFrame(this.raf);
    }
  }

  // ---------------------------------------------------------------- runs list page

  class ListPage {
    constructor(app) {
      this.alive = true;
      this.timer = 0;
      this.selected = new Set();
      this.rows = new Map();
      this.order = [];
      this.filterText = '';
      document.title = 'Runs · AtomRL dashboard';

      this.compareBtn = h('button', { id: 'compare-button', type: 'button', class: 'primary', disabled: true, onclick: () => this.compare() }, 'Compare selected');
      const filter = h('input', { id: 'runs-filter', type: 'search', placeholder: 'Filter runs', 'aria-label': 'Filter runs' });
      filter.addEventListener('input', () => { this.filterText = filter.value.trim().toLowerCase(); this.applyFilter(); });
      this.rootEl = h('span', { class: 'runs-root' });
      this.tbody = h('tbody');
      this.table = h('table', { id: 'runs-table', class: 'data-table' },
        h('thead', null, h('tr', null,
          h('th', { class: 'select', title: 'Select runs to compare' }, ''),
          h('th', null, 'Name'), h('th', null, 'Status'), h('th', null, 'Recipe'),
          h('th', null, 'Model'), h('th', null, 'Dataset'), h('th', { class: 'num' }, 'Steps'),
          h('th', { class: 'num' }, 'Reward'), h('th', { class: 'num' }, 'Eval acc.'),
          h('th', null, 'Started'), h('th', { class: 'num' }, 'Duration'))),
        this.tbody);
      this.emptyEl = null;
      this.body = h('div', { class: 'table-wrap' }, this.table);
      this.page = h('section', { id: 'runs-page' },
        h('div', { class: 'page-head' },
          h('h2', null, 'Runs'), this.rootEl,
          h('div', { class: 'spacer' }), filter, this.compareBtn),
        this.body);
      app.append(this.page);

      this.onVisible = () => { if (document.visibilityState === 'visible') this.load(); };
      document.addEventListener('visibilitychange', this.onVisible);
      this.load();
    }

    async load() {
      clearTimeout(this.timer);
      const seq = (this.seq = (this.seq || 0) + 1);
      try {
        const { data } = await api('/api/runs');
        if (!this.alive || seq !== this.seq) return;
        const runs = Array.isArray(data.runs) ? data.runs : [];
        const msgs = [...(data.messages || [])];
        for (const r of runs) for (const m of r.messages || []) msgs.push(`${r.name}: ${m}`);
        Messages.set('runs', msgs);
        this.render(data.root, runs);
      } catch (e) {
        if (this.alive && seq === this.seq) Messages.error('runs', e);
      } finally {
        if (this.alive && seq === this.seq) this.timer = setTimeout(() => this.tick(), LIST_POLL_MS);
      }
    }

    tick() {
      if (document.visibilityState === 'hidden') this.timer = setTimeout(() => this.tick(), LIST_POLL_MS);
      else this.load();
    }

    render(root, runs) {
      this.rootEl.textContent = root ? root : '';
      this.rootEl.title = root ? 'Runs folder' : '';
      if (!runs.length) {
        this.table.hidden = true;
        if (!this.emptyEl) {
          this.emptyEl = h('div', { id: 'runs-empty', class: 'empty-state' });
          this.body.append(this.emptyEl);
        }
        this.emptyEl.replaceChildren(
          h('p', { class: 'big' }, 'No runs yet.'),
          h('p', null, 'Runs written under ', h('code', null, root || '(unknown folder)'),
            ' will appear here automatically as soon as they start.'));
      } else {
        this.table.hidden = false;
        if (this.emptyEl) { this.emptyEl.remove(); this.emptyEl = null; }
      }
      const names = new Set(runs.map((r) => r.name));
      for (const [name, row] of this.rows) {
        if (!names.has(name)) { row.tr.remove(); this.rows.delete(name); this.selected.delete(name); }
      }
      this.order = runs.map((r) => r.name);
      for (const r of runs) {
        let row = this.rows.get(r.name);
        if (!row) {
          const cb = h('input', { type: 'checkbox', class: 'compare-select', value: r.name, 'aria-label': `Select ${r.name} for comparison` });
          cb.addEventListener('change', () => {
            if (cb.checked) this.selected.add(r.name); else this.selected.delete(r.name);
            this.updateButton();
          });
          const tr = h('tr', { 'data-run': r.name }, h('td', { class: 'select' }, cb));
          row = { tr, cb, cells: [] };
          this.rows.set(r.name, row);
        }
        row.cb.checked = this.selected.has(r.name);
        this.fillRow(row, r);
        this.tbody.append(row.tr); // (re)append keeps server order
      }
      this.applyFilter();
      this.updateButton();
    }

    fillRow(row, r) {
      const nameCell = h('td', { class: 'name' }, h('a', { class: 'run-link', href: runHref(r.name) }, r.name));
      if (r.error) nameCell.append(h('div', { class: 'run-error', title: r.error }, r.error));
      const stepsCell = h('td', { class: 'num steps' }, fmtSteps(r.steps_done, r.steps_planned, r.time_budget_s));
      if (isNum(r.steps_done) && isNum(r.steps_planned) && r.steps_planned > 0) {
        const pct = Math.max(0, Math.min(100, (100 * r.steps_done) / r.steps_planned));
        stepsCell.append(h('div', { class: 'progress', title: pct.toFixed(0) + '%' }, h('div', { class: 'bar', style: `width:${pct.toFixed(1)}%` })));
      }
      const cells = [
        nameCell,
        h('td', { class: 'status-cell' }, statusBadge(r)),
        h('td', { class: 'recipe' }, r.recipe || '—'),
        h('td', { class: 'model', title: r.model || null }, r.model || '—'),
        h('td', { class: 'dataset', title: r.dataset || null }, r.dataset || '—'),
        stepsCell,
        h('td', { class: 'num reward' }, fmtNum(r.reward)),
        h('td', { class: 'num eval-accuracy' }, fmtPct(r.eval_accuracy)),
        h('td', { class: 'started' }, fmtTime(r.started_at)),
        h('td', { class: 'num duration' }, fmtDuration(r.duration_s)),
      ];
      for (const c of row.cells) c.remove();
      row.cells = cells;
      row.tr.append(...cells);
      row.text = [r.name, r.status, r.recipe, r.model, r.dataset].filter(Boolean).join(' ').toLowerCase();
    }

    applyFilter() {
      for (const row of this.rows.values()) row.tr.hidden = !!this.filterText && !row.text.includes(this.filterText);
    }

    updateButton() {
      const n = this.selected.size;
      this.compareBtn.disabled = n < 2;
      this.compareBtn.textContent = n ? `Compare selected (${n})` : 'Compare selected';
    }

    compare() {
      const names = this.order.filter((n) => this.selected.has(n));
      if (names.length >= 2) location.hash = compareHref(names);
    }

    destroy() {
      this.alive = false;
      clearTimeout(this.timer);
      document.removeEventListener('visibilitychange', this.onVisible);
    }
  }

  // ---------------------------------------------------------------- run page

  const TABS = [
    ['charts', 'Charts'], ['config', 'Config'], ['evals', 'Evals'],
    ['checkpoints', 'Checkpoints'], ['rollouts', 'Rollouts'],
  ];

  class RunPage {
    constructor(app, route) {
      this.name = route.name;
      this.alive = true;
      this.smoothing = DEFAULT_SMOOTHING;
      this.xMode = 'step';
      this.metrics = null;
      this.drawnSig = null;
      this.metricsSeq = 0;
      this.detailSeq = 0;
      this.sigs = {};
      this.tab = null;
      document.title = `${this.name} · AtomRL dashboard`;

      this.badgeSlot = h('span', { class: 'badge-slot' });
      this.meta = h('dl', { class: 'run-meta' });
      this.errorBox = h('div', { class: 'run-error-box', hidden: true });
      this.tabButtons = {};
      this.panels = {};
      const nav = h('nav', { class: 'tabs', role: 'tablist' });
      for (const [id, label] of TABS) {
        const count = h('span', { class: 'tab-count' });
        const btn = h('button', { id: `tab-${id}`, type: 'button', class: 'tab', role: 'tab', onclick: () => this.goTab(id) }, label, count);
        btn.countEl = count;
        this.tabButtons[id] = btn;
        nav.append(btn);
        this.panels[id] = h('div', { id: `panel-${id}`, class: 'panel', role: 'tabpanel', hidden: true });
      }

      // Charts tab.
      this.rowsEl = h('span', { id: 'run-rows' }, '0');
      this.updatedEl = h('span', { class: 'updated' });
      this.chartsEl = h('div', { id: 'charts' }, h('p', { class: 'empty' }, 'Loading metrics…'));
      this.panels.charts.append(
        h('div', { class: 'controls' },
          chartControls((v) => { this.smoothing = v; this.drawCharts(); },
            (x) => this.setXMode(x), true, (t) => this.chartSet.setFilter(t)),
          h('span', { class: 'control rows' }, this.rowsEl, ' rows'),
          this.updatedEl),
        this.chartsEl);
      this.chartSet = new ChartSet(this.chartsEl, 'run');

      this.panels.config.append(h('p', { class: 'empty' }, 'Loading…'));
      this.panels.evals.append(h('p', { class: 'empty' }, 'Loading…'));
      this.panels.checkpoints.append(h('p', { class: 'empty' }, 'Loading…'));
      this.rollouts = new RolloutsView(this);
      this.panels.rollouts.append(this.rollouts.root);

      app.append(h('section', { id: 'run-page' },
        h('div', { class: 'page-head' },
          h('h2', { class: 'run-title' }, h('span', { class: 'run-name' }, this.name), this.badgeSlot)),
        this.meta, this.errorBox, nav,
        Object.values(this.panels)));

      this.update(route);
      this.loadDetail();
      this.pollMetrics();
    }

    update(route) {
      const valid = TABS.map(([id]) => id);
      const tab = valid.includes(route.params.tab) ? route.params.tab : 'charts';
      this.tab = tab;
      for (const [id, btn] of Object.entries(this.tabButtons)) {
        const on = id === tab;
        btn.classList.toggle('active', on);
        btn.setAttribute('aria-selected', on ? 'true' : 'false');
        this.panels[id].hidden = !on;
      }
      if (tab === 'charts') this.chartSet.scheduleResize();
      if (tab === 'rollouts') this.rollouts.show(route.params.step);
    }

    goTab(id) {
      const params = { tab: id };
      if (id === 'rollouts' && this.rollouts.step != null) params.step = this.rollouts.step;
      location.hash = runHref(this.name, id === 'charts' ? null : params);
    }

    // ---- summary / config / evals / checkpoints

    async loadDetail() {
      clearTimeout(this.detailTimer);
      const seq = ++this.detailSeq;
      try {
        const { data } = await api(apiRun(this.name));
        if (!this.alive || seq !== this.detailSeq) return;
        const summary = data.summary || { name: this.name, status: 'unknown' };
        Messages.set('detail', [...(summary.messages || []), ...(data.messages || [])]);
        this.renderSummary(summary);
        this.renderIfChanged('config', data.config, () => this.renderConfig(data.config));
        this.renderIfChanged('evals', data.evals, () => this.renderEvals(data.evals || []));
        this.renderIfChanged('checkpoints', data.checkpoints, () => this.renderCheckpoints(data.checkpoints || []));
        if (this.tab === 'rollouts') this.rollouts.refreshSteps();
      } catch (e) {
        if (!this.alive || seq !== this.detailSeq) return;
        Messages.error('detail', e);
        if (!this.sigs.summary) {
          for (const id of ['config', 'evals', 'checkpoints']) {
            this.panels[id].replaceChildren(h('p', { class: 'empty' }, 'Could not load this run (see the message above).'));
          }
        }
      } finally {
        if (this.alive && seq === this.detailSeq) this.detailTimer = setTimeout(() => this.loadDetail(), DETAIL_POLL_MS);
      }
    }

    renderIfChanged(key, value, fn) {
      const sig = JSON.stringify(value === undefined ? null : value);
      if (this.sigs[key] === sig) return;
      this.sigs[key] = sig;
      fn();
    }

    renderSummary(s) {
      this.renderIfChanged('summary', s, () => {
        this.badgeSlot.replaceChildren(statusBadge(s));
        const items = [
          ['Recipe', s.recipe || '—'], ['Model', s.model || '—'], ['Dataset', s.dataset || '—'],
          ['Steps', fmtSteps(s.steps_done, s.steps_planned, s.time_budget_s)], ['Reward', fmtNum(s.reward)],
          ['Eval acc.', fmtPct(s.eval_accuracy)], ['Started', fmtTime(s.started_at)],
          ['Duration', fmtDuration(s.duration_s)],
        ];
        this.meta.replaceChildren(...items.map(([k, v]) => h('div', { class: 'meta-item' }, h('dt', null, k), h('dd', null, v))));
        this.errorBox.hidden = !s.error;
        this.errorBox.replaceChildren(s.error ? h('pre', null, s.error) : '');
      });
    }

    renderConfig(config) {
      const p = this.panels.config;
      if (!config || typeof config.text !== 'string') {
        p.replaceChildren(h('p', { id: 'config-missing', class: 'empty' }, 'This run has no config.toml.'));
        return;
      }
      const pre = h('pre', { id: 'config-text', class: 'code-block' }, config.text);
      p.replaceChildren(h('div', { class: 'panel-tools' }, copyButton(() => config.text, 'Copy config')), pre);
    }

    renderEvals(evals) {
      const p = this.panels.evals;
      this.tabButtons.evals.countEl.textContent = evals.length ? ` ${evals.length}` : '';
      if (!evals.length) {
        p.replaceChildren(h('p', { class: 'empty' }, 'No evaluations logged for this run yet.'));
        return;
      }
      const keys = new Set();
      for (const e of evals) for (const k of Object.keys(e.metrics || {})) keys.add(k);
      const cols = [...keys].sort((a, b) => (a === 'eval/accuracy' ? -1 : b === 'eval/accuracy' ? 1 : cmpMetric(a, b)));
      const rows = [...evals].sort((a, b) => (a.step ?? 0) - (b.step ?? 0));
      p.replaceChildren(h('div', { class: 'table-wrap fit' }, h('table', { id: 'evals-table', class: 'data-table' },
        h('thead', null, h('tr', null, h('th', { class: 'num' }, 'step'), cols.map((c) => h('th', { class: 'num' }, c)))),
        h('tbody', null, rows.map((e) => h('tr', { 'data-step': e.step },
          h('td', { class: 'num' }, e.step ?? '—'),
          cols.map((c) => h('td', { class: 'num' }, fmtNum((e.metrics || {})[c], 5)))))))));
    }

    renderCheckpoints(ckpts) {
      const p = this.panels.checkpoints;
      this.tabButtons.checkpoints.countEl.textContent = ckpts.length ? ` ${ckpts.length}` : '';
      if (!ckpts.length) {
        p.replaceChildren(h('p', { class: 'empty' }, 'No checkpoints saved for this run yet.'));
        return;
      }
      p.replaceChildren(h('div', { class: 'table-wrap' }, h('table', { id: 'checkpoints-table', class: 'data-table' },
        h('thead', null, h('tr', null, h('th', null, 'Checkpoint'), h('th', { class: 'num' }, 'Step'), h('th', null, 'Inference command'))),
        h('tbody', null, ckpts.map((c) => h('tr', { 'data-checkpoint': c.name },
          h('td', { class: 'ckpt-name', title: c.path || null }, c.name || '—'),
          h('td', { class: 'num' }, c.step ?? '—'),
          h('td', { class: 'command' },
            c.command ? [h('code', { class: 'infer-command' }, c.command), ' ', copyButton(() => c.command)] : '—')))))));
    }

    // ---- metrics / charts

    setXMode(x) {
      if (x === this.xMode) return;
      this.xMode = x;
      this.metrics = null;
      this.drawnSig = null;
      this.chartSet.sync('', [], false, 'Loading metrics…');
      this.pollMetrics();
    }

    async pollMetrics() {
      clearTimeout(this.metricsTimer);
      const seq = ++this.metricsSeq;
      const x = this.xMode;
      try {
        const { data } = await api(apiRun(this.name, `/metrics?x=${x}&points=1000`), { etag: true });
        if (!this.alive || seq !== this.metricsSeq) return;
        Messages.set('metrics', data.messages);
        this.rowsEl.textContent = String(data.rows ?? 0);
        this.updatedEl.textContent = `updated ${new Date().toLocaleTimeString()}`;
        const sig = `${x}|${data.version}`;
        if (sig !== this.drawnSig || data.version == null) {
          this.metrics = data;
          this.drawnSig = sig;
          this.drawCharts();
        }
      } catch (e) {
        if (this.alive && seq === this.metricsSeq) Messages.error('metrics', e);
      } finally {
        if (this.alive && seq === this.metricsSeq) this.metricsTimer = setTimeout(() => this.pollMetrics(), metricsPollMs());
      }
    }

    drawCharts() {
      if (!this.metrics) return;
      const series = this.metrics.series || {};
      const timeX = this.xMode === 'wall';
      const names = Object.keys(series).filter((n) => n !== 'time/wall_s').sort(cmpMetric);
      const specs = names.map((metric) => {
        const { xs, ys } = cleanSeries(series[metric]);
        const group = groupOf(metric);
        const color = groupColor(group);
        return {
          metric, group,
          data: [xs, ys, smooth(ys, this.smoothing)],
          points: countPoints(ys),
          series: [
            { label: 'value', stroke: faint(color), width: 1 },
            { label: 'smoothed', stroke: color, width: 2 },
          ],
        };
      });
      const key = `${this.xMode}\n${names.join('\n')}`;
      this.chartSet.sync(key, specs, timeX, 'No metrics logged for this run yet.');
    }

    destroy() {
      this.alive = false;
      clearTimeout(this.metricsTimer);
      clearTimeout(this.detailTimer);
      this.chartSet.destroy();
      this.rollouts.destroy();
    }
  }

  function copyButton(getText, label = 'Copy') {
    const btn = h('button', { type: 'button', class: 'copy', title: 'Copy to clipboard' }, label);
    btn.addEventListener('click', async () => {
      const text = getText();
      let ok = false;
      try {
        if (navigator.clipboard && window.isSecureContext) {
          await navigator.clipboard.writeText(text);
          ok = true;
        }
      } catch { ok = false; }
      if (!ok) {
        const ta = h('textarea', { class: 'clipboard-helper', readonly: true });
        ta.value = text;
        document.body.append(ta);
        ta.select();
        try { ok = document.execCommand('copy'); } catch { ok = false; }
        ta.remove();
      }
      btn.textContent = ok ? 'Copied' : 'Copy failed';
      setTimeout(() => { btn.textContent = label; }, 1500);
    });
    return btn;
  }

  // ---------------------------------------------------------------- rollouts tab

  const SORTS = [
    ['group', 'by prompt group'], ['reward-desc', 'reward ↓'], ['reward-asc', 'reward ↑'],
    ['length-desc', 'length ↓'], ['length-asc', 'length ↑'],
    ['advantage-desc', 'advantage ↓'], ['advantage-asc', 'advantage ↑'],
  ];

  class RolloutsView {
    constructor(page) {
      this.page = page;
      this.root = h('div', { id: 'rollouts' }, h('p', { class: 'empty' }, 'Loading rollouts…'));
      this.steps = null;
      this.step = null;
      this.records = [];
      this.recordsStep = null;
      this.seq = 0;
      this.built = false;
    }

    buildControls() {
      this.stepSel = h('select', { id: 'rollout-step', 'aria-label': 'Step' });
      this.stepSel.addEventListener('change', () => {
        location.hash = runHref(this.page.name, { tab: 'rollouts', step: this.stepSel.value });
      });
      this.filterIn = h('input', { id: 'rollout-filter', type: 'search', placeholder: 'Search prompt / completion', 'aria-label': 'Search' });
      this.filterIn.addEventListener('input', debounce(() => this.renderList(), 120));
      this.correctSel = h('select', { id: 'rollout-correct', 'aria-label': 'Correctness' },
        h('option', { value: 'all' }, 'all'), h('option', { value: 'correct' }, 'correct'),
        h('option', { value: 'incorrect' }, 'incorrect'));
      this.correctSel.addEventListener('change', () => this.renderList());
      this.minReward = h('input', { id: 'rollout-min-reward', type: 'number', step: 'any', placeholder: 'any', 'aria-label': 'Minimum reward' });
      this.minReward.addEventListener('input', debounce(() => this.renderList(), 120));
      this.maxLength = h('input', { id: 'rollout-max-length', type: 'number', min: '0', step: '1', placeholder: 'any', 'aria-label': 'Maximum length in tokens' });
      this.maxLength.addEventListener('input', debounce(() => this.renderList(), 120));
      this.finishSel = h('select', { id: 'rollout-finish', 'aria-label': 'Finish reason' },
        h('option', { value: 'all' }, 'any end'), h('option', { value: 'truncated' }, 'truncated'),
        h('option', { value: 'complete' }, 'not truncated'));
      this.finishSel.addEventListener('change', () => this.renderList());
      this.sortSel = h('select', { id: 'rollout-sort', 'aria-label': 'Sort' }, SORTS.map(([v, l]) => h('option', { value: v }, l)));
      this.sortSel.addEventListener('change', () => this.renderList());
      this.countEl = h('span', { id: 'rollout-count' }, '0 of 0 completions');
      this.listEl = h('div', { class: 'rollout-list' });
      this.controls = h('div', { class: 'controls rollout-controls' },
        h('label', { class: 'control' }, 'Step ', this.stepSel),
        h('label', { class: 'control' }, this.filterIn),
        h('label', { class: 'control' }, 'Show ', this.correctSel),
        h('label', { class: 'control' }, 'Min reward ', this.minReward),
        h('label', { class: 'control' }, 'Max tokens ', this.maxLength),
        h('label', { class: 'control' }, this.finishSel),
        h('label', { class: 'control' }, 'Sort ', this.sortSel),
        this.countEl);
      this.built = true;
    }

    async fetchSteps() {
      const { data } = await api(apiRun(this.page.name, '/rollouts'));
      if (!this.page.alive) return null;
      Messages.set('rollout-steps', data.messages);
      const steps = (data.steps || []).filter(isNum);
      return [...new Set(steps)].sort((a, b) => a - b);
    }

    async show(stepParam) {
      const wanted = stepParam != null && stepParam !== '' ? Number(stepParam) : null;
      if (this.steps == null) {
        try {
          const steps = await this.fetchSteps();
          if (steps == null) return;
          this.steps = steps;
        } catch (e) {
          Messages.error('rollout-steps', e);
          this.root.replaceChildren(h('p', { class: 'empty' }, 'Could not load rollouts (see the message above).'));
          return;
        }
      }
      if (!this.steps.length) {
        this.root.replaceChildren(h('p', { class: 'empty' }, 'This run has no logged rollouts.'));
        return;
      }
      if (!this.built) this.buildControls();
      if (!this.root.contains(this.controls)) this.root.replaceChildren(this.controls, this.listEl);
      this.fillSteps();
      const step = wanted != null && this.steps.includes(wanted) ? wanted : this.steps[this.steps.length - 1];
      this.step = step;
      this.stepSel.value = String(step);
      if (this.recordsStep !== step) this.loadRecords(step);
    }

    async refreshSteps() {
      if (this.steps == null) return;
      try {
        const steps = await this.fetchSteps();
        if (steps == null || JSON.stringify(steps) === JSON.stringify(this.steps)) return;
        const wasEmpty = !this.steps.length;
        this.steps = steps;
        if (wasEmpty) this.show(null);
        else if (this.built) this.fillSteps();
      } catch (e) {
        Messages.error('rollout-steps', e);
      }
    }

    fillSteps() {
      const cur = this.stepSel.value;
      const opts = [...this.steps].reverse().map((s) => h('option', { value: String(s) }, `step ${s}`));
      this.stepSel.replaceChildren(...opts);
      if (cur && this.steps.includes(Number(cur))) this.stepSel.value = cur;
    }

    async loadRecords(step) {
      const seq = ++this.seq;
      this.recordsStep = step;
      this.listEl.replaceChildren(h('p', { class: 'empty' }, `Loading step ${step}…`));
      try {
        const { data } = await api(apiRun(this.page.name, `/rollouts?step=${encodeURIComponent(step)}`));
        if (!this.page.alive || seq !== this.seq) return;
        Messages.set('rollouts', data.messages);
        this.records = (data.records || []).map((r, i) => Object.assign({}, r, { _i: i }));
        this.renderList();
      } catch (e) {
        if (!this.page.alive || seq !== this.seq) return;
        this.recordsStep = null;
        Messages.error('rollouts', e);
        this.records = [];
        this.listEl.replaceChildren(h('p', { class: 'empty' }, 'Could not load this step (see the message above).'));
        this.countEl.textContent = '0 of 0 completions';
      }
    }

    groupKey(r) {
      return isNum(r.group) ? 'g' + r.group : 'p' + (r.prompt || '');
    }

    lengthOf(r) {
      return isNum(r.completion_tokens) ? r.completion_tokens : (r.completion || '').length;
    }

    renderList() {
      if (!this.built) return;
      const all = this.records;
      const text = this.filterIn.value.trim().toLowerCase();
      const corr = this.correctSel.value;
      const minRaw = this.minReward.value.trim();
      const min = minRaw === '' ? null : Number(minRaw);
      const maxLenRaw = this.maxLength.value.trim();
      const maxLen = maxLenRaw === '' ? null : Number(maxLenRaw);
      const finish = this.finishSel.value;
      const shown = all.filter((r) => {
        if (text) {
          const hay = `${r.prompt || ''}\n${r.completion || ''}`.toLowerCase();
          if (!hay.includes(text)) return false;
        }
        if (corr === 'correct' && r.correct !== true) return false;
        if (corr === 'incorrect' && r.correct !== false) return false;
        if (min != null && Number.isFinite(min) && !(isNum(r.reward) && r.reward >= min)) return false;
        if (maxLen != null && Number.isFinite(maxLen) && this.lengthOf(r) > maxLen) return false;
        if (finish === 'truncated' && r.finish_reason !== 'length') return false;
        if (finish === 'complete' && r.finish_reason === 'length') return false;
        return true;
      });
      this.countEl.textContent = `${shown.length} of ${all.length} completions`;
      const sort = this.sortSel.value;

      if (!all.length) {
        this.listEl.replaceChildren(h('p', { class: 'empty' }, 'No completions logged at this step.'));
        return;
      }
      if (!shown.length) {
        this.listEl.replaceChildren(h('p', { class: 'empty' }, 'No completions match the filters.'));
        return;
      }

      if (sort === 'group') {
        // Group stats are computed over all completions of the group, not just the shown ones.
        const groups = new Map();
        for (const r of all) {
          const k = this.groupKey(r);
          if (!groups.has(k)) groups.set(k, { key: k, group: r.group, prompt: r.prompt || '', all: [], shown: [], first: r._i });
          groups.get(k).all.push(r);
        }
        for (const r of shown) groups.get(this.groupKey(r)).shown.push(r);
        const list = [...groups.values()].filter((g) => g.shown.length)
          .sort((a, b) => (isNum(a.group) && isNum(b.group) ? a.group - b.group : a.first - b.first));
        const byIndex = (a, b) => (isNum(a.index) && isNum(b.index) ? a.index - b.index : a._i - b._i);
        let n = 0;
        this.listEl.replaceChildren(...list.map((g) => {
          n++;
          return this.groupEl(g, g.shown.sort(byIndex), n);
        }));
        return;
      }

      const [field, dir] = sort.split('-');
      const val = (r) => (field === 'reward' ? r.reward : field === 'advantage' ? r.advantage : this.lengthOf(r));
      const sorted = [...shown].sort((a, b) => {
        const va = val(a), vb = val(b);
        const na = !isNum(va), nb = !isNum(vb);
        if (na || nb) return na === nb ? a._i - b._i : na ? 1 : -1; // missing values last
        return dir === 'asc' ? va - vb : vb - va;
      });
      this.listEl.replaceChildren(h('div', { class: 'rollout-flat' }, sorted.map((r) => this.rolloutEl(r, true))));
    }

    groupEl(g, records, ordinal) {
      const rewards = g.all.map((r) => r.reward).filter(isNum);
      const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
      const std = rewards.length ? Math.sqrt(rewards.reduce((a, b) => a + (b - mean) ** 2, 0) / rewards.length) : null;
      const judged = g.all.filter((r) => typeof r.correct === 'boolean');
      const nCorrect = judged.filter((r) => r.correct).length;
      const label = isNum(g.group) ? `Prompt ${g.group}` : `Prompt ${ordinal}`;
      const stats = [
        `${g.all.length} completion${g.all.length === 1 ? '' : 's'}`,
        records.length !== g.all.length ? `${records.length} shown` : null,
        mean != null ? `mean reward ${fmtNum(mean, 3)}` : null,
        std != null && rewards.length > 1 ? `std ${fmtNum(std, 3)}` : null,
        judged.length ? `${nCorrect}/${judged.length} correct` : null,
      ].filter(Boolean).join(' · ');
      return h('div', { class: 'rollout-group', 'data-group': isNum(g.group) ? g.group : null },
        h('div', { class: 'group-head' }, h('strong', null, label), h('span', { class: 'group-stats' }, stats)),
        promptEl(g.prompt, false),
        h('div', { class: 'group-completions' }, records.map((r) => this.rolloutEl(r, false))));
    }

    rolloutEl(r, withPrompt) {
      const chips = [];
      if (isNum(r.index)) chips.push(h('span', { class: 'chip index' }, `#${r.index}`));
      if (withPrompt && isNum(r.group)) chips.push(h('span', { class: 'chip' }, `prompt ${r.group}`));
      if (r.correct === true) chips.push(h('span', { class: 'chip correct-mark ok', title: 'correct' }, '✓ correct'));
      else if (r.correct === false) chips.push(h('span', { class: 'chip correct-mark bad', title: 'incorrect' }, '✗ incorrect'));
      chips.push(h('span', { class: 'chip reward' }, 'reward ', h('b', null, fmtNum(r.reward, 4))));
      if (r.rewards && typeof r.rewards === 'object') {
        for (const [k, v] of Object.entries(r.rewards)) {
          chips.push(h('span', { class: 'chip fn-reward', 'data-fn': k }, `${k} ${fmtNum(v, 3)}`));
        }
      }
      if (isNum(r.advantage)) {
        chips.push(h('span', { class: `chip advantage ${r.advantage > 0 ? 'pos' : r.advantage < 0 ? 'neg' : ''}` }, `adv ${fmtSigned(r.advantage)}`));
      }
      if (isNum(r.completion_tokens)) chips.push(h('span', { class: 'chip tokens' }, `${r.completion_tokens} tokens`));
      if (r.finish_reason) {
        const trunc = r.finish_reason === 'length';
        chips.push(h('span', { class: `chip finish finish-${String(r.finish_reason).replace(/[^a-zA-Z0-9_-]/g, '')}`, title: trunc ? 'Hit the token limit (truncated)' : 'finish reason' },
          trunc ? 'truncated (length)' : r.finish_reason));
      }
      const cls = ['rollout'];
      if (r.correct === true) cls.push('is-correct');
      if (r.correct === false) cls.push('is-incorrect');
      if (r.finish_reason === 'length') cls.push('is-truncated');
      const el = h('div', {
        class: cls.join(' '),
        'data-reward': isNum(r.reward) ? String(r.reward) : '',
        'data-correct': typeof r.correct === 'boolean' ? String(r.correct) : '',
        'data-index': isNum(r.index) ? r.index : null,
      }, h('div', { class: 'rollout-head' }, chips));
      if (withPrompt) el.append(promptEl(r.prompt || '', true));
      el.append(h('pre', { class: 'completion' }, r.completion || ''));
      const calls = Array.isArray(r.tool_calls) ? r.tool_calls : [];
      if (calls.length) {
        el.append(h('div', { class: 'tool-calls' },
          h('div', { class: 'tool-calls-title' }, `Tool calls (${calls.length})`),
          h('ol', null, calls.map((c) => h('li', { class: c.failed ? 'tool-call failed' : 'tool-call' },
            h('div', { class: 'tool-name' }, c.name || 'tool', c.failed ? h('span', { class: 'failed-mark' }, ' failed') : null),
            h('pre', { class: 'tool-io tool-input' }, c.call || ''),
            h('div', { class: 'tool-arrow' }, '→'),
            h('pre', { class: 'tool-io tool-output' }, c.output || '')))))
        );
      }
      return el;
    }

    destroy() { this.seq++; }
  }

  function promptEl(prompt, compact) {
    // One line: chat-template markers (<|im_start|>, …) dropped, whitespace collapsed.
    const oneLine = prompt.replace(/<\|[^|>]*\|>/g, ' ').replace(/\s+/g, ' ').trim();
    const firstLine = oneLine.length > 240 ? oneLine.slice(0, 240) + '…' : oneLine;
    return h('details', { class: compact ? 'prompt compact' : 'prompt' },
      h('summary', null, h('span', { class: 'prompt-label' }, 'Prompt'), ' ', h('span', { class: 'prompt-preview' }, firstLine)),
      h('pre', { class: 'prompt-text' }, prompt));
  }

  // ---------------------------------------------------------------- compare page

  class ComparePage {
    constructor(app, route) {
      this.alive = true;
      this.names = route.runs;
      this.smoothing = DEFAULT_SMOOTHING;
      this.xMode = 'step';
      this.data = null;
      this.seq = 0;
      document.title = 'Compare · AtomRL dashboard';

      this.chipsEl = h('div', { class: 'run-chips' });
      this.configEl = h('div', { class: 'table-wrap fit' });
      this.metricsEl = h('div', { class: 'table-wrap fit' });
      this.chartsEl = h('div', { id: 'compare-charts' }, h('p', { class: 'empty' }, 'Loading…'));
      app.append(h('section', { id: 'compare-page' },
        h('div', { class: 'page-head' }, h('h2', null, `Compare ${this.names.length} runs`)),
        this.chipsEl,
        h('h3', { class: 'section-title' }, 'Config differences'), this.configEl,
        h('h3', { class: 'section-title' }, 'Metrics'), this.metricsEl,
        h('h3', { class: 'section-title' }, 'Charts'),
        h('div', { class: 'controls' },
          chartControls((v) => { this.smoothing = v; this.drawCharts(); }, (x) => { this.xMode = x; this.load(); }, true, (t) => this.chartSet.setFilter(t))),
        this.chartsEl));
      this.chartSet = new ChartSet(this.chartsEl, 'compare');
      this.renderChips(this.names);
      if (this.names.length < 2) Messages.set('compare-page', ['Select at least two runs on the runs list to compare them.']);
      this.load();
    }

    async load() {
      clearTimeout(this.timer);
      const seq = ++this.seq;
      const x = this.xMode;
      if (!this.names.length) return;
      const url = `/api/compare?runs=${this.names.map(encodeURIComponent).join(',')}&x=${x}&points=500`;
      try {
        const { data } = await api(url, { etag: true });
        if (!this.alive || seq !== this.seq) return;
        Messages.set('compare', data.messages);
        const sig = JSON.stringify([x, data]);
        if (sig !== this.sig) {
          this.sig = sig;
          this.data = data;
          this.render();
        }
      } catch (e) {
        if (!this.alive || seq !== this.seq) return;
        Messages.error('compare', e);
        if (!this.data) {
          this.configEl.replaceChildren(h('p', { class: 'empty' }, 'Could not load the comparison (see the message above).'));
          this.chartSet.sync('', [], false, 'No data.');
        }
      } finally {
        if (this.alive && seq === this.seq) this.timer = setTimeout(() => this.load(), LIST_POLL_MS);
      }
    }

    runs() {
      return this.data && Array.isArray(this.data.runs) ? this.data.runs : this.names;
    }

    renderChips(runs) {
      this.chipsEl.replaceChildren(...runs.map((r, i) => h('a', { class: 'run-chip', href: runHref(r) },
        h('span', { class: 'swatch', style: `background:${PALETTE[i % PALETTE.length]}` }), r)));
    }

    render() {
      const runs = this.runs();
      const d = this.data;
      this.renderChips(runs);
      const head = h('thead', null, h('tr', null, h('th', null, 'Key'), runs.map((r, i) => h('th', null, swatch(i), r))));
      const differing = Array.isArray(d.differing) ? d.differing : [];
      const cfgBody = h('tbody', null, differing.length
        ? differing.map((row) => h('tr', { 'data-key': row.key },
          h('td', { class: 'key' }, h('code', null, row.key)),
          runs.map((_, i) => {
            const v = (row.values || [])[i];
            return h('td', { class: v == null ? 'missing' : null }, v == null ? '—' : String(v));
          })))
        : h('tr', { class: 'none' }, h('td', { colspan: runs.length + 1, class: 'empty' }, 'None: the configurations of these runs do not differ.')));
      this.configEl.replaceChildren(h('table', { id: 'compare-config', class: 'data-table' }, head, cfgBody));

      const metrics = Array.isArray(d.metrics) ? d.metrics : [];
      const mHead = h('thead', null, h('tr', null, h('th', null, 'Metric'), runs.map((r, i) => h('th', { class: 'num' }, swatch(i), r))),
        h('tr', { class: 'sub' }, h('th', null, ''), runs.map(() => h('th', { class: 'num hint' }, 'final (best @ step)'))));
      const mBody = h('tbody', null, metrics.length
        ? [...metrics].sort((a, b) => cmpMetric(a.metric, b.metric)).map((m) => h('tr', { 'data-metric': m.metric },
          h('td', { class: 'key' }, m.metric),
          runs.map((_, i) => {
            const v = (m.values || [])[i];
            if (!v) return h('td', { class: 'num missing' }, '—');
            return h('td', { class: 'num' }, fmtNum(v.final, 4), ' ',
              h('span', { class: 'best' }, `(${fmtNum(v.best, 4)} @ ${v.best_step ?? '?'})`));
          })))
        : h('tr', { class: 'none' }, h('td', { colspan: runs.length + 1, class: 'empty' }, 'No metrics to compare.')));
      this.metricsEl.replaceChildren(h('table', { id: 'compare-metrics', class: 'data-table' }, mHead, mBody));
      this.drawCharts();
    }

    drawCharts() {
      if (!this.data) return;
      const runs = this.runs();
      const series = this.data.series || {};
      const names = Object.keys(series).filter((n) => n !== 'time/wall_s').sort(cmpMetric);
      const timeX = this.xMode === 'wall';
      const specs = names.map((metric) => {
        const per = runs.map((_, i) => {
          const s = (series[metric] || [])[i];
          return s ? cleanSeries(s) : null;
        });
        const { xs, cols } = alignSeries(per);
        const rawCols = [], smoothCols = [], defsRaw = [], defsSmooth = [];
        const pos = new Map(xs.map((x, j) => [x, j]));
        let points = 0;
        per.forEach((s, i) => {
          const color = PALETTE[i % PALETTE.length];
          // smooth each run over its own points, then spread onto the shared x axis
          const smCol = new Array(xs.length).fill(null);
          if (s) {
            const sm = smooth(s.ys, this.smoothing);
            s.xs.forEach((x, j) => { smCol[pos.get(x)] = sm[j]; });
            points += countPoints(s.ys);
          }
          rawCols.push(cols[i]);
          smoothCols.push(smCol);
          defsRaw.push({ label: `${runs[i]} (raw)`, stroke: faint(color, 0.22), width: 1 });
          defsSmooth.push({ label: runs[i], stroke: color, width: 2 });
        });
        return {
          metric, group: groupOf(metric),
          data: [xs, ...rawCols, ...smoothCols],
          points,
          series: [...defsRaw, ...defsSmooth],
          hideLegend: runs.map((_, i) => i + 1),
        };
      });
      const key = `${this.xMode}\n${runs.join('\u0000')}\n${names.join('\n')}`;
      this.chartSet.sync(key, specs, timeX, 'No metric series to compare.');
    }

    destroy() {
      this.alive = false;
      clearTimeout(this.timer);
      this.chartSet.destroy();
    }
  }

  function swatch(i) {
    return h('span', { class: 'swatch', style: `background:${PALETTE[i % PALETTE.length]}` });
  }

  // ---------------------------------------------------------------- router

  let current = null;

  function route() {
    const r = parseRoute();
    if (current && current.key === r.key && current.page.update) {
      current.page.update(r);
      return;
    }
    if (current) current.page.destroy();
    Messages.clear();
    const app = document.getElementById('app');
    app.replaceChildren();
    let page;
    if (r.kind === 'run') page = new RunPage(app, r);
    else if (r.kind === 'compare') page = new ComparePage(app, r);
    else page = new ListPage(app, r);
    current = { key: r.key, page };
    window.scrollTo(0, 0);
  }

  function start() {
    if (typeof window.uPlot !== 'function') {
      Messages.error('init', 'The charting library (uPlot) failed to load; charts are unavailable.');
    }
    window.addEventListener('hashchange', route);
    route();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
