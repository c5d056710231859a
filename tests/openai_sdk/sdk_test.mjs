// Drives krause-serve's OpenAI Images API with the official SDK (tests/openai_sdk_test.py starts
// the server and checks what this prints): one JSON line per step on stdout, the PNGs into OUT.
//   BASE_URL=http://127.0.0.1:P/v1 TOKEN=t OUT=dir EDIT_IMAGE=a.png EDIT_MASK=m.png node sdk_test.mjs
import fs from "node:fs";
import path from "node:path";
import OpenAI, { toFile } from "openai";

const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.TOKEN });
const out = process.env.OUT;
const say = (o) => console.log(JSON.stringify(o));

// images.generate: n 2, seed 7, the class by its label.
const r = await client.images.generate({ model: "karm-fmnist", prompt: "Sneaker", n: 2, seed: 7 });
r.data.forEach((d, i) => fs.writeFileSync(path.join(out, `sdk-${i}.png`), Buffer.from(d.b64_json, "base64")));
say({ step: "generate", images: r.data.length, output_tokens: r.usage.output_tokens });

// A stream: partial images, then the completed one.
const stream = await client.images.generate({
  model: "karm-fmnist", prompt: "Bag", seed: 3, stream: true, partial_images: 2,
});
const events = [];
for await (const e of stream) {
  events.push({ type: e.type, index: e.partial_image_index ?? null });
  if (e.type === "image_generation.completed")
    fs.writeFileSync(path.join(out, "sdk-stream.png"), Buffer.from(e.b64_json, "base64"));
}
say({ step: "stream", events });

// images.edit: the image's rows above the mask's transparent band kept, the rest sampled.
const file = (name) => toFile(fs.readFileSync(process.env[name]), `${name}.png`, { type: "image/png" });
const edit = await client.images.edit({
  model: "karm-fmnist", prompt: "Sneaker", image: await file("EDIT_IMAGE"),
  mask: await file("EDIT_MASK"), seed: 7,
});
fs.writeFileSync(path.join(out, "sdk-edit.png"), Buffer.from(edit.data[0].b64_json, "base64"));
say({ step: "edit", images: edit.data.length, usage: edit.usage });

// Errors as the SDK's typed errors.
const failing = async (step, params, options) => {
  try {
    await client.images.generate(params, options);
    say({ step, error: null });
  } catch (e) {
    say({ step, error: e.constructor.name, status: e.status, param: e.param ?? null });
  }
};
await failing("unknown label", { model: "karm-fmnist", prompt: "Sneakers" });
await failing("wrong size", { model: "karm-fmnist", prompt: "Bag", size: "1024x1024" });
const anonymous = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: "not-a-token" });
try {
  await anonymous.images.generate({ model: "karm-fmnist", prompt: "Bag" });
  say({ step: "wrong token", error: null });
} catch (e) {
  say({ step: "wrong token", error: e.constructor.name, status: e.status });
}
