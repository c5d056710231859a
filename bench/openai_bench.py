#!/usr/bin/env python3
"""OpenAI's Images API against krause.v1's generate_stream on one server of this build (issue
63's target: the API's throughput at 16 concurrent calls at least 90% of generate_stream's):
karm-fmnist, one image a call, through this build's krause-loadgen (--protocol openai and
--protocol http), protocol by protocol within each of --rounds rounds (the order alternating).

  bench/openai_bench.py [--bin build/bin] [--rounds 3] [--duration 5] [--concurrency 16]
                        [--json F] [--text F]
"""
import argparse
import json
import os
import subprocess
import tempfile

from common import ROOT, Progress, median, stop
from http_against import start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--json", default="")
    ap.add_argument("--text", default="")
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin)
    tmp = tempfile.mkdtemp(prefix="krause-openai-bench-")
    progress = Progress()
    protocols = ["http", "openai"]
    figures = {p: [] for p in protocols}
    records = {}
    server, grpc, http = start(bin_dir, tmp)
    try:
        for r in range(args.rounds):
            for p in (protocols if r % 2 == 0 else protocols[::-1]):
                progress(f"round {r + 1} of {args.rounds}: {p}", args.rounds * 2)
                out = os.path.join(tmp, f"{p}-{r}.json")
                subprocess.run(
                    [f"{bin_dir}/krause-loadgen", "--server", grpc, "--protocol", p,
                     "--http_server", http, "--workload", "generate", "--concurrency",
                     str(args.concurrency), "--duration", str(args.duration), "--warmup", "1",
                     "--json", out, "--progress=false"], check=True, stdout=subprocess.DEVNULL)
                rec = json.load(open(out))
                records[f"{p}_r{r}"] = rec
                figures[p].append(rec["images_per_second"])
    finally:
        stop(server)
    stream, api = median(figures["http"]), median(figures["openai"])
    text = "\n".join([
        f"karm-fmnist, one image a call, {args.concurrency} concurrent calls, {args.rounds} rounds "
        "(medians)", "",
        "| protocol | images/s | rounds |", "|---|---|---|",
        f"| generate_stream (krause.v1 over HTTP) | {stream:.1f} | "
        + ", ".join(f"{x:.1f}" for x in figures["http"]) + " |",
        f"| /v1/images/generations (OpenAI) | {api:.1f} | "
        + ", ".join(f"{x:.1f}" for x in figures["openai"]) + " |", "",
        f"OpenAI / generate_stream: {api / stream:.3f} (target: at least 0.90)"])
    print(text)
    if args.text:
        open(args.text, "w").write(text + "\n")
    if args.json:
        json.dump({"figures": figures, "ratio": api / stream, "records": records},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
