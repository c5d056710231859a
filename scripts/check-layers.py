#!/usr/bin/env python3
"""The libraries by layer, checked (ctest `layering`).

Each file under model/ belongs to one layer (the table below, longest path prefix first); a file
may include headers of its own layer and of the layers below it only. The table must agree with
model/CMakeLists.txt: every source a krause_<layer> library compiles belongs to that layer, and
each library's PUBLIC krause_* dependencies are exactly the layer's direct dependencies. server/
is six libraries by role with the direction core <- edge <- {v1, oip, openai, web} <- server (the
assembly): server/core/ knows no protocol (no gRPC, HTTP, Prometheus or generated protobuf
header), the front ends (and the web page) never include each other, and the core may use every
model layer but the trainer.
client/ uses krause_util and the LibTorch-free server pieces it links (errors, status, raw_image).

Usage: scripts/check-layers.py [REPO]     Exit 0: consistent; 1: what is wrong, one line each.
       scripts/check-layers.py --self-test  checks that deliberate violations are reported.
"""
import os
import re
import sys

SELF_TEST = sys.argv[1:] == ["--self-test"]
ROOT = (sys.argv[1] if len(sys.argv) > 1 and not SELF_TEST
        else os.path.join(os.path.dirname(__file__), ".."))

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
    "model/precision": "models",
    "model/data/": "data",
    "model/engine/": "engine",
    "model/train/": "train",
    "model/eval/": "train",
    "server/core/": "server_core",
    "server/edge/": "server_edge",
    "server/v1/": "server_v1",
    "server/oip/": "server_oip",
    "server/openai/": "server_openai",
    "server/web/": "server_web",
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
    "server_core": ["engine", "data"],
    "server_edge": ["server_core"],
    "server_v1": ["server_edge"],
    "server_oip": ["server_edge"],
    "server_openai": ["server_edge"],
    "server_web": ["server_edge"],
    "server": ["server_v1", "server_oip", "server_openai", "server_web"],
    "client": ["util"],
}
# Headers of other layers a layer may include one by one (the clients link these LibTorch-free
# libraries: krause_errors, krause_status, krause_raw_image).
EXTRA = {
    "client": ["server/core/errors.h", "server/edge/status.h", "server/v1/raw_image.h"],
}
# Third-party headers a layer may not include (the core knows no protocol). The google.rpc
# messages are not a protocol: core/errors.cc stores a status's details in their encoding.
PROTOCOL_HEADERS = re.compile(r'\s*#\s*include\s+[<"]((grpc|grpcpp|prometheus|inference|krause/v1)/'
                              r'[^>"]*|boost/(beast|asio)[^>"]*|CivetServer\.h|civetweb\.h|'
                              r'(?!google/rpc/)[^>"]*\.pb\.h)[>"]')
FORBIDDEN = {"server_core": PROTOCOL_HEADERS}


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


def check_text(rel, lines, problems):
    """The include rules for one file (its path from the root and its lines)."""
    layer = layer_of(rel)
    if layer is None:
        problems.append(f"{rel}: in no layer (add it to scripts/check-layers.py)")
        return
    allowed = below(layer) | {layer}
    for n, line in enumerate(lines, 1):
        bad = FORBIDDEN.get(layer)
        if bad is not None and bad.match(line):
            problems.append(f"{rel}:{n}: layer {layer} includes {line.strip()[len('#include '):]}"
                            f" (a protocol's header; {layer} knows no protocol)")
            continue
        m = re.match(r'\s*#\s*include\s+"((model|server|client)/[^"]+)"', line)
        if not m:
            continue
        target = layer_of(m.group(1))
        if target not in allowed and m.group(1) not in EXTRA.get(layer, []):
            problems.append(f"{rel}:{n}: layer {layer} includes {m.group(1)} "
                            f"(layer {target}); {layer} may use {sorted(allowed)}")


if SELF_TEST:
    # Deliberate violations, each must be reported; the allowed includes must not be.
    cases = [
        ("server/oip/x.cc", '#include "server/v1/service.h"', True),
        ("server/v1/x.cc", '#include "server/oip/oip_infer.h"', True),
        ("server/core/x.cc", "#include <grpcpp/grpcpp.h>", True),
        ("server/core/x.h", "#include <CivetServer.h>", True),
        ("server/core/x.h", "#include <boost/beast/http.hpp>", True),
        ("server/core/x.h", '#include "krause/v1/krause.pb.h"', True),
        ("server/core/x.cc", '#include "server/edge/gate.h"', True),
        ("server/edge/x.cc", '#include "server/v1/requests.h"', True),
        ("server/core/x.cc", '#include "model/train/trainer.h"', True),
        ("server/oip/x.cc", '#include "server/edge/call_book.h"', False),
        ("server/web/x.cc", '#include "server/v1/connect_http.h"', True),
        ("server/oip/x.cc", '#include "server/core/registry.h"', False),
        ("server/v1/x.cc", "#include <grpcpp/grpcpp.h>", False),
        ("server/server.cc", '#include "server/oip/oip_http.h"', False),
        ("server/core/x.cc", '#include "model/engine/decode_engine.h"', False),
    ]
    failed = 0
    for rel, line, want in cases:
        got = []
        check_text(rel, [line], got)
        if bool(got) != want:
            failed += 1
            print(f"self-test: {rel}: {line}: {'not ' if want else ''}reported, should "
                  f"{'' if want else 'not '}be: {got}")
        elif got:
            print(f"self-test: reported as it should be: {got[0]}")
    print(f"check-layers self-test: {len(cases)} cases, {failed} wrong")
    sys.exit(1 if failed else 0)

problems = []
checked = 0
for top in ("model", "server", "client"):
    for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
        for name in sorted(names):
            if not name.endswith((".h", ".cc", ".cu", ".inc")) or name.endswith("_test.cc"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            with open(os.path.join(ROOT, rel)) as f:
                check_text(rel, f.read().split("\n"), problems)
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
