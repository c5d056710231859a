// krause-serve's web page (docs/web.md): models, classify with attention, generate row by row,
// complete, score. It holds no rule of its own: every setting goes to the server as typed, and
// what the server refuses is shown with the server's message next to the control it names.
//
// The server, all on this port (api.js makes the calls):
//   POST /krause.v1.KrauseService/{ListModels,Classify,Score,Inspect}   krause.v1 over Connect
//   POST /v2/models/{model}/generate_stream                             Server-Sent Events
//   GET  /v2                                                            server metadata
//
// The page is ES modules, loaded as they are (no bundler): this entry wires the panels and the
// token dialog. api.js calls the server; draw.js holds the PNG encoder, the canvas helpers and
// the drawing pad; page.js what the panels share; models.js, classify.js, generate.js,
// complete.js and score.js are one panel each.

import {onUnauthorized, setToken} from './api.js';
import {initClassify} from './classify.js';
import {initComplete} from './complete.js';
import {initGenerate} from './generate.js';
import {loadModels} from './models.js';
import {$} from './page.js';
import {initScore} from './score.js';

// ---------------------------------------------------------------------------------------------
// The token

function askToken() {
  const dialog = $('token-dialog');
  if (!dialog.open) dialog.showModal();
}

function tokenClosed() {
  const dialog = $('token-dialog');
  if (dialog.returnValue !== 'save') return;
  setToken($('token-input').value.trim());
  $('token-input').value = '';
  loadModels();
}

// ---------------------------------------------------------------------------------------------

function start() {
  onUnauthorized(askToken);
  initClassify();
  initGenerate();
  initComplete();
  initScore();
  $('token-button').addEventListener('click', askToken);
  $('token-dialog').addEventListener('close', tokenClosed);
  loadModels();
}

start();
