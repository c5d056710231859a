// krause-serve's web page (docs/web.md): models, classify with attention, generate row by row,
// complete, score. It holds no rule of its own: every setting goes to the server as typed, and
// what the server refuses is shown with the server's message next to the control it names.
//
// The server, all on this port:
//   POST /krause.v1.KrauseService/{ListModels,Classify,Score,Inspect}   krause.v1 over Connect
//   POST /v2/models/{model}/generate_stream                             Server-Sent Events
//   GET  /v2                                                            server metadata
'use strict';

const TOKEN_KEY = 'krause-serve-token';
const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------------------------------------
// Talking to the server

class ServerError extends Error {
  constructor(message, status, code) {
    super(message);
    this.status = status;  // HTTP status (0: no answer)
    this.code = code || '';
  }
}

function headers(extra) {
  const h = Object.assign({}, extra);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

// The error of an answer that is not 200 (a 401 asks for a token).
function failure(response, message, code) {
  if (response.status === 401) askToken();
  return new ServerError(message || `${response.status} ${response.statusText}`, response.status, code);
}

async function send(path, init) {
  try {
    return await fetch(path, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ServerError(`the server cannot be reached (${e.message})`, 0, 'unavailable');
  }
}

// A krause.v1 unary call over the Connect protocol: the request and the response as JSON.
async function rpc(method, request) {
  const response = await send(`/krause.v1.KrauseService/${method}`, {
    method: 'POST',
    headers: headers({'Content-Type': 'application/json'}),
    body: JSON.stringify(request),
  });
  const body = await response.json().catch(() => null);
  if (!response.ok) throw failure(response, body && body.message, body && body.code);
  return body;
}

// A number the page must not round (a 64-bit seed): written into the JSON as typed.
class Digits {
  constructor(text) { this.text = text; }
}

// A JSON object whose Digits values are written as bare numbers.
function jsonBody(settings) {
  const parts = Object.entries(settings).map(([k, v]) =>
    JSON.stringify(k) + ':' + (v instanceof Digits ? v.text : JSON.stringify(v)));
  return '{' + parts.join(',') + '}';
}

// A generation streamed as Server-Sent Events: onEvent gets each event (start, row, progress,
// image, done) as it comes; an `error` event rejects with the server's message. `signal` stops
// it (the server cancels the images when the connection closes).
async function generateStream(model, settings, onEvent, signal) {
  const response = await send(`/v2/models/${encodeURIComponent(model)}/generate_stream`, {
    method: 'POST',
    headers: headers({'Content-Type': 'application/json'}),
    body: jsonBody(settings),
    signal,
  });
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    throw failure(response, body && body.error);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true}).replace(/\r\n/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split('\n').filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).trimStart()).join('\n');
      if (!data) continue;  // a ": ping" comment
      // Seeds are 64-bit: kept as text (a JavaScript number holds 53 bits).
      const event = JSON.parse(data.replace(/"seed":(\d{16,})/g, '"seed":"$1"'));
      if (event.type === 'error') throw new ServerError(event.error, event.status, event.code);
      onEvent(event);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Errors next to the control they name

// Clears a panel's errors: its alert line and the marks on its controls.
function clearErrors(section) {
  section.querySelectorAll('.field-error').forEach((e) => e.remove());
  section.querySelectorAll('[aria-invalid]').forEach((e) => e.removeAttribute('aria-invalid'));
  section.querySelectorAll('.error').forEach((e) => { e.textContent = ''; });
}

// Shows `error` in `section`: under the control whose data-field is the setting the server's
// message starts with ("guidance must be a number"), else in `box` (beside the button pressed).
function showError(section, box, error) {
  if (error.name === 'AbortError') return;
  const message = error.message || String(error);
  const named = /^[A-Za-z_]+/.exec(message);
  const control = named && section.querySelector(`[data-field="${named[0]}"]`);
  if (control && control.offsetParent !== null) {
    control.setAttribute('aria-invalid', 'true');
    const note = document.createElement('span');
    note.className = 'field-error';
    note.id = control.id + '-error';
    note.setAttribute('role', 'alert');
    note.textContent = message;
    control.setAttribute('aria-describedby', note.id);
    control.closest('label').appendChild(note);
    return;
  }
  box.textContent = message;
}

