#!/usr/bin/env python3
"""Tenants sharing one server (issue 62): two tenants, each a krause-loadgen process with its own
token, on one krause-server of this build serving the bundled Krause ViT (docs/serving.md,
Tenants). Classify: tenant B at concurrency 1 alone, tenant A at --flood alone, then both at once
(A starts first; B is measured while A runs), every figure from the same run; then A alone at
each --batch_sizes (a server per size) to show what a smaller batch costs the flood.

  bench/tenants_bench.py [--bin build/bin] [--duration 8] [--flood 128]
                         [--batch_sizes 16,32,64] [--json F] [--text F]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import ROOT, Progress, report, stop, write_manifest

TOKENS = "tok-a tenant=team-a\ntok-b tenant=team-b\n"


def loadgen(bin_dir, server, token, concurrency, duration, out):
    return subprocess.Popen(
        [f"{bin_dir}/krause-loadgen", "--server", server, "--token", token, "--workload",
         "classify", "--concurrency", str(concurrency), "--duration", str(duration), "--warmup",
         "1", "--json", out, "--progress=false"], stdout=subprocess.DEVNULL)


def figures(path):
    r = json.load(open(path))
    lat = r["latency_seconds"]["Classify"]
    errors = sum(n for code, n in r["errors_by_code"]["Classify"].items() if code != "OK")
    return {"images_per_second": r["images_per_second"], "p50_ms": lat["p50"] * 1e3,
            "p99_ms": lat["p99"] * 1e3, "errors": errors}


def serve(bin_dir, tmp, name, batch_size, servers):
    manifest = write_manifest(tmp)
    m = json.load(open(manifest))
    m["models"][0]["max_batch_size"] = batch_size
    path = os.path.join(tmp, f"{name}.json")
    json.dump(m, open(path, "w"))
    tokens = os.path.join(tmp, "tokens")
    open(tokens, "w").write(TOKENS)
    port_file = path + ".port"
    if os.path.exists(port_file):
        os.remove(port_file)
    server = subprocess.Popen(
        [f"{bin_dir}/krause-server", "--manifest", path, "--listen", "127.0.0.1:0",
         "--port_file", port_file, "--http_listen", "", "--metrics_listen", "",
         "--auth_tokens", tokens, "--quiet"])
    servers.append(server)
    deadline = time.time() + 300
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if server.poll() is not None or time.time() > deadline:
            sys.exit(f"{bin_dir}/krause-server did not start")
        time.sleep(0.2)
    return server, "127.0.0.1:" + open(port_file).read().strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--duration", type=float, default=8)
    ap.add_argument("--flood", type=int, default=128)
    ap.add_argument("--batch_sizes", default="16,32,64")
    ap.add_argument("--json", default="")
    ap.add_argument("--text", default="")
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin)
    tmp = tempfile.mkdtemp(prefix="krause-tenants-bench-")
    sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    progress = Progress()
    steps = 3 + len(sizes)
    runs = {}
    servers = []
    try:
        server, addr = serve(bin_dir, tmp, "shared", 64, servers)
        progress("classify: B alone at concurrency 1", steps)
        out = os.path.join(tmp, "b-alone.json")
        loadgen(bin_dir, addr, "tok-b", 1, args.duration, out).wait()
        runs["b_alone"] = figures(out)
        progress(f"classify: A alone at concurrency {args.flood}", steps)
        out = os.path.join(tmp, "a-alone.json")
        loadgen(bin_dir, addr, "tok-a", args.flood, args.duration, out).wait()
        runs["a_alone"] = figures(out)
        progress("classify: both (B measured while A floods)", steps)
        a_out, b_out = os.path.join(tmp, "a-both.json"), os.path.join(tmp, "b-both.json")
        a = loadgen(bin_dir, addr, "tok-a", args.flood, args.duration + 3, a_out)
        time.sleep(1.5)
        loadgen(bin_dir, addr, "tok-b", 1, args.duration, b_out).wait()
        a.wait()
        runs["a_both"], runs["b_both"] = figures(a_out), figures(b_out)
        stop(server)
        for b in sizes:
            progress(f"classify: A alone, max_batch_size {b}", steps)
            server, addr = serve(bin_dir, tmp, f"m{b}", b, servers)
            out = os.path.join(tmp, f"a-batch{b}.json")
            loadgen(bin_dir, addr, "tok-a", args.flood, args.duration, out).wait()
            runs[f"a_batch{b}"] = figures(out)
            stop(server)
    finally:
        for s in servers:
            stop(s)
    r = runs
    lines = [
        f"Classify, krause-vit-fmnist (max_batch_size 64), two tenants of equal weight, "
        f"{args.duration:g} s each, one run", "",
        "| | images/s | p50 ms | p99 ms | errors |", "|---|---|---|---|---|"]
    for key, what in (("b_alone", "B alone, concurrency 1"),
                      ("b_both", f"B beside A's flood (concurrency {args.flood})"),
                      ("a_alone", f"A alone, concurrency {args.flood}"),
                      ("a_both", "A beside B")):
        f = r[key]
        lines.append(f"| {what} | {f['images_per_second']:.0f} | {f['p50_ms']:.1f} | "
                     f"{f['p99_ms']:.1f} | {f['errors']} |")
    lines += ["", f"A beside B / A alone: {r['a_both']['images_per_second'] / r['a_alone']['images_per_second']:.3f}", "",
              f"A alone at concurrency {args.flood} by max_batch_size:", "",
              "| max_batch_size | images/s | p50 ms |", "|---|---|---|"]
    for b in sizes:
        f = r[f"a_batch{b}"]
        lines.append(f"| {b} | {f['images_per_second']:.0f} | {f['p50_ms']:.1f} |")
    report("\n".join(lines), runs, args.text, args.json)


if __name__ == "__main__":
    main()
