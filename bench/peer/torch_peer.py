#!/usr/bin/python3
"""The PyTorch peer of the serving benchmark: the bundled models run from Python, in PyTorch
eager, the way a user would write them in a short script.

  torch_peer.py sample   --checkpoint models/karm_fmnist.safetensors --batch 64 --images 64
  torch_peer.py classify --checkpoint models/krause_vit_fmnist.safetensors --batch 32 --seconds 5
  torch_peer.py sample   --random paper-mnist --batch 64      (the paper's MNIST KARM, random weights)
  torch_peer.py classify --checkpoint vit_s16.safetensors --batch 8 --dtype bfloat16

sample:   a KV-cache sampler with a static batch: every sequence of the batch at the same
          position; KARM keeps a ring of the last W keys/values per layer and computes the
          RBF scores, top-k and softmax over the window; the softmax ARM keeps the whole prefix.
classify: one forward over a batch of Fashion-MNIST test images. The Krause ViT as the authors
          compute it: dense N x N RBF scores, the grid neighbourhood as a mask, torch.topk over
          the masked rows, softmax over the kept; the softmax ViT with plain dense attention.
          --accuracy N also reports the top-1 accuracy on the first N test images, so the
          benchmark can check that the peer computes the model the server serves. A model whose
          input is not 28x28x1 (a paper-size ViT-S/16 from krause-model-bench init) classifies
          random pixels of its shape. --dtype bfloat16 runs the forward as a PyTorch user does for
          speed: weights and inputs converted to bfloat16 (oneDNN's bf16 kernels: AMX or
          AVX512-BF16 where the CPU has them).

Threads: torch.set_num_threads(--threads) and, unless the caller set it, OPENBLAS_NUM_THREADS=1
(the server's own setting). Output: one JSON object on stdout (--json FILE writes it there too).
Uses only Python's standard library and Debian's python3-torch.
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402  (after the BLAS setting, which is read when torch loads)
import torch.nn.functional as F  # noqa: E402

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def load_safetensors(path):
    """Tensors as fp32 (floating point) and the metadata's config."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = memoryview(data)[8 + n:]
    tensors = {}
    for name, spec in header.items():
        begin, end = spec["data_offsets"]
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=DTYPES[spec["dtype"]])
        t = t.reshape(spec["shape"])
        tensors[name] = t.float() if t.is_floating_point() else t
    return tensors, json.loads(meta["config"])


PAPER_MNIST = {"attention": "krause", "height": 28, "width_px": 28, "channels": 1, "width": 256,
               "depth": 12, "heads": 8, "window": 128, "top_k": 96, "start_token": True}


def random_karm(cfg, seed):
    """Random weights in the official layout (as krause-generate-bench makes them)."""
    g = torch.Generator().manual_seed(seed)
    d, n = cfg["width"], cfg["height"] * cfg["width_px"] * cfg["channels"]

    def tn(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).clamp(-0.04, 0.04)

    p = {"token_emb.weight": tn(256, d), "pos_emb.weight": tn(n, d), "start_token": tn(d)}
    for l in range(cfg["depth"]):
        b = f"layers.{l}."
        for name, out, inp in [("attn.W_q", d, d), ("attn.W_k", d, d), ("attn.W_v", d, d),
                               ("attn.out_proj", d, d), ("mlp.0", 4 * d, d), ("mlp.2", d, 4 * d)]:
            p[b + name + ".weight"] = tn(out, inp)
            p[b + name + ".bias"] = torch.zeros(out)
        for ln_name in ("ln1", "ln2"):
            p[b + ln_name + ".weight"] = torch.ones(d)
            p[b + ln_name + ".bias"] = torch.zeros(d)
        p[b + "attn.log_sigma"] = torch.full((cfg["heads"], 1, 1), math.log(2.5))
    p["ln_f.weight"], p["ln_f.bias"] = torch.ones(d), torch.zeros(d)
    p["head.weight"], p["head.bias"] = tn(256, d), torch.zeros(256)
    return p