// ---------------------------------------------------------------------------------------------
// Images

// Base64 of bytes, and back.
function toBase64(bytes) {
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000)
    s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

// An 8-bit grey (1 channel) or RGB (3) PNG of HWC pixels, exactly those values (a canvas's own
// PNG would be RGBA).
async function encodePng(width, height, channels, pixels) {
  const stride = width * channels;
  const raw = new Uint8Array(height * (stride + 1));  // each row: filter 0, then its bytes
  for (let y = 0; y < height; y++) raw.set(pixels.subarray(y * stride, (y + 1) * stride), y * (stride + 1) + 1);
  const packed = new Uint8Array(await new Response(
      new Blob([raw]).stream().pipeThrough(new CompressionStream('deflate'))).arrayBuffer());
  const chunk = (type, data) => {
    const out = new Uint8Array(12 + data.length);
    const view = new DataView(out.buffer);
    view.setUint32(0, data.length);
    for (let i = 0; i < 4; i++) out[4 + i] = type.charCodeAt(i);
    out.set(data, 8);
    view.setUint32(8 + data.length, crc32(out.subarray(4, 8 + data.length)));
    return out;
  };
  const header = new Uint8Array(13);
  const hv = new DataView(header.buffer);
  hv.setUint32(0, width);
  hv.setUint32(4, height);
  header[8] = 8;                         // bits per sample
  header[9] = channels === 1 ? 0 : 2;    // grey or RGB
  const parts = [new Uint8Array([137, 80, 78, 71, 13, 10, 26, 10]), chunk('IHDR', header),
    chunk('IDAT', packed), chunk('IEND', new Uint8Array(0))];
  const png = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { png.set(p, at); at += p.length; }
  return png;
}

// Paints HWC pixels (rows y0.. of a width x channels image) onto a canvas's rows.
function paintRows(canvas, y0, channels, pixels) {
  const width = canvas.width;
  const rows = pixels.length / (width * channels);
  const image = new ImageData(width, rows);
  for (let i = 0, j = 0; i < width * rows; i++, j += channels) {
    image.data[4 * i] = pixels[j];
    image.data[4 * i + 1] = pixels[channels === 3 ? j + 1 : j];
    image.data[4 * i + 2] = pixels[channels === 3 ? j + 2 : j];
    image.data[4 * i + 3] = 255;
  }
  canvas.getContext('2d').putImageData(image, 0, y0);
}

// A drawing pad at the model's size, shown large: draw with the pointer (white on black, as
// Fashion-MNIST), upload or drop a picture (scaled to the model's size), clear.
class DrawPad {
  constructor(root, onChange) {
    this.onChange = onChange || (() => {});
    this.channels = 1;
    this.canvas = document.createElement('canvas');
    this.canvas.width = this.canvas.height = 28;
    this.canvas.setAttribute('role', 'img');
    this.canvas.setAttribute('aria-label', 'Drawing pad: draw with the mouse or a finger');
    const bar = document.createElement('div');
    bar.className = 'buttons';
    const brush = document.createElement('label');
    brush.textContent = 'Brush ';
    this.brush = document.createElement('select');
    for (const [v, name] of [[0.8, 'thin'], [1.3, 'medium'], [2, 'thick']])
      this.brush.add(new Option(name, v, v === 1.3, v === 1.3));
    brush.appendChild(this.brush);
    const clear = document.createElement('button');
    clear.type = 'button';
    clear.textContent = 'Clear';
    clear.addEventListener('click', () => { this.clear(); this.onChange(); });
    const upload = document.createElement('label');
    upload.textContent = 'Upload ';
    this.file = document.createElement('input');
    this.file.type = 'file';
    this.file.accept = 'image/png,image/*';
    this.file.addEventListener('change', () => { if (this.file.files[0]) this.load(this.file.files[0]); });
    upload.appendChild(this.file);
    bar.append(brush, clear, upload);
    root.append(this.canvas, bar);
    this.root = root;
    this.clear();
    this.listen();
  }

