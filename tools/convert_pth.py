#!/usr/bin/env python3
"""Converts a PyTorch state_dict (.pth, as the Krause authors release them) into krause-serve's
safetensors checkpoint with the model config in its __metadata__.

Tensor names are kept: krause-serve's models use the authors' state_dict layout (see
docs/operator.md section 4), so conversion is by name. Derived buffers (local_mask_buffer,
valid_i_indices, valid_j_indices) are dropped. Floating tensors are stored as F32 (or --fp16).

Usage:
  python3 tools/convert_pth.py checkpoint.pth --config config.json -o model.safetensors

config.json is the model config as krause-serve reads it, e.g. for a Krause ViT
  {"model": "vit", "attention": "krause", "image_size": 32, "channels": 3, "patch": 4,
   "width": 384, "depth": 12, "heads": 6, "mlp": 1536, "classes": 10, "radius": 1,
   "metric": "manhattan", "top_k": 2, "cls": true}
and for KARM
  {"model": "arm", "attention": "krause", "height": 28, "width_px": 28, "channels": 1,
   "width": 256, "depth": 12, "heads": 8, "window": 128, "top_k": 96, "start_token": false}
(official KARM checkpoints have no start token). Needs PyTorch (Debian: python3-torch).
"""
import argparse
import json
import struct
import sys

import torch

DERIVED = ("local_mask_buffer", "valid_i_indices", "valid_j_indices")
DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}


def load_state_dict(path):
    obj = torch.load(path, map_location="cpu")
    # Accept a bare state_dict or the common wrappers around one.
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise SystemExit(f"{path}: not a state_dict (got {type(obj).__name__})")
    out = {}
    for name, t in obj.items():
        if name.startswith("module."):  # DataParallel / DDP prefix
            name = name[len("module."):]
        if name.split(".")[-1] in DERIVED:
            continue
        if not torch.is_tensor(t):
            raise SystemExit(f"{path}: entry {name} is not a tensor")
        out[name] = t
    return out


def to_bytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the bits
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors.items():
        if t.dtype not in DTYPES:
            raise SystemExit(f"tensor {name}: dtype {t.dtype} cannot be stored")
        data = to_bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * ((8 - (len(head) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pth", help="a state_dict saved with torch.save")
    ap.add_argument("--config", required=True, help="model config JSON file")
    ap.add_argument("-o", "--output", required=True, help="output .safetensors")
    ap.add_argument("--fp16", action="store_true", help="store floating tensors as F16")
    args = ap.parse_args(argv)
    with open(args.config) as f:
        config = json.load(f)
    tensors = load_state_dict(args.pth)
    if args.fp16:
        tensors = {k: (v.half() if v.is_floating_point() else v) for k, v in tensors.items()}
    else:
        tensors = {k: (v.float() if v.is_floating_point() else v) for k, v in tensors.items()}
    write_safetensors(args.output, tensors, {"config": json.dumps(config), "converted_from": args.pth})
    print(f"wrote {len(tensors)} tensors to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
