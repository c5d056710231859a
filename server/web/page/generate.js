// The web page's Generate panel: settings sent as typed, images painted row by row as
// generate_stream sends them, Stop, and the same request as krause-client and curl commands.
// Its streamed generation (streamPanel) serves the Complete panel too.

import {Digits, generateStream, hasToken, jsonBody} from './api.js';
import {paintRows} from './draw.js';
import {fillClassSelect, markPicked, model} from './models.js';
import {$, clearErrors, showError} from './page.js';

// A setting as typed: empty is left out (the model's default), a number is sent as one, anything
// else as text (the server names it in its refusal).
function typed(input) {
  const text = input.value.trim();
  if (text === '') return undefined;
  if (/^\d+$/.test(text)) return new Digits(text);
  const n = Number(text);
  return Number.isFinite(n) && /^[-+0-9.eE]+$/.test(text) ? n : text;
}

// The settings of the controls `ids` (setting -> element id) as typed, the empty ones left out.
export function settingsOf(ids) {
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
    top_k: 'top_k', seed: 'seed', num_images: 'num', priority: 'priority'};
  for (const [k, v] of Object.entries(s)) {
    if (!flag[k]) continue;
    const text = v instanceof Digits ? v.text : String(v);
    cli.push(`--${flag[k]} ${/^[\w.+-]+$/.test(text) ? text : `'${text.replace(/'/g, "'\\''")}'`}`);
  }
  cli.push('--out samples');
  $('generate-cli').textContent = '# gRPC (--server: the --listen port)\n' + cli.join(' ');
  const auth = hasToken() ? ' -H "Authorization: Bearer $TOKEN"' : '';
  $('generate-curl').textContent = `# HTTP\ncurl -sN${auth} -d '${jsonBody(s).replace(/'/g, "'\\''")}' ` +
    `${location.origin}/v2/models/${encodeURIComponent(name)}/generate_stream`;
}

// The streams in flight, by panel ("generate", "complete"): what their Stop button aborts.
const streams = {};

// Runs one streamed generation of the panel `id` (its elements are id-run, id-stop, id-status,
// id-images, id-error): the buttons while it runs, Stop, and how it ended. Resolves with the
// call's seed (null when it did not finish).
export async function streamPanel(id, name, settings, prompt) {
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
    top_p: 'generate-top-p', top_k: 'generate-top-k', seed: 'generate-seed', num_images: 'generate-num',
    priority: 'generate-priority'});
  if ($('generate-class').value) settings.label = $('generate-class').value;
  const seed = await streamPanel('generate', name, settings);
  if (seed !== null) showCommands(name, settings, seed);
}

// Stops the stream of the panel `id`, if one runs.
export function stopStream(id) {
  if (streams[id]) streams[id].abort();
}

export function initGenerate() {
  $('generate-model').addEventListener('change', () => {
    fillClassSelect($('generate-class'), model($('generate-model').value));
    markPicked();
  });
  $('generate-form').addEventListener('submit', generate);
  $('generate-stop').addEventListener('click', () => stopStream('generate'));
}