  setShape(height, width, channels) {
    if (this.canvas.height === height && this.canvas.width === width && this.channels === channels) return;
    this.canvas.height = height;
    this.canvas.width = width;
    this.channels = channels;
    this.clear();
  }

  clear() {
    const ctx = this.canvas.getContext('2d');
    ctx.fillStyle = '#000';
    ctx.fillRect(0, 0, this.canvas.width, this.canvas.height);
  }

  listen() {
    let last = null;
    const at = (e) => {
      const r = this.canvas.getBoundingClientRect();
      return [(e.clientX - r.left) / r.width * this.canvas.width, (e.clientY - r.top) / r.height * this.canvas.height];
    };
    const stroke = (from, to) => {
      const ctx = this.canvas.getContext('2d');
      ctx.strokeStyle = ctx.fillStyle = '#fff';
      ctx.lineWidth = 2 * Number(this.brush.value) * this.canvas.width / 28;
      ctx.lineCap = 'round';
      ctx.beginPath();
      ctx.moveTo(from[0], from[1]);
      ctx.lineTo(to[0], to[1]);
      ctx.stroke();
    };
    this.canvas.addEventListener('pointerdown', (e) => {
      this.canvas.setPointerCapture(e.pointerId);
      last = at(e);
      stroke(last, last);
    });
    this.canvas.addEventListener('pointermove', (e) => {
      if (!last) return;
      const p = at(e);
      stroke(last, p);
      last = p;
    });
    const end = () => {
      if (!last) return;
      last = null;
      this.onChange();
    };
    this.canvas.addEventListener('pointerup', end);
    this.canvas.addEventListener('pointercancel', end);
    this.root.addEventListener('dragover', (e) => { e.preventDefault(); this.root.classList.add('dragging'); });
    this.root.addEventListener('dragleave', () => this.root.classList.remove('dragging'));
    this.root.addEventListener('drop', (e) => {
      e.preventDefault();
      this.root.classList.remove('dragging');
      if (e.dataTransfer.files[0]) this.load(e.dataTransfer.files[0]);
    });
  }

  // A picture file, scaled to the pad's size (a picture of that size keeps its pixels).
  async load(file) {
    const bitmap = await createImageBitmap(file, {colorSpaceConversion: 'none', premultiplyAlpha: 'none'});
    const ctx = this.canvas.getContext('2d');
    this.clear();
    ctx.imageSmoothingEnabled = bitmap.width !== this.canvas.width || bitmap.height !== this.canvas.height;
    ctx.drawImage(bitmap, 0, 0, this.canvas.width, this.canvas.height);
    this.onChange();
  }

  // The pixels, HWC: grey (R = G = B as drawn; else the luma) or RGB.
  pixels() {
    const {width, height} = this.canvas;
    const rgba = this.canvas.getContext('2d').getImageData(0, 0, width, height).data;
    const out = new Uint8Array(width * height * this.channels);
    for (let i = 0; i < width * height; i++) {
      const [r, g, b] = [rgba[4 * i], rgba[4 * i + 1], rgba[4 * i + 2]];
      if (this.channels === 3) out.set([r, g, b], 3 * i);
      else out[i] = r === g && g === b ? r : Math.round(0.299 * r + 0.587 * g + 0.114 * b);
    }
    return out;
  }

  // krause.v1's Image with the raw pixels.
  image() {
    return {raw: {pixels: toBase64(this.pixels()), height: this.canvas.height, width: this.canvas.width,
      channels: this.channels}};
  }

