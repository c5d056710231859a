#!/usr/bin/env python3
"""The libraries by layer, checked (ctest `layering`).

Each file under model/ belongs to one layer (the table below, longest path prefix first); a file
may include headers of its own layer and of the layers below it only. The table must agree with
model/CMakeLists.txt: every source a krause_<layer> library compiles belongs to that layer, and
each library's PUBLIC krause_* dependencies are exactly the layer's direct dependencies. server/
may use every layer but the trainer; client/ only krause_util (no LibTorch).

Usage: scripts/check-layers.py [REPO]   Exit 0: consistent; 1: what is wrong, one line each.
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")

# Path prefixes (without extension) -> layer.
FILES = {
    "model/util/files": "util",
    "model/util/status_macros": "util",
    "model/util/help": "util",
    "model/util/png_pixels": "util",
    "model/data/idx": "util",
    "model/util/tensor_checks": "tensor_util",
    "model/util/threads": "tensor_util",
    "model/util/huge_pages": "tensor_util",
    "model/attention/": "attention",
    "model/checkpoint/": "models",
    "model/nn/": "models",
    "model/attention_kind": "models",
    "model/vit": "models",
    "model/pixel_model": "models",
    "model/kv_cache": "models",
    "model/loader": "models",
    "model/data/": "data",
    "model/engine/": "engine",
    "model/train/": "train",
    "model/eval/": "train",
    "server/": "server",
    "client/": "client",
}
# Direct dependencies (the PUBLIC krause_* links in model/CMakeLists.txt).
DEPS = {
    "util": [],
    "tensor_util": ["util"],
    "attention": ["tensor_util"],
    "models": ["attention"],
    "data": ["tensor_util"],
    "engine": ["models"],
    "train": ["engine", "data"],
    "server": ["engine", "data"],
    "client": ["util"],
}


def layer_of(path):
    stem = os.path.splitext(path)[0]
    best = None
    for prefix, layer in FILES.items():
        if stem.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return best[1] if best else None


def below(layer):
    seen, todo = set(), [layer]
    while todo:
        for d in DEPS[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


problems = []
checked = 0
for top in ("model", "server", "client"):
    for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
        for name in sorted(names):
            if not name.endswith((".h", ".cc", ".cu", ".inc")) or name.endswith("_test.cc"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            layer = layer_of(rel)
            if layer is None:
                problems.append(f"{rel}: in no layer (add it to scripts/check-layers.py)")
                continue
            allowed = below(layer) | {layer}
            with open(os.path.join(ROOT, rel)) as f:
                for n, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+"(model/[^"]+)"', line)
                    if not m:
                        continue
                    target = layer_of(m.group(1))
                    if target not in allowed:
                        problems.append(f"{rel}:{n}: layer {layer} includes {m.group(1)} "
                                        f"(layer {target}); {layer} may use {sorted(allowed)}")
            checked += 1

# The table against model/CMakeLists.txt.
cmake = open(os.path.join(ROOT, "model", "CMakeLists.txt")).read()
libs = {}
for m in re.finditer(r"add_library\(krause_(\w+)\s+([^)]*)\)", cmake):
    name, body = m.group(1), m.group(2).split()
    if body and body[0] == "INTERFACE":
        continue
    libs[name] = [s for s in body if s.endswith((".cc", ".cu"))]
for m in re.finditer(r"target_sources\(krause_(\w+)\s+PRIVATE\s+([^)]*)\)", cmake):
    libs.setdefault(m.group(1), []).extend(m.group(2).split())
for name, sources in sorted(libs.items()):
    if name not in DEPS:
        problems.append(f"model/CMakeLists.txt: library krause_{name} is no layer of the table")
        continue
    for src in sources:
        layer = layer_of("model/" + src)
        if layer != name:
            problems.append(f"model/CMakeLists.txt: krause_{name} compiles {src} (layer {layer})")
    links = re.search(r"target_link_libraries\(krause_" + name + r"\s+PUBLIC\s+([^)]*?)(PRIVATE|\))",
                      cmake)
    public = sorted(x[len("krause_"):] for x in (links.group(1).split() if links else [])
                    if x.startswith("krause_"))
    if public != sorted(DEPS[name]):
        problems.append(f"model/CMakeLists.txt: krause_{name} links {public} publicly; "
                        f"the layer's dependencies are {sorted(DEPS[name])}")

for p in problems:
    print(p)
print(f"check-layers: {checked} files, {len(libs)} libraries, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
