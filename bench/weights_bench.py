#!/usr/bin/python3
"""The same model served with fp32 and with bf16 linear weights ("weights_dtype"), side by side.

  bench/weights_bench.py [--bin build/bin] [--rounds 2] [--seconds 20] [--json F] [--text F]

Makes a paper-size MNIST KARM (d 256, 12 layers, 8 heads, W 128, k 96; one training step of
krause-train on 16 Fashion-MNIST images: the speed does not depend on the weights' values), serves
it twice from one krause-server (one manifest entry per dtype, so both share the machine), and
runs krause-loadgen's Generate at one stream against each in turn, --rounds times alternating.
Reports images/s, the image's p50 latency and the first pixel's p50 per run, and bf16 / fp32 per
round. About 2 minutes with the defaults.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, Progress, report, start_server, stop  # noqa: E402

CONFIG = ["--model", "karm", "--width", "256", "--depth", "12", "--heads", "8", "--window", "128",
          "--top_k", "96"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=20, help="measured seconds per run")
    ap.add_argument("--json", default="")
    ap.add_argument("--text", default="")
    a = ap.parse_args()
    progress = Progress()
    steps = 2 + 2 * a.rounds
    with tempfile.TemporaryDirectory() as tmp:
        progress("a paper-size MNIST KARM (krause-train, one step)", steps)
        subprocess.run([f"{a.bin}/krause-train", *CONFIG, "--epochs", "1", "--train_limit", "16",
                        "--test_limit", "16", "--batch", "16", "--samples", "2", "--fp16=false",
                        "--quiet", "--out", tmp], check=True, stdout=subprocess.DEVNULL)
        names = {"float32": "karm-fp32", "bfloat16": "karm-bf16"}
        manifest = {"models": [{"name": n, "checkpoint": os.path.join(tmp, "model.safetensors"),
                                "max_sequences": 8, "weights_dtype": w} for w, n in names.items()]}
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        progress("krause-server (both entries pass the kernel check)", steps)
        servers = []
        try:
            address = start_server(a.bin, os.path.join(tmp, "manifest.json"), servers, 120)
            runs = []
            for r in range(a.rounds):
                for w, n in names.items():
                    progress(f"round {r + 1}: Generate, one stream, {w} weights", steps)
                    out = os.path.join(tmp, f"{n}-{r}.json")
                    subprocess.run([f"{a.bin}/krause-loadgen", "--server", address,
                                    "--workload", "generate", "--generate_model", n,
                                    "--concurrency", "1", "--duration", str(a.seconds),
                                    "--warmup", "2", "--progress=false", "--json", out],
                                   check=True, stdout=subprocess.DEVNULL)
                    rep = json.load(open(out))
                    if rep["errors_by_code"]["Generate"] != {"OK": rep["calls"]}:
                        sys.exit(f"failed calls: {rep['errors_by_code']}")
                    runs.append({"round": r + 1, "weights": w, "calls": rep["calls"],
                                 "images_per_second": rep["images_per_second"],
                                 "image_p50_seconds": rep["latency_seconds"]["Generate"]["p50"],
                                 "first_pixel_p50_seconds":
                                     rep["generate_first_pixel_seconds"]["p50"]})
        finally:
            for server in servers:
                stop(server)
    lines = ["paper MNIST KARM served by krause-server, Generate at one stream (krause-loadgen)",
             f"{'round':>5} {'weights':<9} {'calls':>5} {'images/s':>9} {'image p50 s':>12} "
             f"{'first pixel p50 ms':>19}"]
    for x in runs:
        lines.append(f"{x['round']:>5} {x['weights']:<9} {x['calls']:>5} "
                     f"{x['images_per_second']:>9.3f} {x['image_p50_seconds']:>12.3f} "
                     f"{1e3 * x['first_pixel_p50_seconds']:>19.2f}")
    for r in range(1, a.rounds + 1):
        f32, b16 = (next(x for x in runs if x["round"] == r and x["weights"] == w)
                    for w in ("float32", "bfloat16"))
        lines.append(f"round {r}: bf16 / fp32 weights images/s "
                     f"{b16['images_per_second'] / f32['images_per_second']:.2f}x")
    report("\n".join(lines), runs, a.text, a.json)


if __name__ == "__main__":
    main()