  async png() {
    return encodePng(this.canvas.width, this.canvas.height, this.channels, this.pixels());
  }
}

// One figure of a <dl>: its name and its value.
function addFigure(list, name, value) {
  const dt = document.createElement('dt');
  dt.textContent = name;
  const dd = document.createElement('dd');
  dd.textContent = value;
  list.append(dt, dd);
}

// ---------------------------------------------------------------------------------------------
// Models

const state = {models: [], inspection: null};

function model(name) {
  return state.models.find((m) => m.name === name);
}

function fillModelSelect(select, kind) {
  const keep = select.value;
  select.replaceChildren();
  for (const m of state.models.filter((m) => m.kind === kind)) select.add(new Option(m.name, m.name));
  const fallback = state.models.find((m) => m.kind === kind && m.isDefault);
  if (model(keep) && model(keep).kind === kind) select.value = keep;
  else if (fallback) select.value = fallback.name;
}

function fillClassSelect(select, m) {
  select.replaceChildren(new Option('(no class)', ''));
  if (!m || !m.classes) return;
  const labels = m.labels || [];
  for (let i = 0; i < m.classes; i++) select.add(new Option(labels[i] || String(i), labels[i] || String(i)));
}

function implementationText(m) {
  const check = (m.kernelChecks || []).find((c) => c.implementation === m.implementation);
  if (!check) return m.implementation || '';
  const diff = check.maxAbsDiff ? ` (${Number(check.maxAbsDiff).toExponential(1)})` : '';
  const weights = m.precision === 'bf16' ? ', bf16 (' + (m.linearKernels || 'oneDNN') + ')'
    : m.weightsDtype === 'bfloat16' ? ', bf16 weights' : '';
  const fallback = m.precisionFallback ? ' [bf16 asked; fp32: ' + m.precisionFallback + ']' : '';
  return `${m.implementation}, ${m.device || 'cpu'}${weights}${fallback}; check ${check.result}${diff}`;
}

function renderModels() {
  const body = $('model-table').tBodies[0];
  body.replaceChildren();
  for (const m of state.models) {
    const row = body.insertRow();
    const saved = m.flopsPerImageDenseEquivalent
      ? 1 - m.flopsPerImageExecuted / m.flopsPerImageDenseEquivalent : 0;
    const attention = m.attention === 'KRAUSE'
      ? `Krause (window ${m.window || 0}, top-k ${(m.topK || []).join('/')})` : 'softmax';
    const cells = [m.name + (m.isDefault ? ' (default)' : ''), m.kind.toLowerCase(), attention,
      m.version, implementationText(m), `${(100 * saved).toFixed(0)}%`];
    for (const text of cells) row.insertCell().textContent = text;
    const use = document.createElement('button');
    use.type = 'button';
    use.textContent = 'Use';
    use.setAttribute('aria-label', `Use ${m.name}`);
    use.addEventListener('click', () => pick(m));
    row.insertCell().appendChild(use);
    row.dataset.model = m.name;
  }
  markPicked();
}

// Makes `m` the model of every panel of its kind.
function pick(m) {
  const selects = m.kind === 'CLASSIFIER' ? ['classify-model']
    : ['generate-model', 'complete-model', 'score-model'];
  for (const id of selects) {
    $(id).value = m.name;
    $(id).dispatchEvent(new Event('change'));
  }
  markPicked();
}

function markPicked() {
  const picked = new Set(['classify-model', 'generate-model'].map((id) => $(id).value));
  for (const row of $('model-table').tBodies[0].rows) row.classList.toggle('picked', picked.has(row.dataset.model));
}