def lin(p, name, x):
    return F.linear(x, p[name + ".weight"], p[name + ".bias"])


def ln(p, name, x):
    return F.layer_norm(x, (x.shape[-1],), p[name + ".weight"], p[name + ".bias"], 1e-5)


# ------------------------------------------------------------------------------------------
# Generators


def sample(p, cfg, batch, seed):
    """One static batch of `batch` images, [batch, N] uint8, with a KV cache."""
    krause = cfg["attention"] == "krause"
    n = cfg["height"] * cfg["width_px"] * cfg["channels"]
    d, heads, depth = cfg["width"], cfg["heads"], cfg["depth"]
    dh = d // heads
    window = cfg.get("window", n) if krause else n
    top_k = cfg.get("top_k", window)
    start = cfg.get("start_token", True)
    gen = torch.Generator().manual_seed(seed)
    names = ("W_q", "W_k", "W_v") if krause else ("q_proj", "k_proj", "v_proj")
    # q, k and v from one matrix product per layer
    qkv_w = [torch.cat([p[f"layers.{l}.attn.{m}.weight"] for m in names]) for l in range(depth)]
    qkv_b = [torch.cat([p[f"layers.{l}.attn.{m}.bias"] for m in names]) for l in range(depth)]
    keys = [torch.zeros(batch, heads, window, dh) for _ in range(depth)]
    values = [torch.zeros(batch, heads, window, dh) for _ in range(depth)]
    # KARM scores in the bias form (q.k - |k|^2 / 2) / sigma^2: the bias stored beside each key
    bias = [torch.zeros(batch, heads, window) for _ in range(depth)]
    scale = [torch.exp(-2 * p[f"layers.{l}.attn.log_sigma"].view(1, heads, 1)) if krause
             else torch.tensor(1 / math.sqrt(dh)) for l in range(depth)]
    out = torch.zeros(batch, n, dtype=torch.uint8)
    prev = None
    first = 0
    if not start:  # the first subpixel is not modelled: drawn uniformly
        out[:, 0] = torch.randint(0, 256, (batch,), generator=gen, dtype=torch.uint8)
        prev = out[:, 0].long()
        first = 1
    for t in range(first, n):
        pos = t if start else t - 1  # the model position that predicts subpixel t
        if start and t == 0:
            x = p["start_token"].expand(batch, d)
        else:
            x = p["token_emb.weight"][prev]
        x = x + p["pos_emb.weight"][pos]
        slot = pos % window
        valid = min(pos + 1, window)
        for l in range(depth):
            a = f"layers.{l}."
            h = ln(p, a + "ln1", x)
            q, k, v = F.linear(h, qkv_w[l], qkv_b[l]).view(batch, 3, heads, dh).unbind(1)
            keys[l][:, :, slot] = k
            values[l][:, :, slot] = v
            kc, vc = keys[l][:, :, :valid], values[l][:, :, :valid]
            s = (kc * q.unsqueeze(2)).sum(-1)  # [B, H, valid]
            if krause:
                bias[l][:, :, slot] = (k * k).sum(-1) * -0.5
                s = (s + bias[l][:, :, :valid]) * scale[l]
                top, idx = s.topk(min(top_k, valid), dim=-1)
                w = torch.softmax(top, dim=-1)
                kept = vc.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, dh))
                o = (w.unsqueeze(-1) * kept).sum(2)
            else:
                o = (torch.softmax(s * scale[l], dim=-1).unsqueeze(-1) * vc).sum(2)
            x = x + lin(p, a + "attn.out_proj", o.reshape(batch, d))
            h = ln(p, a + "ln2", x)
            x = x + lin(p, a + "mlp.2", F.gelu(lin(p, a + "mlp.0", h)))
        logits = lin(p, "head", ln(p, "ln_f", x))
        # inverse-CDF sampling (torch.multinomial costs more than a whole layer here)
        cdf = torch.softmax(logits, -1).cumsum(-1)
        u = torch.rand(batch, 1, generator=gen) * cdf[:, -1:]
        prev = torch.searchsorted(cdf, u).squeeze(1).clamp_max(255)
        out[:, t] = prev.to(torch.uint8)
    return out


