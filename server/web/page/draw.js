// The web page's drawing: pixels to a PNG (its own encoder and CRC-32: a canvas's own PNG would be
// RGBA, the models take grey or RGB), base64, rows painted onto a canvas as a generation streams
// them, and DrawPad, the drawing pad the Classify, Complete and Score panels take images from.

// Base64 of bytes, and back.
export function toBase64(bytes) {
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
export async function encodePng(width, height, channels, pixels) {
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
export function paintRows(canvas, y0, channels, pixels) {
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
export class DrawPad {
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
