// The web page's Complete panel: the pad's top rows as the prompt (sent as a PNG the page encodes
// itself, so the pixels are exactly those drawn), the rest sampled, streamed as Generate's are.

import {DrawPad, toBase64} from './draw.js';
import {settingsOf, stopStream, streamPanel} from './generate.js';
import {fillClassSelect, model, shapePad} from './models.js';
import {$, clearErrors} from './page.js';

let completePad;

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

export function initComplete() {
  completePad = new DrawPad($('complete-pad'));
  $('complete-model').addEventListener('change', () => {
    shapePad(completePad, $('complete-model'));
    fillClassSelect($('complete-class'), model($('complete-model').value));
  });
  $('complete-run').addEventListener('click', complete);
  $('complete-stop').addEventListener('click', () => stopStream('complete'));
}