# ------------------------------------------------------------------------------------------
# Classifiers


def grid_mask(grid, radius, metric, cls):
    """[N, N] bool: key j is in the neighbourhood of query i."""
    r = torch.arange(grid).repeat_interleave(grid)
    c = torch.arange(grid).repeat(grid)
    dr = (r.view(-1, 1) - r.view(1, -1)).abs()
    dc = (c.view(-1, 1) - c.view(1, -1)).abs()
    m = (torch.maximum(dr, dc) if metric == "chebyshev" else dr + dc) <= radius
    if not cls:
        return m
    n = grid * grid + 1
    full = torch.ones(n, n, dtype=torch.bool)  # the CLS row sees all, every patch sees CLS
    full[1:, 1:] = m
    return full


def top_k_schedule(k, depth):
    return [int(round(k + (l / (depth - 1) if depth > 1 else 0.0) * k)) for l in range(depth)]


def classify(p, cfg, images, mask):
    """images [B, C, H, W] float in [0, 1] -> probabilities [B, classes]."""
    if cfg.get("mean"):
        mean = torch.tensor(cfg["mean"]).view(1, -1, 1, 1)
        std = torch.tensor(cfg["std"]).view(1, -1, 1, 1)
        images = (images - mean) / std
    images = images.to(p["patch_embed.proj.weight"].dtype)  # --dtype bfloat16: the model's
    b, d, heads = images.shape[0], cfg["width"], cfg["heads"]
    dh = d // heads
    x = F.conv2d(images, p["patch_embed.proj.weight"], p["patch_embed.proj.bias"],
                 stride=cfg["patch"]).flatten(2).transpose(1, 2)
    if cfg.get("cls", True):
        x = torch.cat([p["cls_token"].expand(b, 1, d), x], 1)
    x = x + p["pos_embed"]
    n = x.shape[1]
    krause = cfg["attention"] == "krause"
    ks = top_k_schedule(cfg.get("top_k", 1), cfg["depth"])
    for l in range(cfg["depth"]):
        a = f"blocks.{l}.attention."
        q = lin(p, a + "W_q", x).view(b, n, heads, dh).transpose(1, 2)
        k = lin(p, a + "W_k", x).view(b, n, heads, dh).transpose(1, 2)
        v = lin(p, a + "W_v", x).view(b, n, heads, dh).transpose(1, 2)
        if krause:
            inv = torch.exp(-2 * p[a + "log_sigma"]).view(1, 1, 1, 1) / 2
            s = -torch.cdist(q, k) ** 2 * inv  # dense [B, H, N, N]
            s = s.masked_fill(~mask, float("-inf"))
            top, idx = s.topk(ks[l], dim=-1)
            w = torch.softmax(top, dim=-1)  # masked entries that made the top-k weigh 0
            kept = v.unsqueeze(2).expand(-1, -1, n, -1, -1).gather(
                3, idx.unsqueeze(-1).expand(-1, -1, -1, -1, dh))
            o = (w.unsqueeze(-1) * kept).sum(3)
        else:
            o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), -1) @ v
        o = lin(p, a + "out_proj", o.transpose(1, 2).reshape(b, n, d))
        x = ln(p, f"blocks.{l}.norm1", x + o)
        f = lin(p, f"blocks.{l}.ffn.3", F.gelu(lin(p, f"blocks.{l}.ffn.0", x)))
        x = ln(p, f"blocks.{l}.norm2", x + f)
    x = ln(p, "norm", x)
    pooled = x[:, 0] if cfg.get("cls", True) else x.mean(1)
    return torch.softmax(lin(p, "head", pooled), -1)


def fashion_mnist_test(count):
    path = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
    with gzip.open(path, "rb") as f:
        data = f.read()
    _, num, rows, cols = struct.unpack(">IIII", data[:16])
    count = min(count, num)
    px = torch.frombuffer(bytearray(data[16:16 + count * rows * cols]), dtype=torch.uint8)
    return px.view(count, 1, rows, cols)


