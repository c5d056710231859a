// The web page's calls to the server (docs/web.md), all on this port:
//   POST /krause.v1.KrauseService/{ListModels,Classify,Score,Inspect}   krause.v1 over Connect
//   POST /v2/models/{model}/generate_stream                             Server-Sent Events
//   GET  /v2                                                            server metadata
// Every call carries the bearer token the page keeps for this tab; an answer of 401 calls the
// handler given to onUnauthorized (app.js: the token dialog). Nothing here touches the page.

const TOKEN_KEY = 'krause-serve-token';
let unauthorized = () => {};

export class ServerError extends Error {
  constructor(message, status, code) {
    super(message);
    this.status = status;  // HTTP status (0: no answer)
    this.code = code || '';
  }
}

// What to do when the server asks for a token (a 401).
export function onUnauthorized(handler) {
  unauthorized = handler;
}

// Keeps `token` for this tab (empty: forgets it).
export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function hasToken() {
  return Boolean(sessionStorage.getItem(TOKEN_KEY));
}

function headers(extra) {
  const h = Object.assign({}, extra);
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) h.Authorization = 'Bearer ' + token;
  return h;
}

// The error of an answer that is not 200 (a 401 asks for a token).
function failure(response, message, code) {
  if (response.status === 401) unauthorized();
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
export async function rpc(method, request) {
  const response = await send(`/krause.v1.KrauseService/${method}`, {
    method: 'POST',
    headers: headers({'Content-Type': 'application/json'}),
    body: JSON.stringify(request),
  });
  const body = await response.json().catch(() => null);
  if (!response.ok) throw failure(response, body && body.message, body && body.code);
  return body;
}

// The server's metadata (GET /v2: name and version), or null when it does not answer 200.
export function serverInfo() {
  return fetch('/v2', {headers: headers()}).then((r) => r.ok ? r.json() : null);
}

// A number the page must not round (a 64-bit seed): written into the JSON as typed.
export class Digits {
  constructor(text) { this.text = text; }
}

// A JSON object whose Digits values are written as bare numbers.
export function jsonBody(settings) {
  const parts = Object.entries(settings).map(([k, v]) =>
    JSON.stringify(k) + ':' + (v instanceof Digits ? v.text : JSON.stringify(v)));
  return '{' + parts.join(',') + '}';
}

// A generation streamed as Server-Sent Events: onEvent gets each event (start, row, progress,
// image, done) as it comes; an `error` event rejects with the server's message. `signal` stops
// it (the server cancels the images when the connection closes).
export async function generateStream(model, settings, onEvent, signal) {
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
