#!/usr/bin/env python3
"""The HTTP port's calls of two builds side by side (serving_bench.py --against drives only
krause.v1 over gRPC): on the bundled models, through this build's krause-loadgen,

  bench/http_against.py --against OTHER_BIN [--bin build/bin] [--rounds 3] [--duration 5]
                        [--json F] [--text F]

  rest-classify   the Open Inference Protocol's REST infer, one image a call, concurrency 32
                  (images/s) and 1 (p50 latency);
  http-generate   krause.v1's generate_stream over HTTP, one image a call, 16 streams
                  (images/s).
Each round starts this build's server, then OTHER_BIN's (the order alternating round by round,
so that a slow phase of the machine hits both), and runs every load on each. Reports each
figure's median per build and the ratio this / other.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import ROOT, Progress, free_port, median, stop, write_manifest

LOADS = [  # name, loadgen arguments, figure, better
    ("rest-classify-c32", ["--workload", "classify", "--concurrency", "32"], "images_per_second",
     "higher"),
    ("rest-classify-c1", ["--workload", "classify", "--concurrency", "1"], "p50_ms", "lower"),
    ("http-generate-c16", ["--workload", "generate", "--concurrency", "16"], "images_per_second",
     "higher"),
]


def start(server_bin, tmp):
    manifest = write_manifest(tmp)
    port_file = os.path.join(tmp, "port")
    if os.path.exists(port_file):
        os.remove(port_file)
    http = f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [f"{server_bin}/krause-server", "--manifest", manifest, "--listen", "127.0.0.1:0",
         "--port_file", port_file, "--http_listen", http, "--metrics_listen=", "--quiet"])
    for _ in range(600):
        if os.path.exists(port_file) and open(port_file).read().strip():
            return server, "127.0.0.1:" + open(port_file).read().strip(), http
        if server.poll() is not None:
            sys.exit("http_against: the server did not start")
        time.sleep(0.1)
    sys.exit("http_against: the server did not start in 60 s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--against", required=True, help="the other build's bin folder")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--json", default="")
    ap.add_argument("--text", default="")
    args = ap.parse_args()
    builds = {"this": os.path.abspath(args.bin), "other": os.path.abspath(args.against)}
    tmp = tempfile.mkdtemp(prefix="krause-http-against-")
    progress = Progress()
    steps = args.rounds * 2 * len(LOADS)
    results = {b: {name: [] for name, *_ in LOADS} for b in builds}
    records = {}
    for r in range(args.rounds):
        order = ["this", "other"] if r % 2 == 0 else ["other", "this"]
        for b in order:
            server, grpc, http = start(builds[b], tmp)
            try:
                for name, load, figure, _ in LOADS:
                    progress(f"round {r + 1} of {args.rounds}, {b} build: {name}", steps)
                    out = os.path.join(tmp, f"{b}-{r}-{name}.json")
                    subprocess.run(
                        [f"{builds['this']}/krause-loadgen", "--server", grpc, "--protocol",
                         "http", "--http_server", http, "--duration", str(args.duration),
                         "--warmup", "1", "--json", out, "--progress=false"] + load,
                        check=True, stdout=subprocess.DEVNULL)
                    rec = json.load(open(out))
                    records[f"{b}_r{r}_{name}"] = rec
                    # latency_seconds: by rpc ("Classify" for a REST infer of a classifier).
                    value = (rec[figure] if figure != "p50_ms" else
                             1e3 * next(iter(rec["latency_seconds"].values()))["p50"])
                    results[b][name].append(value)
            finally:
                stop(server)
    lines = [f"this build: {builds['this']}", f"other build: {builds['other']}",
             f"{args.rounds} rounds, medians; ratio = this / other", "",
             "| figure | this | other | ratio | better |", "|---|---|---|---|---|"]
    compare = {}
    for name, _, figure, better in LOADS:
        t, o = median(results["this"][name]), median(results["other"][name])
        compare[name] = {"this": t, "other": o, "ratio": t / o, "better": better,
                         "this_rounds": results["this"][name],
                         "other_rounds": results["other"][name]}
        lines.append(f"| {name} ({figure}) | {t:.4g} | {o:.4g} | {t / o:.3f} | {better} |")
    text = "\n".join(lines)
    print(text)
    if args.text:
        with open(args.text, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"compare": compare, "records": records, "cores": os.cpu_count()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