async function loadModels() {
  clearErrors($('models'));
  try {
    const reply = await rpc('ListModels', {});
    state.models = reply.models || [];
  } catch (e) {
    showError($('models'), $('models-error'), e);
    return;
  }
  fillModelSelect($('classify-model'), 'CLASSIFIER');
  for (const id of ['generate-model', 'complete-model', 'score-model']) fillModelSelect($(id), 'GENERATOR');
  renderModels();
  for (const id of ['classify-model', 'generate-model', 'complete-model', 'score-model'])
    $(id).dispatchEvent(new Event('change'));
  fetch('/v2', {headers: headers()}).then((r) => r.ok ? r.json() : null).then((meta) => {
    if (meta) $('server-info').textContent = `${meta.name} ${meta.version}`;
  }).catch(() => {});
}

// ---------------------------------------------------------------------------------------------
// Classify and Inspect

let classifyPad;
let classifyTimer = 0;

async function classify() {
  const section = $('classify');
  clearErrors(section);
  const name = $('classify-model').value;
  const image = classifyPad.image();
  try {
    const reply = await rpc('Classify', {model: name, images: [image], topK: 5});
    const top = reply.results[0].top || [];
    const bars = $('classify-bars');
    bars.replaceChildren();
    for (const c of top) {
      const li = document.createElement('li');
      const p = c.probability || 0;
      const label = document.createElement('span');
      label.textContent = c.label || String(c.index || 0);
      const bar = document.createElement('span');
      bar.className = 'bar';
      bar.style.width = `${(100 * p).toFixed(1)}%`;
      const value = document.createElement('span');
      value.className = 'value';
      value.textContent = `${(100 * p).toFixed(1)}%`;
      li.append(label, bar, value);
      bars.appendChild(li);
    }
    $('classify-label').textContent = top.length ? (top[0].label || String(top[0].index || 0)) : '';
  } catch (e) {
    showError(section, $('classify-error'), e);
    return;
  }
  await inspect(name, image);
}

async function inspect(name, image) {
  try {
    state.inspection = await rpc('Inspect', {model: name, image});
  } catch (e) {
    state.inspection = null;
    showError($('classify'), $('inspect-error'), e);
    return;
  }
  const ins = state.inspection;
  const layerSelect = $('inspect-layer');
  const keepLayer = layerSelect.value;
  layerSelect.replaceChildren();
  for (const l of ins.layers || []) layerSelect.add(new Option(String(l.layer || 0), String(l.layer || 0)));
  if ([...layerSelect.options].some((o) => o.value === keepLayer)) layerSelect.value = keepLayer;
  fillHeads();
  drawAttention();
}

function currentLayer() {
  const ins = state.inspection;
  return ins && (ins.layers || []).find((l) => String(l.layer || 0) === $('inspect-layer').value);
}

function fillHeads() {
  const select = $('inspect-head');
  const keep = select.value;
  select.replaceChildren();
  const layer = currentLayer();
  for (const h of (layer && layer.heads) || []) select.add(new Option(String(h.head || 0), String(h.head || 0)));
  if ([...select.options].some((o) => o.value === keep)) select.value = keep;
}