def fashion_mnist_labels(count):
    path = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
    with gzip.open(path, "rb") as f:
        data = f.read()
    (_, num) = struct.unpack(">II", data[:8])
    count = min(count, num)
    return torch.frombuffer(bytearray(data[8:8 + count]), dtype=torch.uint8).long()


def timed(fn, min_seconds, min_runs):
    """Runs fn until both limits are reached; returns the per-run seconds."""
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median(v):
    s = sorted(v)
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["sample", "classify"])
    ap.add_argument("--checkpoint", default="")
    ap.add_argument("--random", default="", choices=["", "paper-mnist"],
                    help="sample: random weights of this config instead of a checkpoint")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--images", type=int, default=0,
                    help="sample: images to make, in static batches (default: one batch)")
    ap.add_argument("--seconds", type=float, default=3.0, help="classify: time to measure")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="classify: the forward's dtype (weights and inputs)")
    ap.add_argument("--accuracy", type=int, default=0,
                    help="classify: also the top-1 accuracy on the first N test images (a check "
                         "that the peer computes the model the checkpoint's card describes)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.random:
        if args.what != "sample":
            ap.error("--random is for sample")
        cfg = PAPER_MNIST
        p = random_karm(cfg, args.seed)
    elif args.checkpoint:
        p, cfg = load_safetensors(args.checkpoint)
    else:
        ap.error("--checkpoint or --random is required")
    result = {"peer": "pytorch " + torch.__version__, "what": args.what, "batch": args.batch,
              "threads": torch.get_num_threads(),
              "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
              "checkpoint": args.random or os.path.basename(args.checkpoint),
              "attention": cfg["attention"]}
    with torch.inference_mode():
        if args.what == "sample":
            images = max(args.images, args.batch)
            batches = (images + args.batch - 1) // args.batch
            sample(p, cfg, args.batch, args.seed)  # warm-up (allocator, first-call costs)
            t0 = time.perf_counter()
            made = []
            for i in range(batches):
                made.append(sample(p, cfg, args.batch, args.seed + 1 + i))
                print(f"\rsample: batch {i + 1}/{batches}", end="", file=sys.stderr)
            seconds = time.perf_counter() - t0
            print("", file=sys.stderr)
            made = torch.cat(made)
            result.update(images=batches * args.batch, seconds=seconds,
                          images_per_second=batches * args.batch / seconds,
                          mean_pixel=float(made.float().mean()))
        else:
            mask = grid_mask(cfg["image_size"] // cfg["patch"], cfg.get("radius", 1),
                             cfg.get("metric", "manhattan"), cfg.get("cls", True))
            shape = (cfg.get("channels", 1), cfg["image_size"], cfg["image_size"])
            if shape == (1, 28, 28):
                pool = fashion_mnist_test(max(args.batch, 64)).float() / 255.0
            else:
                g = torch.Generator().manual_seed(args.seed)
                pool = torch.randint(0, 256, (args.batch, *shape), generator=g).float() / 255.0
            batch = pool[:args.batch]
            dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
            if dtype != torch.float32:
                p = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in p.items()}
                batch = batch.to(dtype)
            result.update(dtype=args.dtype, image_shape=list(shape))
            classify(p, cfg, batch, mask)  # warm-up
            times = timed(lambda: classify(p, cfg, batch, mask), args.seconds, 5)
            result.update(runs=len(times), median_seconds=median(times),
                          images_per_second=args.batch / median(times))
            if args.accuracy:
                images = fashion_mnist_test(args.accuracy).float() / 255.0
                labels = fashion_mnist_labels(args.accuracy)
                correct = 0
                for i in range(0, len(labels), 250):
                    pred = classify(p, cfg, images[i:i + 250], mask).argmax(-1)
                    correct += int((pred == labels[i:i + 250]).sum())
                result.update(accuracy_images=len(labels), accuracy=correct / len(labels))
    text = json.dumps(result)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
