#!/usr/bin/env python3
"""Converter parity: PyTorch itself writes state_dicts of Krause ViT, ViT, KARM and ARM (an
independent PyTorch implementation of the official architectures as docs/operator.md, section 4,
describes them), tools/convert_pth.py converts them, and krause-forward's logits must match
PyTorch's forward of the same weights (max error <= 1e-4 of the logit scale).

Usage: convert_test.py KRAUSE_FORWARD_BINARY REPO_ROOT. Exits 77 (skipped) without PyTorch.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("PyTorch is not installed (Debian: python3-torch): skipped")
    sys.exit(77)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", e
        b, en = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(body[b:en]), dtype=torch.float32).reshape(e["shape"])
    return out


class KrauseAttention(nn.Module):
    """Dense masked Krause attention, as the authors' code computes it."""

    def __init__(self, d, heads, mask, top_k, log_sigma_shape, sigma):
        super().__init__()
        self.heads, self.top_k = heads, top_k
        self.W_q, self.W_k, self.W_v, self.out_proj = (nn.Linear(d, d) for _ in range(4))
        self.log_sigma = nn.Parameter(torch.full(log_sigma_shape, math.log(sigma)))
        self.register_buffer("local_mask_buffer", mask)  # derived data, dropped by the converter

    def forward(self, x):
        b, n, d = x.shape
        split = lambda t: t.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.W_q(x)), split(self.W_k(x)), split(self.W_v(x))
        d2 = ((q.unsqueeze(3) - k.unsqueeze(2)) ** 2).sum(-1)
        sigma = self.log_sigma.exp().reshape(-1, 1, 1) if self.log_sigma.dim() else self.log_sigma.exp()
        s = (-d2 / (2 * sigma ** 2)).masked_fill(~self.local_mask_buffer, float("-inf"))
        top = s.topk(min(self.top_k, n), dim=-1)
        w = torch.softmax(top.values, -1)
        attn = torch.zeros_like(s).scatter(-1, top.indices, w)
        return self.out_proj((attn @ v).transpose(1, 2).reshape(b, n, d))


class SoftmaxAttention(nn.Module):
    def __init__(self, d, heads, names, causal):
        super().__init__()
        self.heads, self.names, self.causal = heads, names, causal
        for name in names:
            setattr(self, name, nn.Linear(d, d))
        self.out_proj = nn.Linear(d, d)

    def forward(self, x):
        b, n, d = x.shape
        split = lambda t: t.view(b, n, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = (split(getattr(self, name)(x)) for name in self.names)
        s = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        if self.causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return self.out_proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, n, d))