// The chosen head's kept keys for the chosen query: drawn over the image, listed, and the
// head's figures.
function drawAttention() {
  const canvas = $('inspect-canvas');
  const ctx = canvas.getContext('2d');
  ctx.imageSmoothingEnabled = false;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.drawImage(classifyPad.canvas, 0, 0, canvas.width, canvas.height);
  const ins = state.inspection;
  const layer = currentLayer();
  const head = layer && (layer.heads || []).find((h) => String(h.head || 0) === $('inspect-head').value);
  const figures = $('inspect-figures');
  figures.replaceChildren();
  $('inspect-keys').textContent = '';
  if (!ins || !head) return;
  const query = Number($('inspect-query').value);
  const at = (ins.queries || []).indexOf(query);
  const rows = ins.tokenRows || [], cols = ins.tokenColumns || [];
  const gh = ins.gridHeight || 1, gw = ins.gridWidth || 1;
  const cw = canvas.width / gw, ch = canvas.height / gh;
  const figure = (name, value) => addFigure(figures, name, value);
  figure('sigma', Number(head.sigma || 0).toFixed(3));
  figure('sink share', Number(head.sinkShare || 0).toFixed(3));
  figure('effective neighbours', Number(head.effectiveNeighbours || 0).toFixed(2));
  figure('mean distance', Number(head.meanDistance || 0).toFixed(2));
  figure('keys per query', String(layer.keysPerQuery || 0));
  if (at < 0) {
    figure('query', `${query} is not a token of this image (0 to ${(ins.tokens || 1) - 1})`);
    return;
  }
  const qa = head.queries[at];
  const keys = qa.keys || [], weights = qa.weights || [];
  const top = Math.max(...weights, 1e-9);
  keys.forEach((k, i) => {
    if (rows[k] < 0) return;  // the CLS or start token has no place on the image
    ctx.fillStyle = `rgba(255, 110, 20, ${(0.15 + 0.6 * (weights[i] || 0) / top).toFixed(3)})`;
    ctx.fillRect(cols[k] * cw, rows[k] * ch, cw, ch);
  });
  if (rows[query] >= 0) {
    ctx.strokeStyle = '#ffe14d';
    ctx.lineWidth = 3;
    ctx.strokeRect(cols[query] * cw + 1.5, rows[query] * ch + 1.5, cw - 3, ch - 3);
  }
  figure('query', rows[query] >= 0 ? `${query} (row ${rows[query]}, column ${cols[query]})` : `${query} (CLS)`);
  $('inspect-keys').textContent = keys.join(', ');
}

