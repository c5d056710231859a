// The web page's Score panel: bits per dimension of the pad's image under a generator (Score),
// without a class and, where one is chosen, as that class.

import {rpc} from './api.js';
import {DrawPad} from './draw.js';
import {fillClassSelect, model, shapePad} from './models.js';
import {$, addFigure, clearErrors, showError} from './page.js';

let scorePad;

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

export function initScore() {
  scorePad = new DrawPad($('score-pad'));
  $('score-model').addEventListener('change', () => {
    shapePad(scorePad, $('score-model'));
    fillClassSelect($('score-class'), model($('score-model').value));
  });
  $('score-run').addEventListener('click', score);
}
