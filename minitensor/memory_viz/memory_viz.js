// minitensor's memory viewer: draws the model memory_viz.py inlined as JSON, on two canvases, without libraries.
//
// Why it stays fast on long traces: the page never builds one polygon per allocation (each free would move every
// band above it). It keeps, per device, each allocation's lifetime [start, end) in states (state t: after t trace
// entries) and, every K states, a checkpoint of the live allocations in stacking order. Drawing samples one state
// per pixel column (or one column per state when zoomed in), walks the live list upwards, and merges runs of bands
// thinner than a pixel into one grey rectangle; hover replays from the nearest checkpoint and walks one column.
'use strict';
(function () {
  const DATA = JSON.parse(document.getElementById('mtviz-data').textContent);
  const PALETTE = ['#4e79a7', '#f28e2c', '#e15759', '#76b7b2', '#59a14f', '#edc949', '#af7aa1', '#ff9da7',
    '#9c755f', '#bab0ab'];
  const MERGED = '#c4c4c4', HOT = '#1b1b1b';
  const STATE_COLOR = {active_allocated: '#4e79a7', active_pending_free: '#f28e2c', inactive: '#e9e9e9'};
  const LEFT = 78, RIGHT = 14, TOP = 10, BOTTOM = 26;  // the timeline's plot margins, CSS px
  const CHECKPOINT_INTS = 4e6;  // at most this many ids kept in checkpoints; K doubles until they fit
  const $ = id => document.getElementById(id);
  const OOM = DATA.action_names.indexOf('oom');
  const hook = window.__mtviz = {ready: false};

  function fmtBytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = n, u = 0;
    while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return u === 0 ? `${n} B` : `${v.toFixed(1)} ${units[u]} (${n} bytes)`;
  }
  function shortBytes(n) {
    const units = ['B', 'K', 'M', 'G', 'T'];
    let v = n, u = 0;
    while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return `${+v.toFixed(v < 10 && u ? 1 : 0)}${units[u]}`;
  }
  const hex = a => '0x' + a.toString(16);
  function poolName(p) {
    const q = DATA.pools[p];
    return `(${q.join(', ')})${q[0] === 0 && q[1] === 0 ? ' general cache' : ''}`;
  }
  function stackText(s, limit = 14) {
    const frames = DATA.stacks[s];
    if (!frames.length) return '  (no frames recorded)';
    const lines = frames.slice(0, limit).map(f => '  ' + DATA.frames[f]);
    if (frames.length > limit) lines.push(`  ... ${frames.length - limit} more frames`);
    return lines.join('\n');
  }

  // ---------------------------------------------------------------------------------------- the model
  function csr(key, n, states) {  // ids grouped by key[id] in 0..states, each group in increasing id order
    const off = new Int32Array(states + 2);
    for (let i = 0; i < n; i++) off[key[i] + 1]++;
    for (let s = 1; s < off.length; s++) off[s] += off[s - 1];
    const fill = off.slice(), ids = new Int32Array(n);
    for (let i = 0; i < n; i++) ids[fill[key[i]]++] = i;
    return [off, ids];
  }
  function heldSeries(start, end, size, N) {  // bytes held at each state 0..N
    const d = new Float64Array(N + 2), out = new Float64Array(N + 1);
    for (let i = 0; i < size.length; i++) { d[start[i]] += size[i]; d[Math.min(end[i], N + 1)] -= size[i]; }
    let acc = 0;
    for (let t = 0; t <= N; t++) { acc += d[t]; out[t] = acc; }
    return out;
  }

  function Model(dev) {
    const A = dev.a, N = dev.entries, n = A.size.length;
    const start = Int32Array.from(A.start), end = Int32Array.from(A.end), size = Float64Array.from(A.size);
    const [sOff, sIds] = csr(start, n, N + 1), [eOff, eIds] = csr(end, n, N + 1);
    const total = heldSeries(start, end, size, N);
    const S = dev.s, segStart = Int32Array.from(S.start), segEnd = Int32Array.from(S.end);
    const reserved = heldSeries(segStart, segEnd, Float64Array.from(S.size), N);
    const time = new Float64Array(N + 1);  // time_us of entry t (t >= 1), relative to the first
    for (let t = 1; t <= N; t++) time[t] = time[t - 1] + (t > 1 ? dev.dt[t - 1] : 0);
    // the live list, in stacking order (allocation id); HEAD is its sentinel
    const HEAD = n, next = new Int32Array(n + 1), prev = new Int32Array(n + 1);
    let cur = -1, live = 0;
    const clear = () => { next[HEAD] = prev[HEAD] = HEAD; live = 0; };
    const append = i => { const l = prev[HEAD]; next[l] = i; prev[i] = l; next[i] = HEAD; prev[HEAD] = i; live++; };
    const remove = i => { next[prev[i]] = next[i]; prev[next[i]] = prev[i]; live--; };
    function step() {
      const t = cur + 1;
      for (let k = eOff[t]; k < eOff[t + 1]; k++) remove(eIds[k]);
      for (let k = sOff[t]; k < sOff[t + 1]; k++) append(sIds[k]);
      cur = t;
    }
    function dump() {
      const out = new Int32Array(live);
      for (let i = next[HEAD], k = 0; i !== HEAD; i = next[i]) out[k++] = i;
      return out;
    }
    let K = 256, cps = [], stored = 0;
    clear();
    for (let t = 0; t <= N; t++) {
      step();
      if (t % K === 0) {
        const cp = dump();
        cps.push(cp);
        stored += cp.length;
        while (stored > CHECKPOINT_INTS && cps.length > 1) {
          cps = cps.filter((_, j) => j % 2 === 0);
          K *= 2;
          stored = cps.reduce((a, c) => a + c.length, 0);
        }
      }
    }
    function goto(t) {  // make the live list the state t
      if (t < cur || t - cur > K) {
        const c = Math.min(Math.floor(t / K), cps.length - 1);
        clear();
        for (const i of cps[c]) append(i);
        cur = c * K;
      }
      while (cur < t) step();
    }
    return {dev, N, n, A, S, start, end, size, total, reserved, time, next, HEAD, goto, segStart, segEnd,
      liveCount: () => live, checkpointEvery: () => K};
  }

  // ---------------------------------------------------------------------------------------- state
  let M = null, view = [0, 1], hot = -1, timeSel = 0, pending = false, brush = null, drawnK = 1;
  const models = {};
  const tl = $('timeline'), sg = $('segments'), tip = $('tooltip');
  const showReserved = () => $('show-reserved').checked;
  const stats = {columns: 0, rects: 0, merged: 0, ms: 0};

  function plotSize() { return [tl.clientWidth - LEFT - RIGHT, tl.clientHeight - TOP - BOTTOM]; }
  function columns(pw) {  // [state drawn, x0, x1, last state covered]
    const [a, b] = view, span = b - a, out = [];
    if (span <= pw) {
      for (let s = Math.max(0, Math.floor(a)); s < b && s <= M.N; s++) {
        out.push([s, (s - a) / span * pw, (s + 1 - a) / span * pw, s]);
      }
    } else {
      for (let c = 0; c < pw; c++) {
        const s = Math.floor(a + c * span / pw);
        if (s > M.N) break;
        out.push([s, c, c + 1, Math.min(M.N, Math.max(s, Math.ceil(a + (c + 1) * span / pw) - 1))]);
      }
    }
    return out;
  }
  function stateAt(px) {
    const [pw] = plotSize(), [a, b] = view, span = b - a;
    const s = span <= pw ? Math.floor(a + px / pw * span) : Math.floor(a + Math.floor(px) * span / pw);
    return Math.max(0, Math.min(M.N, s));
  }
  function niceStep(raw, bytes) {  // entries: 1, 2 or 5 times a power of 10; bytes: a power of 2
    if (bytes) return Math.pow(2, Math.ceil(Math.log2(Math.max(1, raw))));
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    return p * (raw / p <= 1 ? 1 : raw / p <= 2 ? 2 : raw / p <= 5 ? 5 : 10);
  }
  function yScale(cols, ph) {
    let top = 1024;
    for (const [s, , , last] of cols) {
      for (let t = s; t <= last; t++) {
        top = Math.max(top, M.total[t], showReserved() ? M.reserved[t] : 0);
      }
    }
    return ph / (top * 1.05);
  }

  // Walk one column's stack, as drawn: calls band(id, y0, y1) for bands >= 1 px, run(count, bytes, y0, y1) for
  // merged runs of thinner ones (y0 > y1: canvas y grows downwards). Returns the stack's top y.
  function walkColumn(s, k, base, band, run) {
    M.goto(s);
    const {next, HEAD, size} = M;
    let off = 0, runY = -1, runN = 0, runBytes = 0, y = base;
    for (let i = next[HEAD]; i !== HEAD; i = next[i]) {
      const y0 = base - off * k;
      off += size[i];
      y = base - off * k;
      if (y0 - y >= 1) {
        if (runN) { run(runN, runBytes, runY, y0); runN = 0; }
        band(i, y0, y);
      } else {
        if (!runN) { runY = y0; runBytes = 0; }
        runN++;
        runBytes += size[i];
      }
    }
    if (runN) run(runN, runBytes, runY, y);
    return y;
  }

  function fitCanvas(c, h) {
    const dpr = window.devicePixelRatio || 1, w = c.clientWidth;
    if (h !== undefined) c.style.height = h + 'px';
    const H = h === undefined ? c.clientHeight : h;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(H * dpr)) {
      c.width = Math.round(w * dpr); c.height = Math.round(H * dpr);
    }
    const ctx = c.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, H);
    return ctx;
  }

  function drawTimeline() {
    const began = performance.now();
    const ctx = fitCanvas(tl), [pw, ph] = plotSize(), base = TOP + ph;
    const cols = columns(pw), k = drawnK = yScale(cols, ph);  // hover and locate reuse the scale as drawn
    const buckets = PALETTE.map(() => []), merged = [], hotRects = [];
    const yStep = niceStep(ph / k / 6, true);
    ctx.strokeStyle = '#eee'; ctx.lineWidth = 1; ctx.beginPath();  // the grid, under the bands
    for (let v = yStep; v * k <= ph; v += yStep) {
      ctx.moveTo(LEFT + 1, base - v * k); ctx.lineTo(LEFT + pw, base - v * k);
    }
    ctx.stroke();
    ctx.save();
    ctx.beginPath(); ctx.rect(LEFT, 0, pw, base); ctx.clip();  // a zoomed view cuts its edge states
    let rects = 0, mergedRuns = 0;
    for (const [s, x0, x1] of cols) {
      const x = LEFT + x0, w = x1 - x0;
      walkColumn(s, k, base,
        (i, y0, y1) => { (i === hot ? hotRects : buckets[i % PALETTE.length]).push(x, y1, w, y0 - y1); rects++; },
        (cnt, bytes, y0, y1) => { merged.push(x, y1, w, y0 - y1); mergedRuns++; });
    }
    const fill = (color, r) => {
      if (!r.length) return;
      ctx.fillStyle = color;
      ctx.beginPath();
      for (let j = 0; j < r.length; j += 4) ctx.rect(r[j], r[j + 1], r[j + 2], r[j + 3]);
      ctx.fill();
    };
    buckets.forEach((r, j) => fill(PALETTE[j], r));
    fill(MERGED, merged);
    fill(HOT, hotRects);
    // the most allocated within each column (a column samples one state), and reserved, dashed
    const line = (series, style, dash) => {
      ctx.strokeStyle = style; ctx.setLineDash(dash); ctx.lineWidth = 1; ctx.beginPath();
      cols.forEach(([s, x0, x1, last], j) => {
        let m = 0;
        for (let t = s; t <= last; t++) m = Math.max(m, series[t]);
        const y = base - m * k;
        if (j === 0) ctx.moveTo(LEFT + x0, y); else ctx.lineTo(LEFT + x0, y);
        ctx.lineTo(LEFT + x1, y);
      });
      ctx.stroke(); ctx.setLineDash([]);
    };
    line(M.total, '#333', []);
    if (showReserved()) line(M.reserved, '#b03030', [5, 3]);
    // out-of-memory errors: a red mark at the top
    const [a, b] = view;
    ctx.fillStyle = '#d00';
    for (let s = Math.max(1, Math.floor(a)); s < b && s <= M.N; s++) {
      if (M.dev.actions[s - 1] === OOM) ctx.fillRect(LEFT + (s - 0.5 - a) / (b - a) * pw - 1, TOP, 3, 8);
    }
    // the segment map's time
    if (timeSel >= a && timeSel < b) {
      const x = LEFT + (timeSel + 0.5 - a) / (b - a) * pw;
      ctx.strokeStyle = '#7a3da8'; ctx.beginPath(); ctx.moveTo(x, TOP); ctx.lineTo(x, base); ctx.stroke();
    }
    ctx.restore();
    // axes
    ctx.fillStyle = '#444'; ctx.strokeStyle = '#999'; ctx.font = '11px system-ui,sans-serif';
    ctx.beginPath(); ctx.moveTo(LEFT, TOP); ctx.lineTo(LEFT, base); ctx.lineTo(LEFT + pw, base); ctx.stroke();
    ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
    for (let v = 0; v * k <= ph; v += yStep) ctx.fillText(shortBytes(v), LEFT - 6, base - v * k);
    ctx.textAlign = 'center'; ctx.textBaseline = 'top';
    const xStep = Math.max(1, niceStep((b - a) / 10));
    for (let v = Math.ceil(a / xStep) * xStep; v <= b; v += xStep) {  // state v's column starts at v
      ctx.fillText(String(v), LEFT + (v - a) / (b - a) * pw, base + 5);
    }
    ctx.textAlign = 'right';
    ctx.fillText('trace entries', LEFT + pw, base + 15);
    Object.assign(stats, {columns: cols.length, rects, merged: mergedRuns, ms: performance.now() - began});
    $('stats').textContent = `${M.n} allocations, ${M.N} entries; view ${Math.floor(a)}..${Math.ceil(b) - 1}: ` +
      `${cols.length} columns, ${rects} bands drawn, ${mergedRuns} merged runs`;
  }

  // ---------------------------------------------------------------------------------------- hover
  function timelineHit(x, y) {  // what lies under canvas point (x, y), as drawn
    const [pw, ph] = plotSize(), px = x - LEFT;
    if (px < 0 || px >= pw || y < TOP || y > TOP + ph) return null;
    const s = stateAt(px), k = drawnK;
    let hit = null;
    const topY = walkColumn(s, k, TOP + ph,
      (i, y0, y1) => { if (y <= y0 && y >= y1) hit = {kind: 'alloc', id: i, s}; },
      (cnt, bytes, y0, y1) => { if (!hit && y <= y0 && y >= y1) hit = {kind: 'merged', cnt, bytes, s}; });
    if (!hit && showReserved() && y < topY && y >= TOP + ph - M.reserved[s] * k) hit = {kind: 'free', s};
    return hit;
  }
  function whenText(s) {
    if (s === 0) return 'before the trace';
    return `entry ${s}/${M.N} (${DATA.action_names[M.dev.actions[s - 1]]}, +${(M.time[s] / 1000).toFixed(3)} ms)`;
  }
  function allocText(i) {
    const A = M.A, origin = A.origin[i];
    const born = origin === 0 ? `allocated at ${whenText(A.start[i])}` : 'allocated before the trace began';
    const died = A.end[i] > M.N ? 'still allocated at the snapshot' : `freed at ${whenText(A.end[i])}`;
    const req = A.req[i] >= 0 ? `, free requested at ${whenText(A.req[i])}` : '';
    const whose = origin === 1 ? 'frames (of its free; its alloc predates the trace):' : 'frames (innermost first):';
    return `allocation #${i}: ${fmtBytes(A.size[i])}\naddress ${hex(A.addr[i])}, stream ${A.stream[i]}, ` +
      `pool ${poolName(A.pool[i])}\n${born}\n${died}${req}\n${whose}\n${stackText(A.stack[i])}`;
  }
  function hitText(h) {
    if (!h) return null;
    const at = `at ${whenText(h.s)}: ${fmtBytes(M.total[h.s])} allocated, ${fmtBytes(M.reserved[h.s])} reserved`;
    if (h.kind === 'alloc') return allocText(h.id) + '\n' + at;
    if (h.kind === 'merged') return `${h.cnt} allocations thinner than a pixel, merged: ${fmtBytes(h.bytes)}\n${at}`;
    return `reserved but not allocated: ${fmtBytes(M.reserved[h.s] - M.total[h.s])}\n${at}`;
  }
  function showTip(text, cx, cy) {
    if (text === null) { tip.hidden = true; return; }
    if (tip.textContent === text && !tip.hidden) { placeTip(cx, cy); return; }
    tip.textContent = text;
    tip.style.left = tip.style.top = '0px';  // measure at full width, not squeezed by the last position
    tip.hidden = false;
    const r = tip.getBoundingClientRect();
    tipSize = [r.width, r.height];
    placeTip(cx, cy);
  }
  let tipSize = [0, 0];
  function placeTip(cx, cy) {  // right of and below the pointer, else left of or above it
    const [w, h] = tipSize;
    const x = cx + 14 + w <= window.innerWidth ? cx + 14 : Math.max(0, cx - 14 - w);
    const y = cy + 14 + h <= window.innerHeight ? cy + 14 : Math.max(0, cy - 14 - h);
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  }
  function locate(id) {  // a canvas point inside allocation `id` in the current view, or null
    const [pw] = plotSize();
    const xs = [];
    for (let px = 0.5; px < pw; px += 1) {
      const s = stateAt(px);
      if (s >= M.start[id] && s < M.end[id]) xs.push(px);
    }
    for (const px of [xs[xs.length >> 1], ...xs]) {
      if (px === undefined) break;
      const ph = plotSize()[1];
      let found = null;
      walkColumn(stateAt(px), drawnK, TOP + ph, (i, y0, y1) => { if (i === id && y0 - y1 >= 2) found = (y0 + y1) / 2; },
        () => {});
      if (found !== null) {
        const r = tl.getBoundingClientRect();
        return {x: LEFT + px, y: found, clientX: r.left + LEFT + px, clientY: r.top + found};
      }
    }
    return null;
  }

  // ---------------------------------------------------------------------------------------- segment map
  let segLayout = [];
  function drawSegments() {
    const t = timeSel, S = M.S, W = sg.clientWidth, pad = 8, rowH = 20, gap = 5, headH = 18;
    const segs = [];
    for (let j = 0; j < S.addr.length; j++) {
      if (S.start[j] <= t && t < S.end[j]) {
        segs.push({addr: S.addr[j], size: S.size[j], stream: S.stream[j], pool: S.pool[j],
          type: S.type[j] === null ? null : DATA.segment_types[S.type[j]], blocks: [], used: 0});
      }
    }
    const byAddr = segs.slice().sort((p, q) => p.addr - q.addr);
    M.goto(t);
    let orphans = 0;
    for (let i = M.next[M.HEAD]; i !== M.HEAD; i = M.next[i]) {
      const a = M.A.addr[i];
      let lo = 0, hi = byAddr.length - 1, seg = null;
      while (lo <= hi) {
        const mid = (lo + hi) >> 1, g = byAddr[mid];
        if (a < g.addr) hi = mid - 1; else if (a >= g.addr + g.size) lo = mid + 1; else { seg = g; break; }
      }
      if (!seg) { orphans++; continue; }
      const state = M.A.req[i] >= 0 && M.A.req[i] <= t ? 'active_pending_free' : 'active_allocated';
      seg.blocks.push({id: i, addr: a, size: M.size[i], state});
      seg.used += M.size[i];
    }
    const pools = new Map();
    for (const g of byAddr) { if (!pools.has(g.pool)) pools.set(g.pool, []); pools.get(g.pool).push(g); }
    const order = [...pools.keys()].sort((p, q) => p - q);
    const maxSize = Math.max(1, ...segs.map(g => g.size)), scale = (W - 2 * pad) / maxSize;
    // lay out: a header per pool, then its segments left to right, wrapping
    const heads = [];
    let y = pad;
    segLayout = [];
    for (const p of order) {
      const list = pools.get(p), sum = key => list.reduce((s, g) => s + g[key], 0);
      const res = sum('size'), used = sum('used');
      heads.push([`pool ${poolName(p)}: ${list.length} segments, ${shortBytes(res)} reserved, ` +
        `${shortBytes(used)} allocated`, y]);
      y += headH;
      let x = pad;
      for (const g of list) {
        const w = Math.max(3, g.size * scale);
        if (x > pad && x + w > W - pad) { x = pad; y += rowH + gap; }
        segLayout.push(Object.assign(g, {x, y, w, h: rowH}));
        x += w + gap;
      }
      y += rowH + gap + 4;
    }
    const ctx = fitCanvas(sg, Math.max(60, y + pad));
    ctx.font = '12px system-ui,sans-serif'; ctx.textBaseline = 'top'; ctx.fillStyle = '#333';
    for (const [text, hy] of heads) ctx.fillText(text, pad, hy + 2);
    let blocksDrawn = 0;
    for (const g of segLayout) {
      const k = g.w / g.size;
      ctx.fillStyle = STATE_COLOR.inactive; ctx.fillRect(g.x, g.y, g.w, g.h);
      for (const b of g.blocks) {
        ctx.fillStyle = b.id === hot ? HOT : STATE_COLOR[b.state];
        ctx.fillRect(g.x + (b.addr - g.addr) * k, g.y, Math.max(1, b.size * k), g.h);
        blocksDrawn++;
      }
      ctx.strokeStyle = '#555'; ctx.lineWidth = 1; ctx.strokeRect(g.x + 0.5, g.y + 0.5, g.w - 1, g.h - 1);
      if (g.w > 110) {
        const label = `${hex(g.addr)} ${shortBytes(g.size)}`;
        ctx.font = '10px ui-monospace,monospace';
        ctx.fillStyle = '#ffffffcc'; ctx.fillRect(g.x + 2, g.y + 3, ctx.measureText(label).width + 3, 13);
        ctx.fillStyle = '#000'; ctx.fillText(label, g.x + 3, g.y + 5);
      }
    }
    $('time-label').textContent = t === M.N ? `the snapshot (after all ${M.N} entries)` :
      `after ${whenText(t)}` + (orphans ? `; ${orphans} allocations outside any segment` : '');
    hook.segmentsDrawn = segLayout.length;
    hook.blocksDrawn = blocksDrawn;
  }
  function segmentText(x, y) {
    const g = segLayout.find(q => x >= q.x && x < q.x + q.w && y >= q.y && y < q.y + q.h);
    if (!g) return null;
    const head = `segment ${hex(g.addr)}: ${fmtBytes(g.size)}, pool ${poolName(g.pool)}, stream ${g.stream}` +
      `${g.type ? ', ' + g.type : ''}\n${fmtBytes(g.used)} in ${g.blocks.length} blocks, ` +
      `${fmtBytes(g.size - g.used)} inactive`;
    const addr = g.addr + (x - g.x) / g.w * g.size;
    const b = g.blocks.find(q => addr >= q.addr && addr < q.addr + q.size);
    if (!b) return head + '\n(inactive: free space cached in this segment)';
    return `${head}\n\nblock ${b.state}\n${allocText(b.id)}`;
  }

  // ---------------------------------------------------------------------------------------- wiring
  function redraw() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; drawTimeline(); drawSegments(); });
  }
  function setView(a, b) {
    const full = M.N + 1, span = Math.min(full, Math.max(4, b - a));
    a = Math.max(0, Math.min(a, full - span));
    view = [a, a + span];
    redraw();
  }
  function setTime(t) { timeSel = Math.max(0, Math.min(M.N, Math.round(t))); $('time').value = timeSel; redraw(); }
  function setDevice(label) {
    const dev = DATA.devices.find(d => d.label === label) || DATA.devices[0];
    M = models[dev.label] || (models[dev.label] = Model(dev));
    $('device').value = dev.label;
    view = [0, M.N + 1]; hot = -1;
    $('time').max = M.N;
    timeSel = M.N; $('time').value = M.N;
    Object.assign(hook, {device: dev.label, shapes: M.n, allocations: M.n, entries: M.N,
      segmentsAtEnd: M.S.addr.filter((_, j) => M.segEnd[j] > M.N).length});
    drawTimeline(); drawSegments();
  }
  const local = (c, e) => { const r = c.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };

  tl.addEventListener('mousemove', e => {
    const [x, y] = local(tl, e);
    if (brush) {
      const x0 = Math.min(brush.x, x), x1 = Math.max(brush.x, x), el = $('brush');
      Object.assign(el.style, {display: 'block', left: x0 + 'px', width: (x1 - x0) + 'px', top: TOP + 'px',
        height: plotSize()[1] + 'px'});
      brush.moved = Math.abs(x - brush.x) > 4;
      return;
    }
    const h = timelineHit(x, y), id = h && h.kind === 'alloc' ? h.id : -1;
    if (id !== hot) { hot = id; redraw(); }
    showTip(hitText(h), e.clientX, e.clientY);
  });
  tl.addEventListener('mouseleave', () => { showTip(null); if (hot !== -1) { hot = -1; redraw(); } });
  tl.addEventListener('mousedown', e => { brush = {x: local(tl, e)[0], moved: false}; showTip(null); });
  window.addEventListener('mouseup', e => {
    if (!brush) return;
    const b = brush, x = local(tl, e)[0];
    brush = null; $('brush').style.display = 'none';
    const [pw] = plotSize(), [a, v1] = view, at = px => a + Math.max(0, Math.min(pw, px - LEFT)) / pw * (v1 - a);
    if (b.moved) setView(Math.min(at(b.x), at(x)), Math.max(at(b.x), at(x)));
    else if (x - LEFT >= 0 && x - LEFT < pw) setTime(stateAt(x - LEFT));
  });
  tl.addEventListener('dblclick', () => setView(0, M.N + 1));
  tl.addEventListener('wheel', e => {
    e.preventDefault();
    const [pw] = plotSize(), [a, b] = view, span = b - a;
    const at = a + Math.max(0, Math.min(1, (local(tl, e)[0] - LEFT) / pw)) * span;
    if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      const d = (e.deltaX || e.deltaY) / pw * span;
      setView(a + d, b + d);
    } else {
      const f = Math.exp(e.deltaY * 0.0015);
      setView(at - (at - a) * f, at + (b - at) * f);
    }
  }, {passive: false});
  sg.addEventListener('mousemove', e => {
    const [x, y] = local(sg, e);
    showTip(segmentText(x, y), e.clientX, e.clientY);
  });
  sg.addEventListener('mouseleave', () => showTip(null));
  $('time').addEventListener('input', e => setTime(+e.target.value));
  $('reset').addEventListener('click', () => setView(0, M.N + 1));
  $('show-reserved').addEventListener('change', redraw);
  $('device').addEventListener('change', e => setDevice(e.target.value));
  $('png').addEventListener('click', () => {
    const a = document.createElement('a');
    a.href = tl.toDataURL('image/png');
    a.download = `memory-timeline-${M.dev.label.replace(/[^\w]+/g, '_')}.png`;
    a.click();
  });
  window.addEventListener('resize', redraw);

  for (const d of DATA.devices) {
    const o = document.createElement('option');
    o.value = o.textContent = d.label;
    $('device').appendChild(o);
  }
  try {
    setDevice(DATA.devices[0].label);
  } catch (err) {
    $('error').textContent = `the viewer failed: ${err}`;
    throw err;
  }
  Object.assign(hook, {
    devices: DATA.devices.map(d => d.label),
    hover(x, y) { return hitText(timelineHit(x, y)); },
    hoverSegments(x, y) { return segmentText(x, y); },
    locate,
    allocationStartedAt(s) {  // the id of the allocation whose "alloc" is entry s (1-based), or null
      for (let i = 0; i < M.n; i++) if (M.A.origin[i] === 0 && M.start[i] === s) return i;
      return null;
    },
    segmentRects: () => segLayout.map(g => ({addr: g.addr, size: g.size, pool: DATA.pools[g.pool], x: g.x, y: g.y,
      w: g.w, h: g.h, blocks: g.blocks.length})),
    setTime(t) { setTime(t); drawTimeline(); drawSegments(); },
    setDevice,
    zoom(a, b) { setView(a, b); drawTimeline(); drawSegments(); },
    reset() { setView(0, M.N + 1); drawTimeline(); drawSegments(); },
    view: () => view.slice(),
    drawStats: () => Object.assign({checkpointEvery: M.checkpointEvery()}, stats),
    readyMs: performance.now(),
    ready: true,
  });
})();
