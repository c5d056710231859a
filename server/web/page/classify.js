// The web page's Classify panel: the pad's image classified as drawn (Classify, the top classes
// as bars), and what attention keeps (Inspect): a layer's head's kept keys for a query patch,
// drawn over the image, with the head's figures.

import {rpc} from './api.js';
import {DrawPad} from './draw.js';
import {markPicked, shapePad} from './models.js';
import {$, addFigure, clearErrors, showError} from './page.js';

let classifyPad;
let classifyTimer = 0;
// The last Inspect reply (null: none, or it failed).
let inspection = null;

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
    inspection = await rpc('Inspect', {model: name, image});
  } catch (e) {
    inspection = null;
    showError($('classify'), $('inspect-error'), e);
    return;
  }
  const ins = inspection;
  const layerSelect = $('inspect-layer');
  const keepLayer = layerSelect.value;
  layerSelect.replaceChildren();
  for (const l of ins.layers || []) layerSelect.add(new Option(String(l.layer || 0), String(l.layer || 0)));
  if ([...layerSelect.options].some((o) => o.value === keepLayer)) layerSelect.value = keepLayer;
  fillHeads();
  drawAttention();
}

function currentLayer() {
  const ins = inspection;
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
  const ins = inspection;
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
  const ins = inspection;
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

export function initClassify() {
  classifyPad = new DrawPad($('classify-pad'), () => {
    clearTimeout(classifyTimer);
    classifyTimer = setTimeout(classify, 150);
  });
  $('classify-model').addEventListener('change', () => { shapePad(classifyPad, $('classify-model')); markPicked(); });
  $('classify-run').addEventListener('click', classify);
  $('inspect-layer').addEventListener('change', () => { fillHeads(); drawAttention(); });
  $('inspect-head').addEventListener('change', drawAttention);
  $('inspect-query').addEventListener('input', drawAttention);
  $('inspect-canvas').addEventListener('click', queryAt);
}
