// What the web page's panels share: $ (an element by id), errors shown next to the control they
// name (the server's message as it is: the page holds no rule of its own), and the figures of a
// <dl>.

export const $ = (id) => document.getElementById(id);

// Clears a panel's errors: its alert line and the marks on its controls.
export function clearErrors(section) {
  section.querySelectorAll('.field-error').forEach((e) => e.remove());
  section.querySelectorAll('[aria-invalid]').forEach((e) => e.removeAttribute('aria-invalid'));
  section.querySelectorAll('.error').forEach((e) => { e.textContent = ''; });
}

// Shows `error` in `section`: under the control whose data-field is the setting the server's
// message starts with ("guidance must be a number"), else in `box` (beside the button pressed).
export function showError(section, box, error) {
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

// One figure of a <dl>: its name and its value.
export function addFigure(list, name, value) {
  const dt = document.createElement('dt');
  dt.textContent = name;
  const dd = document.createElement('dd');
  dd.textContent = value;
  list.append(dt, dd);
}
