#!/usr/bin/python3
"""A paper-size ViT-S/16 served, against the PyTorch forward a user writes, side by side.

  bench/paper_vit_bench.py [--bin build/bin] [--rounds 2] [--seconds 10] [--json F] [--text F]
                           [--baseline_bin OTHER/build/bin]

Writes the Krause ViT-S/16 and its softmax baseline (224x224x3, width 384, depth 12, heads 6,
1000 classes, radius 2, top-k 8; random weights in the official layout: krause-model-bench init),
serves each twice from one krause-server, in fp32 and in bf16 ("precision", model/precision.h),
and measures in rounds, alternating, on the same machine:
  served   krause-loadgen Classify of random images of the model's shape (--data synthetic), one
           image per call, at concurrency 1 and 8 (images/s);
  peer     bench/peer/torch_peer.py classify: the PyTorch forward (2 threads), fp32 and bf16
           (weights and inputs converted, as a user does for speed), at batch 1 and 8.
  baseline with --baseline_bin: the same models served in fp32 by another build's krause-server
           (an earlier commit's: "today's" figures), at the same concurrencies.
Reports the per-round figures and, per round, served / peer at c1 vs B1 and c8 vs B8 for each
precision, bf16 / fp32 served, and served / baseline. About 2 + 4 minutes per round with the
defaults (a minute more with a baseline).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, Progress, report, start_server, stop  # noqa: E402

MODELS = {"krause": "vit_s16", "softmax": "vit_s16_softmax"}
PRECISIONS = ("fp32", "bf16")
CONCURRENCY = (1, 8)


def loadgen(a, tmp, address, model, concurrency, tag):
    """Classify images/s of `model` at `concurrency` (krause-loadgen, synthetic images)."""
    out = os.path.join(tmp, tag + ".json")
    subprocess.run([f"{a.bin}/krause-loadgen", "--server", address, "--workload", "classify",
                    "--classify_model", model, "--data", "synthetic", "--concurrency",
                    str(concurrency), "--duration", str(a.seconds), "--warmup", "2",
                    "--progress=false", "--json", out], check=True, stdout=subprocess.DEVNULL)
    rep = json.load(open(out))
    if rep["errors_by_code"]["Classify"] != {"OK": rep["calls"]}:
        sys.exit(f"failed calls: {rep['errors_by_code']}")
    return rep["images_per_second"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=10, help="measured seconds per run")
    ap.add_argument("--baseline_bin", default="",
                    help="another build's bin folder: its krause-server serves the fp32 models "
                         "beside this one's")
    ap.add_argument("--json", default="")
    ap.add_argument("--text", default="")
    a = ap.parse_args()
    progress = Progress()
    per_round = len(MODELS) * len(PRECISIONS) * len(CONCURRENCY) * 2
    if a.baseline_bin:
        per_round += len(MODELS) * len(CONCURRENCY)
    steps = 2 + a.rounds * per_round
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        progress("the paper-size ViT-S/16 models (random weights)", steps)
        subprocess.run([os.path.join(ROOT, "bench", "paper_models.sh"), tmp, a.bin], check=True,
                       stderr=subprocess.DEVNULL)
        entries = [{"name": f"{m}-{p}", "checkpoint": os.path.join(tmp, f"{f}.safetensors"),
                    "precision": p, "max_batch_size": 8}
                   for m, f in MODELS.items() for p in PRECISIONS]
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump({"models": entries}, f)
        progress("krause-server (four entries, each through the kernel check)", steps)
        servers = []
        try:
            address = start_server(a.bin, os.path.join(tmp, "manifest.json"), servers)
            baseline = None
            if a.baseline_bin:  # fp32 only: an earlier build knows no "precision"
                entries = [{"name": f"{m}-fp32", "checkpoint": os.path.join(tmp, f"{ckpt}.safetensors"),
                            "max_batch_size": 8} for m, ckpt in MODELS.items()]
                with open(os.path.join(tmp, "baseline.json"), "w") as f:
                    json.dump({"models": entries}, f)
                baseline = start_server(a.baseline_bin, os.path.join(tmp, "baseline.json"), servers)
            info = json.loads(subprocess.run([f"{a.bin}/krause-client", "--server", address,
                                              "list", "--json"], check=True,
                                             capture_output=True, text=True).stdout)
            served_as = {m["name"]: (m.get("precision"), m.get("linear_kernels", ""))
                         for m in info}
            for r in range(1, a.rounds + 1):
                for model, file in MODELS.items():
                    for p in PRECISIONS:
                        for c in CONCURRENCY:
                            name = f"{model}-{p}"
                            progress(f"round {r}: served {name} at concurrency {c}", steps)
                            ips = loadgen(a, tmp, address, name, c, f"{name}-{c}-{r}")
                            runs.append({"round": r, "what": "served", "attention": model,
                                         "precision": p, "size": c,
                                         "served_precision": served_as[name][0],
                                         "linear_kernels": served_as[name][1],
                                         "images_per_second": ips})
                            b = c  # the peer's batch beside the server's concurrency
                            dtype = "float32" if p == "fp32" else "bfloat16"
                            progress(f"round {r}: PyTorch {model} {dtype} at batch {b}", steps)
                            peer = subprocess.run(
                                [sys.executable, os.path.join(ROOT, "bench", "peer",
                                                              "torch_peer.py"),
                                 "classify", "--checkpoint",
                                 os.path.join(tmp, f"{file}.safetensors"), "--batch", str(b),
                                 "--seconds", str(a.seconds), "--dtype", dtype],
                                check=True, capture_output=True, text=True)
                            pr = json.loads(peer.stdout.strip().splitlines()[-1])
                            runs.append({"round": r, "what": "peer", "attention": model,
                                         "precision": p, "size": b, "peer": pr["peer"],
                                         "images_per_second": pr["images_per_second"]})
                    if baseline:
                        for c in CONCURRENCY:
                            name = f"{model}-fp32"
                            progress(f"round {r}: baseline server, {name} at concurrency {c}",
                                     steps)
                            ips = loadgen(a, tmp, baseline, name, c, f"base-{name}-{c}-{r}")
                            runs.append({"round": r, "what": "baseline", "attention": model,
                                         "precision": "fp32", "size": c,
                                         "images_per_second": ips})
        finally:
            for server in servers:
                stop(server)
    lines = ["paper-size ViT-S/16 (224x224x3, random weights): krause-server Classify at "
             "concurrency c (krause-loadgen, one image a call) vs the PyTorch forward at batch B",
             f"{'round':>5} {'what':<7} {'attention':<8} {'precision':<9} {'c/B':>4} "
             f"{'images/s':>9}  served as"]
    for x in runs:
        served = (f"{x['served_precision']} ({x['linear_kernels']})" if x["what"] == "served"
                  else x.get("peer", "--baseline_bin's krause-server"))
        lines.append(f"{x['round']:>5} {x['what']:<7} {x['attention']:<8} {x['precision']:<9} "
                     f"{x['size']:>4} {x['images_per_second']:>9.2f}  {served}")

    def get(r, what, model, p, size):
        return next(x["images_per_second"] for x in runs if x["round"] == r and
                    x["what"] == what and x["attention"] == model and x["precision"] == p and
                    x["size"] == size)
    for r in range(1, a.rounds + 1):
        for model in MODELS:
            for p in PRECISIONS:
                ratios = [f"c{s}/B{s} {get(r, 'served', model, p, s) / get(r, 'peer', model, p, s):.2f}x"
                          for s in CONCURRENCY]
                lines.append(f"round {r}: {model} {p}: served / PyTorch {p}: " + ", ".join(ratios))
            ratios = [f"c{s} {get(r, 'served', model, 'bf16', s) / get(r, 'served', model, 'fp32', s):.2f}x"
                      for s in CONCURRENCY]
            lines.append(f"round {r}: {model}: served bf16 / served fp32: " + ", ".join(ratios))
            if a.baseline_bin:
                for p in PRECISIONS:
                    ratios = [f"c{s} {get(r, 'served', model, p, s) / get(r, 'baseline', model, 'fp32', s):.2f}x"
                              for s in CONCURRENCY]
                    lines.append(f"round {r}: {model}: served {p} / baseline fp32: "
                                 + ", ".join(ratios))
    report("\n".join(lines), runs, a.text, a.json)


if __name__ == "__main__":
    main()