function queryAt(e) {
  const ins = state.inspection;
  if (!ins) return;
  const canvas = $('inspect-canvas');
  const r = canvas.getBoundingClientRect();
  const row = Math.floor((e.clientY - r.top) / r.height * (ins.gridHeight || 1));
  const col = Math.floor((e.clientX - r.left) / r.width * (ins.gridWidth || 1));
  const rows = ins.tokenRows || [], cols = ins.tokenColumns || [];
  for (let t = 0; t < rows.length; t++) {
    if (rows[t] === row && cols[t] === col) {
      $('inspect-query').value = t;
      drawAttention();
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Generate and Complete

// A setting as typed: empty is left out (the model's default), a number is sent as one, anything
// else as text (the server names it in its refusal).
function typed(input) {
  const text = input.value.trim();
  if (text === '') return undefined;
  if (/^\d+$/.test(text)) return new Digits(text);
  const n = Number(text);
  return Number.isFinite(n) && /^[-+0-9.eE]+$/.test(text) ? n : text;
}

function settingsOf(ids) {
  const s = {};
  for (const [name, id] of Object.entries(ids)) {
    const v = typed($(id));
    if (v !== undefined) s[name] = v;
  }
  return s;
}

// One streamed generation into `gallery`: a canvas per image, painted row by row; `prompt`
// (HWC pixels of the kept rows) is painted first. Resolves with the start event's seed.
async function runGeneration(name, settings, gallery, status, signal, prompt) {
  const m = model(name);
  const figures = [];
  let seed = null;
  const started = performance.now();
  await generateStream(name, settings, (ev) => {
    if (ev.type === 'start') {
      seed = ev.seed;
      gallery.replaceChildren();
      for (let i = 0; i < ev.num_images; i++) {
        const fig = document.createElement('figure');
        const canvas = document.createElement('canvas');
        canvas.width = ev.width;
        canvas.height = ev.height;
        canvas.dataset.image = String(i);
        canvas.setAttribute('role', 'img');
        canvas.setAttribute('aria-label', `image ${i}`);
        canvas.getContext('2d').fillRect(0, 0, ev.width, ev.height);
        if (prompt) paintRows(canvas, 0, ev.channels, prompt);
        const caption = document.createElement('figcaption');
        caption.textContent = `image ${i}`;
        fig.append(canvas, caption);
        gallery.appendChild(fig);
        figures.push({canvas, caption, channels: ev.channels});
      }
      status.textContent = `seed ${ev.seed}: sampling ${ev.num_images} image(s)…`;
    } else if (ev.type === 'row') {
      const f = figures[ev.image];
      if (f) paintRows(f.canvas, ev.row, f.channels, Uint8Array.from(ev.pixels));
    } else if (ev.type === 'progress') {
      status.textContent = `${ev.pixels_done} of ${ev.pixels_total} pixels` +
        (ev.waiting ? `, ${ev.waiting} image(s) waiting for a cache slot` : '');
    } else if (ev.type === 'image') {
      const f = figures[ev.image];
      if (!f) return;
      f.caption.replaceChildren(`seed ${ev.seed} `);
      const save = document.createElement('a');
      save.href = 'data:image/png;base64,' + ev.png;
      save.download = `${name}-seed${ev.seed}.png`;
      save.textContent = 'Save PNG';
      f.caption.appendChild(save);
    } else if (ev.type === 'done') {
      const ms = (performance.now() - started).toFixed(0);
      status.textContent = `seed ${ev.seed}: ${ev.images} image(s), ${ev.pixels_generated} pixels in ${ms} ms` +
        (m && m.attention === 'KRAUSE' ? `; ${(100 * (1 - ev.flops_executed / ev.flops_dense_equivalent)).toFixed(0)}% fewer FLOPs than dense attention` : '');
    }
  }, signal);
  return seed;
}

// The equivalent krause-client and curl commands of a generation (with the seed it drew).
function showCommands(name, settings, seed) {
  const s = Object.assign({}, settings, {seed: new Digits(String(seed))});
  const cli = ['krause-client generate', `--model ${name}`];
  const flag = {label: 'label', guidance: 'guidance', temperature: 'temperature', top_p: 'top_p',
    top_k: 'top_k', seed: 'seed', num_images: 'num'};
  for (const [k, v] of Object.entries(s)) {
    if (!flag[k]) continue;
    const text = v instanceof Digits ? v.text : String(v);
    cli.push(`--${flag[k]} ${/^[\w.+-]+$/.test(text) ? text : `'${text.replace(/'/g, "'\\''")}'`}`);
  }
  cli.push('--out samples');
  $('generate-cli').textContent = '# gRPC (--server: the --listen port)\n' + cli.join(' ');
  const auth = sessionStorage.getItem(TOKEN_KEY) ? ' -H "Authorization: Bearer $TOKEN"' : '';
  $('generate-curl').textContent = `# HTTP\ncurl -sN${auth} -d '${jsonBody(s).replace(/'/g, "'\\''")}' ` +
    `${location.origin}/v2/models/${encodeURIComponent(name)}/generate_stream`;
}

// The streams in flight, by panel ("generate", "complete"): what their Stop button aborts.
const streams = {};

// Runs one streamed generation of the panel `id` (its elements are id-run, id-stop, id-status,
// id-images, id-error): the buttons while it runs, Stop, and how it ended. Resolves with the
// call's seed (null when it did not finish).
async function streamPanel(id, name, settings, prompt) {
  const status = $(`${id}-status`);
  const stream = streams[id] = new AbortController();
  $(`${id}-run`).disabled = true;
  $(`${id}-stop`).disabled = false;
  status.textContent = 'starting…';
  try {
    return await runGeneration(name, settings, $(`${id}-images`), status, stream.signal, prompt);
  } catch (err) {
    if (err.name === 'AbortError') status.textContent = 'stopped: the server freed the images\' cache slots';
    else { status.textContent = ''; showError($(id), $(`${id}-error`), err); }
    return null;
  } finally {
    $(`${id}-run`).disabled = false;
    $(`${id}-stop`).disabled = true;
    delete streams[id];
  }
}

async function generate(e) {
  e.preventDefault();
  clearErrors($('generate'));
  const name = $('generate-model').value;
  const settings = settingsOf({guidance: 'generate-guidance', temperature: 'generate-temperature',
    top_p: 'generate-top-p', top_k: 'generate-top-k', seed: 'generate-seed', num_images: 'generate-num'});
  if ($('generate-class').value) settings.label = $('generate-class').value;
  const seed = await streamPanel('generate', name, settings);
  if (seed !== null) showCommands(name, settings, seed);
}

async function complete() {
  clearErrors($('complete'));
  const name = $('complete-model').value;
  const settings = settingsOf({prompt_rows: 'complete-rows', num_images: 'complete-num', seed: 'complete-seed'});
  if ($('complete-class').value) settings.label = $('complete-class').value;
  const pad = completePad;
  settings.prompt_png = toBase64(await pad.png());
  const rows = Math.max(0, Math.min(pad.canvas.height, Number($('complete-rows').value) || 0));
  await streamPanel('complete', name, settings, pad.pixels().subarray(0, rows * pad.canvas.width * pad.channels));
}

// ---------------------------------------------------------------------------------------------
// Score

async function score() {
  const section = $('score');
  clearErrors(section);
  const label = $('score-class').value;
  const image = scorePad.image();
  const request = {model: $('score-model').value, images: [image]};
  if (label) Object.assign(request, {images: [image, image], labels: ['', label]});
  const figures = $('score-figures');
  figures.replaceChildren();
  try {
    const reply = await rpc('Score', request);
    const add = (name, value) => addFigure(figures, name, value);
    add('without a class', `${Number(reply.bitsPerDim[0]).toFixed(4)} bits/dim`);
    if (label) add(`as ${label}`, `${Number(reply.bitsPerDim[1]).toFixed(4)} bits/dim`);
    add('subpixels scored', String(reply.scoredSubpixelsPerImage || 0));
  } catch (e) {
    showError(section, $('score-error'), e);
  }
}

// ---------------------------------------------------------------------------------------------
// The token

function askToken() {
  const dialog = $('token-dialog');
  if (!dialog.open) dialog.showModal();
}

function tokenClosed() {
  const dialog = $('token-dialog');
  if (dialog.returnValue !== 'save') return;
  const token = $('token-input').value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  $('token-input').value = '';
  loadModels();
}

// ---------------------------------------------------------------------------------------------

let completePad, scorePad;

function shapePad(pad, select) {
  const m = model(select.value);
  if (m) pad.setShape(m.height, m.width, m.channels);
}

function start() {
  classifyPad = new DrawPad($('classify-pad'), () => {
    clearTimeout(classifyTimer);
    classifyTimer = setTimeout(classify, 150);
  });
  completePad = new DrawPad($('complete-pad'));
  scorePad = new DrawPad($('score-pad'));
  $('classify-model').addEventListener('change', () => { shapePad(classifyPad, $('classify-model')); markPicked(); });
  $('generate-model').addEventListener('change', () => {
    fillClassSelect($('generate-class'), model($('generate-model').value));
    markPicked();
  });
  $('complete-model').addEventListener('change', () => {
    shapePad(completePad, $('complete-model'));
    fillClassSelect($('complete-class'), model($('complete-model').value));
  });
  $('score-model').addEventListener('change', () => {
    shapePad(scorePad, $('score-model'));
    fillClassSelect($('score-class'), model($('score-model').value));
  });
  $('classify-run').addEventListener('click', classify);
  $('inspect-layer').addEventListener('change', () => { fillHeads(); drawAttention(); });
  $('inspect-head').addEventListener('change', drawAttention);
  $('inspect-query').addEventListener('input', drawAttention);
  $('inspect-canvas').addEventListener('click', queryAt);
  $('generate-form').addEventListener('submit', generate);
  $('generate-stop').addEventListener('click', () => streams.generate && streams.generate.abort());
  $('complete-run').addEventListener('click', complete);
  $('complete-stop').addEventListener('click', () => streams.complete && streams.complete.abort());
  $('score-run').addEventListener('click', score);
  $('token-button').addEventListener('click', askToken);
  $('token-dialog').addEventListener('close', tokenClosed);
  loadModels();
}

start();
