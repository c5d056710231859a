#!/usr/bin/env python3
"""Tenants sharing one server (issue 62): two tenants, each a krause-loadgen process with its own
token, on one krause-server of this build serving the bundled models (docs/serving.md,
Tenants).

Classify (--scenario classify): tenant B at concurrency 1 alone, tenant A at --flood alone, then
both at once (one krause-loadgen --tenants, one measured window), every figure from the same
run; a priority-1 call at a time beside the same tenant's priority-0 flood; then A alone at each
--batch_sizes (a server per size) to show what a smaller batch costs the flood.

Generate (--scenario generate): the bundled KARM with --slots cache slots; A streams one image
per call at concurrency --gen_a, B four images per call at --gen_b, so that both want more slots
than the server has. A alone, then A and B started together (measured over the same window), with
equal weights and with A's weight 3: each tenant's images/s and share, and the total against A
alone.

  bench/tenants_bench.py [--scenario classify,generate] [--bin build/bin] [--duration 8]
                         [--flood 128] [--batch_sizes 16,32,64] [--precision bf16] [--slots 64]
                         [--gen_a 64] [--gen_b 16] [--json F] [--text F]
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


def loadgen(bin_dir, server, token, concurrency, duration, out, workload="classify",
            images=1, warmup=1):
    return subprocess.Popen(
        [f"{bin_dir}/krause-loadgen", "--server", server, "--token", token, "--workload",
         workload, "--concurrency", str(concurrency), "--duration", str(duration), "--warmup",
         str(warmup), "--generate_images", str(images), "--json", out, "--progress=false"],
        stdout=subprocess.DEVNULL)


def loadgen_tenants(bin_dir, server, spec, duration, out, warmup=1):
    """One krause-loadgen process running every tenant of `spec` (--tenants) over one window."""
    return subprocess.Popen(
        [f"{bin_dir}/krause-loadgen", "--server", server, "--tenants", spec, "--duration",
         str(duration), "--warmup", str(warmup), "--json", out, "--progress=false"],
        stdout=subprocess.DEVNULL)


def figures(path, rpc="Classify", tenant=None):
    r = json.load(open(path))
    if tenant is not None:
        r = r["tenants"][tenant]
    lat = r["latency_seconds"][rpc]
    errors = sum(n for code, n in r["errors_by_code"][rpc].items() if code != "OK")
    return {"images_per_second": r["images_per_second"], "p50_ms": lat["p50"] * 1e3,
            "p99_ms": lat["p99"] * 1e3, "errors": errors}


def serve(bin_dir, tmp, name, batch_size, servers, tokens_text=TOKENS, slots=None,
          precision=""):
    manifest = write_manifest(tmp)
    m = json.load(open(manifest))
    m["models"][0]["max_batch_size"] = batch_size
    if precision:
        m["models"][0]["precision"] = precision
    if slots:
        m["models"][1]["max_sequences"] = slots
    path = os.path.join(tmp, f"{name}.json")
    json.dump(m, open(path, "w"))
    tokens = os.path.join(tmp, f"{name}.tokens")
    open(tokens, "w").write(tokens_text)
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


def classify(args, bin_dir, tmp, progress, steps, servers):
    sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    runs = {}
    server, addr = serve(bin_dir, tmp, "shared", 64, servers, precision=args.precision)
    progress("classify: B alone at concurrency 1", steps)
    out = os.path.join(tmp, "b-alone.json")
    loadgen(bin_dir, addr, "tok-b", 1, args.duration, out).wait()
    runs["b_alone"] = figures(out)
    progress(f"classify: A alone at concurrency {args.flood}", steps)
    out = os.path.join(tmp, "a-alone.json")
    loadgen(bin_dir, addr, "tok-a", args.flood, args.duration, out).wait()
    runs["a_alone"] = figures(out)
    progress("classify: both (one krause-loadgen, --tenants)", steps)
    out = os.path.join(tmp, "both.json")
    loadgen_tenants(bin_dir, addr, f"A:tok-a:{args.flood}:classify,B:tok-b:1:classify",
                    args.duration, out).wait()
    runs["a_both"], runs["b_both"] = figures(out, tenant="A"), figures(out, tenant="B")
    progress("classify: a priority-1 call beside its own tenant's priority-0 flood", steps)
    out = os.path.join(tmp, "priority.json")
    loadgen_tenants(bin_dir, addr, f"A:tok-a:{args.flood}:classify,P:tok-a:1:classify:1:1",
                    args.duration, out).wait()
    runs["a_priority"], runs["p_priority"] = figures(out, tenant="A"), figures(out, tenant="P")
    stop(server)
    progress("classify: A over its max_queued (4) beside B", steps)
    server, addr = serve(bin_dir, tmp, "quota", 64, servers,
                         "tok-a tenant=team-a max_queued=4\ntok-b tenant=team-b\n",
                         precision=args.precision)
    out = os.path.join(tmp, "quota.json")
    loadgen_tenants(bin_dir, addr, f"A:tok-a:{args.flood}:classify,B:tok-b:1:classify",
                    args.duration, out).wait()
    q = json.load(open(out))["tenants"]
    runs["quota"] = {t: q[t]["errors_by_code"]["Classify"] for t in ("A", "B")}
    stop(server)
    for b in sizes:
        progress(f"classify: A alone, max_batch_size {b}", steps)
        server, addr = serve(bin_dir, tmp, f"m{b}", b, servers, precision=args.precision)
        out = os.path.join(tmp, f"a-batch{b}.json")
        loadgen(bin_dir, addr, "tok-a", args.flood, args.duration, out).wait()
        runs[f"a_batch{b}"] = figures(out)
        stop(server)
    r = runs
    lines = [
        f"Classify, krause-vit-fmnist (max_batch_size 64"
        f"{', precision ' + args.precision if args.precision else ''}), two tenants of equal "
        f"weight, {args.duration:g} s each, one run", "",
        "| | images/s | p50 ms | p99 ms | errors |", "|---|---|---|---|---|"]
    for key, what in (("b_alone", "B alone, concurrency 1"),
                      ("b_both", f"B beside A's flood (concurrency {args.flood})"),
                      ("a_alone", f"A alone, concurrency {args.flood}"),
                      ("a_both", "A beside B")):
        f = r[key]
        lines.append(f"| {what} | {f['images_per_second']:.0f} | {f['p50_ms']:.1f} | "
                     f"{f['p99_ms']:.1f} | {f['errors']} |")
    batch_ms = 64 / r["a_alone"]["images_per_second"] * 1e3
    p = r["p_priority"]
    lines += ["", f"A beside B / A alone: {r['a_both']['images_per_second'] / r['a_alone']['images_per_second']:.3f}", "",
              f"Priority: one priority-1 call at a time (P) beside the same tenant's {args.flood} "
              f"priority-0 calls: p50 {p['p50_ms']:.1f} ms, p99 {p['p99_ms']:.1f} ms, "
              f"{p['errors']} errors; a batch of 64 takes about {batch_ms:.1f} ms here (64 / A "
              f"alone's images/s), so P waits for {p['p50_ms'] / batch_ms:.2f} batches at p50 "
              f"({p['p99_ms'] / batch_ms:.2f} at p99) counting its own; the flood's images/s "
              f"beside it: {r['a_priority']['images_per_second'] / r['a_alone']['images_per_second']:.3f} of alone", "",
              f"Quota: A (max_queued=4) at concurrency {args.flood} beside B at 1, calls by "
              f"status: A {r['quota']['A']}, B {r['quota']['B']}", "",
              f"A alone at concurrency {args.flood} by max_batch_size:", "",
              "| max_batch_size | images/s | p50 ms |", "|---|---|---|"]
    for b in sizes:
        f = r[f"a_batch{b}"]
        lines.append(f"| {b} | {f['images_per_second']:.0f} | {f['p50_ms']:.1f} |")
    return runs, lines


def generate(args, bin_dir, tmp, progress, steps, servers):
    runs = {}
    lines = [f"Generate, karm-fmnist ({args.slots} cache slots): A streams 1 image per call at "
             f"concurrency {args.gen_a}, B 4 images per call at concurrency {args.gen_b} "
             f"(both want more slots than there are), {args.duration:g} s each, one run", "",
             "| weights A:B | A images/s | B images/s | B's share | A's share | total / A alone "
             "| errors A, B |", "|---|---|---|---|---|---|---|"]
    for weight_a in (1, 3):
        tokens = f"tok-a tenant=team-a weight={weight_a}\ntok-b tenant=team-b\n"
        server, addr = serve(bin_dir, tmp, f"gen{weight_a}", 64, servers, tokens, args.slots)
        key = f"w{weight_a}"
        if weight_a == 1:
            progress(f"generate: A alone at concurrency {args.gen_a}", steps)
            out = os.path.join(tmp, "gen-a-alone.json")
            loadgen(bin_dir, addr, "tok-a", args.gen_a, args.duration, out, "generate",
                    warmup=2).wait()
            runs["gen_a_alone"] = figures(out, "Generate")
        progress(f"generate: A and B together (one krause-loadgen), weights {weight_a}:1", steps)
        out = os.path.join(tmp, f"gen-{key}.json")
        loadgen_tenants(bin_dir, addr,
                        f"A:tok-a:{args.gen_a}:generate:1,B:tok-b:{args.gen_b}:generate:4",
                        args.duration, out, warmup=2).wait()
        fa, fb = figures(out, "Generate", "A"), figures(out, "Generate", "B")
        runs[f"gen_a_{key}"], runs[f"gen_b_{key}"] = fa, fb
        stop(server)
        total = fa["images_per_second"] + fb["images_per_second"]
        lines.append(f"| {weight_a}:1 | {fa['images_per_second']:.1f} | "
                     f"{fb['images_per_second']:.1f} | {fb['images_per_second'] / total:.3f} | "
                     f"{fa['images_per_second'] / total:.3f} | "
                     f"{total / runs['gen_a_alone']['images_per_second']:.3f} | "
                     f"{fa['errors']}, {fb['errors']} |")
    f = runs["gen_a_alone"]
    lines += ["", f"A alone: {f['images_per_second']:.1f} images/s, p50 {f['p50_ms']:.0f} ms, "
              f"{f['errors']} errors"]
    return runs, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="classify,generate")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--duration", type=float, default=8)
    ap.add_argument("--flood", type=int, default=128)
    ap.add_argument("--batch_sizes", default="16,32,64")
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--precision", default="", help="classify: the ViT's precision (bf16)")
    ap.add_argument("--gen_a", type=int, default=64)
    ap.add_argument("--gen_b", type=int, default=16)
    ap.add_argument("--json", default="")
    ap.add_argument("--text", default="")
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin)
    tmp = tempfile.mkdtemp(prefix="krause-tenants-bench-")
    scenarios = [x for x in args.scenario.split(",") if x]
    steps = (5 + len([b for b in args.batch_sizes.split(",") if b]) if "classify" in scenarios
             else 0) + (3 if "generate" in scenarios else 0)
    progress = Progress()
    runs, lines = {}, []
    servers = []
    try:
        for name, fn in (("classify", classify), ("generate", generate)):
            if name in scenarios:
                r, text = fn(args, bin_dir, tmp, progress, steps, servers)
                runs.update(r)
                lines += (["", ""] if lines else []) + text
    finally:
        for s in servers:
            stop(s)
    report("\n".join(lines), runs, args.text, args.json)


if __name__ == "__main__":
    main()
