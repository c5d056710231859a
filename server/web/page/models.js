// The web page's Models panel: the table of the models this server serves (ListModels), Use
// (a model for every panel of its kind), and the models the other panels read: their selects,
// their classes and the pads' shapes.

import {rpc, serverInfo} from './api.js';
import {$, clearErrors, showError} from './page.js';

// ListModels's models, as the server last listed them.
const state = {models: []};

// The listed model called `name` (undefined when there is none).
export function model(name) {
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

export function fillClassSelect(select, m) {
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

export function markPicked() {
  const picked = new Set(['classify-model', 'generate-model'].map((id) => $(id).value));
  for (const row of $('model-table').tBodies[0].rows) row.classList.toggle('picked', picked.has(row.dataset.model));
}

export async function loadModels() {
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
  serverInfo().then((meta) => {
    if (meta) $('server-info').textContent = `${meta.name} ${meta.version}`;
  }).catch(() => {});
}

// Gives `pad` the shape of the model chosen in `select`.
export function shapePad(pad, select) {
  const m = model(select.value);
  if (m) pad.setShape(m.height, m.width, m.channels);
}