def grid_mask(g, radius):  # manhattan, with CLS at 0
    n = g * g + 1
    m = torch.zeros(n, n, dtype=torch.bool)
    m[0, :] = True
    m[:, 0] = True
    for i in range(g * g):
        for j in range(g * g):
            if abs(i // g - j // g) + abs(i % g - j % g) <= radius:
                m[i + 1, j + 1] = True
    return m


class ViT(nn.Module):
    """Post-LN ViT in the official KViT layout; krause=False gives the softmax baseline."""

    def __init__(self, cfg, krause):
        super().__init__()
        d, g = cfg["width"], cfg["image_size"] // cfg["patch"]
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(cfg["channels"], d, cfg["patch"], cfg["patch"])
        self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, g * g + 1, d) * 0.5)
        ks = torch.linspace(cfg["top_k"], 2 * cfg["top_k"], cfg["depth"]).round().int().tolist()
        self.blocks = nn.ModuleList()
        for l in range(cfg["depth"]):
            blk = nn.Module()
            blk.attention = (KrauseAttention(d, cfg["heads"], grid_mask(g, cfg["radius"]), ks[l], (), 1.7)
                             if krause else SoftmaxAttention(d, cfg["heads"], ["W_q", "W_k", "W_v"], False))
            blk.norm1, blk.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            blk.ffn = nn.Sequential(nn.Linear(d, cfg["mlp"]), nn.GELU(), nn.Dropout(0.0), nn.Linear(cfg["mlp"], d))
            self.blocks.append(blk)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg["classes"])

    def forward(self, img):
        x = self.patch_embed.proj(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk.norm1(x + blk.attention(x))
            x = blk.norm2(x + blk.ffn(x))
        return self.head(self.norm(x)[:, 0])


class ARM(nn.Module):
    """Pre-LN autoregressive pixel model in the official KARM / ARM layout (no start token)."""

    def __init__(self, cfg, krause):
        super().__init__()
        d, n = cfg["width"], cfg["height"] * cfg["width_px"] * cfg["channels"]
        self.token_emb, self.pos_emb = nn.Embedding(256, d), nn.Embedding(n, d)
        i = torch.arange(n)
        window = (i.view(-1, 1) >= i.view(1, -1)) & (i.view(-1, 1) - i.view(1, -1) < cfg["window"])
        self.layers = nn.ModuleList()
        for _ in range(cfg["depth"]):
            blk = nn.Module()
            blk.ln1, blk.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            blk.attn = (KrauseAttention(d, cfg["heads"], window, cfg["top_k"], (cfg["heads"], 1, 1), 2.5)
                        if krause else SoftmaxAttention(d, cfg["heads"], ["q_proj", "k_proj", "v_proj"], True))
            blk.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.layers.append(blk)
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256)

    def forward(self, x):
        t = x.shape[1]
        h = self.token_emb(x) + self.pos_emb(torch.arange(t))
        for blk in self.layers:
            if isinstance(blk.attn, KrauseAttention):  # the mask covers the full length
                blk.attn.local_mask_buffer = blk.attn.local_mask_buffer[:t, :t]
            h = h + blk.attn(blk.ln1(h))
            h = h + blk.mlp(blk.ln2(h))
        return self.head(self.ln_f(h))


def main():
    forward_bin, root = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.join(root, "tools"))
    import convert_pth

    torch.manual_seed(0)
    vit_cfg = {"model": "vit", "image_size": 8, "channels": 1, "patch": 2, "width": 32, "depth": 3,
               "heads": 4, "mlp": 48, "classes": 10, "radius": 1, "metric": "manhattan", "top_k": 2,
               "cls": True}
    arm_cfg = {"model": "arm", "height": 4, "width_px": 5, "channels": 1, "width": 32, "depth": 2,
               "heads": 4, "window": 6, "top_k": 3, "start_token": False}
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("krause_vit", ViT(vit_cfg, True), dict(vit_cfg, attention="krause"), "images",
                  torch.randn(3, 1, 8, 8)),
                 ("vit", ViT(vit_cfg, False), dict(vit_cfg, attention="softmax"), "images",
                  torch.randn(3, 1, 8, 8)),
                 ("karm", ARM(arm_cfg, True), dict(arm_cfg, attention="krause"), "pixels",
                  torch.randint(0, 256, (3, 19))),
                 ("arm", ARM(arm_cfg, False), dict(arm_cfg, attention="softmax"), "pixels",
                  torch.randint(0, 256, (3, 19)))]
        for name, model, cfg, input_name, x in cases:
            model.eval()
            pth = os.path.join(tmp, name + ".pth")
            torch.save(model.state_dict(), pth)  # what the authors release
            with open(os.path.join(tmp, name + ".json"), "w") as f:
                json.dump(cfg, f)
            out_model = os.path.join(tmp, name + ".safetensors")
            convert_pth.main([pth, "--config", os.path.join(tmp, name + ".json"), "-o", out_model])
            inp = os.path.join(tmp, name + "-in.safetensors")
            convert_pth.write_safetensors(inp, {input_name: x}, {})
            outp = os.path.join(tmp, name + "-out.safetensors")
            subprocess.run([forward_bin, out_model, inp, outp], check=True)
            ours = read_safetensors(outp)["logits"]
            with torch.no_grad():
                theirs = model(x)
            err = (ours - theirs).abs().max().item() / theirs.abs().max().item()
            ok = ours.shape == theirs.shape and err <= 1e-4
            failures += not ok
            print(f"{name}: logits {tuple(ours.shape)}, max error {err:.2e} of the scale: {'ok' if ok else 'FAIL'}")
    print(f"{4 - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
