#!/usr/bin/env python3
"""The serving hot-path benchmark: the bundled models through a real krause-server, side by side
in one run with the PyTorch peer (bench/peer/torch_peer.py: the same weights in PyTorch eager
from Python, the same thread settings) and with the models' own speed (krause-model-bench).

  bench/serving_bench.py [--bin build/bin] [--quick] [--json bench/results/serving-hotpath.json]
  bench/serving_bench.py --against OTHER_BIN [--rounds 3] [--quick] [--json ...]
  bench/serving_bench.py --protocols [--rounds 3] [--quick] [--json ...]

What it measures (each a ratio of two figures taken in this run, on this machine):
  generate   karm-fmnist through the server (krause-loadgen) at 1 and 64 streams against the
             peer's KV-cache sampler with a static batch of 1 and 64;
  paper      the paper's MNIST KARM (random weights) through the decode engine
             (krause-generate-bench, whole images) against the peer sampler at 1 and 64;
  classify   krause-vit-fmnist through the server at concurrency 1 (p50 latency; beside it the
             RPC floor, GetModel) and 32 (one image per call) against the model's own forward at
             batch 1 and 32 (krause-model-bench, default threads); the forward against
             the peer's dense masked Krause ViT and plain ViT (and the peer's accuracy on the
             first 2,000 test images, to show it computes the same model);
  burst      the p99 gap between the chunks of 4 running streams, alone and while a burst of 64
             completion requests (14-row prompts) arrives;
  score      a 1-image Generate alone and while six clients send Score(16 images) back to back.
Prints a table with the targets, writes every raw record and ratio to --json. The load generator
runs on the same cores as the server: its CPU time is reported beside each load.

--against OTHER_BIN compares two builds of the server instead (a change against the commit
before it, say): the served loads above (Classify at 1 and 32, Generate at 1 and 64 streams,
the burst and the Score contention) run on this build's krause-server and on OTHER_BIN's, build
by build within each of --rounds rounds (the order alternating, so that a slow phase of the
machine hits both), always driven by this build's krause-loadgen. It reports each figure's
median per build and their ratio, this build / OTHER_BIN's, and no peer.

--protocols compares the two protocols on one server of this build: Classify (krause-vit-fmnist,
one image per call) at concurrency 1 (p50) and 32 (images/s) through krause.v1 and through the
Open Inference Protocol's ModelInfer over gRPC (krause-loadgen --protocol oip), protocol by
protocol within each of --rounds rounds (the order alternating), with the targets: OIP throughput
at 32 at least 90% of native's, OIP p50 at 1 at most 1.2x native's.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from common import ROOT, Progress, free_port, stop, write_manifest
from serving_compare import CompareModes

TORCH_PYTHON = "/usr/bin/python3"  # Debian's python3-torch


class Bench(CompareModes):
    def __init__(self, args):
        self.args = args
        self.bin = os.path.abspath(args.bin)
        self.tmp = tempfile.mkdtemp(prefix="krause-serving-bench-")
        self.records = {}
        self.server = None
        self.progress = Progress()

    # ----------------------------------------------------------------------------- plumbing

    def run_json_lines(self, cmd):
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def peer(self, *args):
        cmd = [TORCH_PYTHON, os.path.join(ROOT, "bench", "peer", "torch_peer.py")] + list(args)
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True,
                             stderr=subprocess.DEVNULL).stdout
        return json.loads(out.strip().splitlines()[-1])

    @staticmethod
    def http_off(server_bin):
        """["--http_listen="] where the build has the flag (an older build may not)."""
        out = subprocess.run([f"{server_bin}/krause-server", "--helpfull"], capture_output=True,
                             text=True).stdout
        return ["--http_listen="] if "-http_listen" in out else []

    def start_server(self, server_bin):
        path = write_manifest(self.tmp)
        port_file = os.path.join(self.tmp, "port")
        if os.path.exists(port_file):  # a previous server's (--against starts several)
            os.remove(port_file)
        self.metrics = f"127.0.0.1:{free_port()}"
        # The REST port (8000 by default) off, where the build has one (--against may start an
        # older build).
        self.server = subprocess.Popen(
            [f"{server_bin}/krause-server", "--manifest", path, "--listen", "127.0.0.1:0",
             "--port_file", port_file, "--metrics_listen", self.metrics, "--quiet"]
            + self.http_off(server_bin))
        for _ in range(600):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            if self.server.poll() is not None:
                sys.exit("serving_bench: the server did not start")
            time.sleep(0.1)
        self.address = "127.0.0.1:" + open(port_file).read().strip()

    def stop_server(self):
        stop(self.server)

    def loadgen_cmd(self, name, *args):
        out = os.path.join(self.tmp, name + ".json")
        return out, [f"{self.bin}/krause-loadgen", "--server", self.address, "--metrics",
                     self.metrics, "--json", out, "--progress=false"] + list(args)

    def loadgen(self, name, *args):
        out, cmd = self.loadgen_cmd(name, *args)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            self.records[name] = json.load(f)
        return self.records[name]

    def loadgen_beside(self, name, main_args, other_name, other_args, delay, other_first=False):
        """Runs the main load and the other one, the second started `delay` s after the first
        (the main one first unless other_first); the other one is stopped (SIGTERM: it
        reports) when the main one is done."""
        out, cmd = self.loadgen_cmd(name, *main_args)
        other_out, other_cmd = self.loadgen_cmd(other_name, *other_args)
        first, second = (other_cmd, cmd) if other_first else (cmd, other_cmd)
        a = subprocess.Popen(first, stdout=subprocess.DEVNULL)
        time.sleep(delay)
        b = subprocess.Popen(second, stdout=subprocess.DEVNULL)
        main, other = (b, a) if other_first else (a, b)
        main.wait()
        if other.poll() is None:
            other.send_signal(signal.SIGTERM)  # it stops starting calls and reports
        other.wait(120)
        if main.returncode != 0:
            sys.exit(f"serving_bench: {name} failed ({main.returncode})")
        with open(out) as f:
            self.records[name] = json.load(f)
        if os.path.exists(other_out):
            with open(other_out) as f:
                self.records[other_name] = json.load(f)
        return self.records[name]

    # ----------------------------------------------------------------------------- the run

    def run(self):
        a = self.args
        m = os.path.join(ROOT, "models")
        steps = 15 if not a.quick else 11
        r = self.records

        # The forwards, ours and the peer's, alternating round by round (a slow phase of the
        # machine hits both); each figure is the median over the rounds.
        rounds = 1 if a.quick else 3
        ours_k, ours_v, peer_k, peer_v = [], [], [], []
        for i in range(rounds):
            self.progress(f"classifier forwards, ours and the PyTorch peer's (round {i + 1} of "
                          f"{rounds})", steps)
            ours_k.append(self.run_json_lines(
                [f"{self.bin}/krause-model-bench", "classify", f"{m}/krause_vit_fmnist.safetensors",
                 "--batches", "1,32", "--seconds", "2"]))
            peer_k.append(self.peer("classify", "--checkpoint", f"{m}/krause_vit_fmnist.safetensors",
                                    "--batch", "32", "--seconds", "2",
                                    *(["--accuracy", "2000"] if i == 0 else [])))
            ours_v.append(self.run_json_lines(
                [f"{self.bin}/krause-model-bench", "classify", f"{m}/vit_fmnist.safetensors",
                 "--batches", "32", "--seconds", "2"]))
            peer_v.append(self.peer("classify", "--checkpoint", f"{m}/vit_fmnist.safetensors",
                                    "--batch", "32", "--seconds", "2"))

        def median(records, key):
            v = sorted(x[key] for x in records)
            return v[len(v) // 2]
        r["forward_krause_vit_rounds"] = ours_k
        r["forward_krause_vit"] = [
            {"batch": b, "median_seconds": median([x for rr in ours_k for x in rr if x["batch"] == b],
                                                  "median_seconds"),
             "images_per_second": median([x for rr in ours_k for x in rr if x["batch"] == b],
                                         "images_per_second")} for b in (1, 32)]
        r["forward_vit_rounds"] = ours_v
        r["forward_vit"] = [{"batch": 32, "images_per_second":
                             median([rr[0] for rr in ours_v], "images_per_second")}]
        r["peer_classify_b32_rounds"] = peer_k
        r["peer_classify_b32"] = dict(peer_k[0], images_per_second=median(peer_k,
                                                                          "images_per_second"))
        r["peer_vit_b32_rounds"] = peer_v
        r["peer_vit_b32"] = dict(peer_v[0], images_per_second=median(peer_v, "images_per_second"))
        r["peer_classify_b1"] = self.peer("classify", "--checkpoint",
                                          f"{m}/krause_vit_fmnist.safetensors", "--batch", "1",
                                          "--seconds", "2")

        self.progress("starting krause-server on the bundled models", steps)
        self.served_loads(self.bin, "", lambda what: self.progress(what, steps))

        self.progress("peer sampler, karm-fmnist, static batch 1", steps)
        r["peer_sample_b1"] = self.peer("sample", "--checkpoint", f"{m}/karm_fmnist.safetensors",
                                        "--batch", "1", "--images", "3")
        self.progress("peer sampler, karm-fmnist, static batch 64", steps)
        r["peer_sample_b64"] = self.peer("sample", "--checkpoint", f"{m}/karm_fmnist.safetensors",
                                         "--batch", "64", "--images", "64")
        if not a.quick:
            self.progress("paper MNIST KARM through the engine (krause-generate-bench)", steps)
            out = os.path.join(self.tmp, "paper.json")
            subprocess.run([f"{self.bin}/krause-generate-bench", "--only", "mnist", "--streams",
                            "1,64", "--json", out], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            with open(out) as f:
                r["paper_engine"] = [json.loads(x) for x in f if x.strip()] if out.endswith(
                    ".jsonl") else json.load(f)
            self.progress("peer sampler, paper MNIST KARM, batches 1 and 64", steps)
            r["peer_paper_b1"] = self.peer("sample", "--random", "paper-mnist", "--batch", "1")
            r["peer_paper_b64"] = self.peer("sample", "--random", "paper-mnist", "--batch", "64")
        self.progress("report", steps)
        raw = os.path.join(self.tmp, "records.json")
        with open(raw, "w") as f:
            json.dump(self.records, f)
        print(f"raw records: {raw} (bench/serving_bench.py --report {raw} reprints the report)",
              file=sys.stderr)
        return self.report()

    def served_loads(self, server_bin, prefix, progress):
        """The loads through a real server (`server_bin`'s krause-server), recorded as
        prefix + name."""
        dur = "4" if self.args.quick else "8"
        self.start_server(server_bin)
        try:
            progress("the RPC floor (GetModel), then Classify at concurrency 1")
            self.loadgen(prefix + "getmodel_c1", "--workload", "getmodel", "--concurrency", "1",
                         "--duration", "3", "--warmup", "1")
            self.loadgen(prefix + "classify_c1", "--workload", "classify", "--concurrency", "1",
                         "--duration", dur, "--warmup", "1")
            progress("Classify at concurrency 32")
            self.loadgen(prefix + "classify_c32", "--workload", "classify", "--concurrency", "32",
                         "--duration", dur, "--warmup", "1")
            progress("Generate karm-fmnist, 1 stream and 64 streams")
            self.loadgen(prefix + "generate_s1", "--workload", "generate", "--concurrency", "1",
                         "--requests", "20", "--warmup", "0")
            self.loadgen(prefix + "generate_s64", "--workload", "generate", "--concurrency", "64",
                         "--requests", "192", "--warmup", "0")
            progress("4 running streams alone, then with a burst of 64 completions")
            running = ["--workload", "generate", "--concurrency", "4", "--duration", "5",
                       "--warmup", "0"]
            self.loadgen(prefix + "streams_alone", *running)
            self.loadgen_beside(prefix + "streams_burst", running, prefix + "burst",
                                ["--workload", "complete", "--prompt_rows", "14",
                                 "--concurrency", "64", "--requests", "64", "--warmup", "0"], 1.5)
            progress("a 1-image Generate alone, then beside six Score clients")
            one = ["--workload", "generate", "--concurrency", "1", "--requests", "10",
                   "--warmup", "0"]
            self.loadgen(prefix + "generate_idle", *one)
            self.loadgen_beside(prefix + "generate_scored", one, prefix + "score_clients",
                                ["--workload", "score", "--images_per_request", "16",
                                 "--concurrency", "6", "--duration", "120", "--warmup", "0"], 2.0,
                                other_first=True)
        finally:
            self.stop_server()

    # ----------------------------------------------------------------------------- report

    def report(self):
        r = self.records
        rows, targets = [], []

        def target(name, value, limit, ok, unit=""):
            targets.append({"target": name, "value": value, "limit": limit, "met": bool(ok)})
            rows.append(f"| {name} | {value:.3g}{unit} | {limit} | {'met' if ok else 'NOT MET'} |")

        def lg(name):
            return r[name]

        def p(name, rpc, q):
            return lg(name)["latency_seconds"][rpc][q]

        fw1 = next(x for x in r["forward_krause_vit"] if x["batch"] == 1)["median_seconds"]
        fw32 = next(x for x in r["forward_krause_vit"] if x["batch"] == 32)["images_per_second"]
        s1, s64 = lg("generate_s1")["images_per_second"], lg("generate_s64")["images_per_second"]
        pb1, pb64 = r["peer_sample_b1"]["images_per_second"], r["peer_sample_b64"]["images_per_second"]
        target("karm-fmnist, 1 stream vs peer batch 1 (x)", s1 / pb1, ">= 4", s1 / pb1 >= 4)
        target("karm-fmnist, 64 streams vs peer batch 64 (x)", s64 / pb64, ">= 1.5",
               s64 / pb64 >= 1.5)
        if "paper_engine" in r:
            def eng(s):
                recs = [x for x in r["paper_engine"] if x["attention"] == "KARM" and
                        x["streams"] == s and x["method"] in ("full", "integrated")]
                full = [x for x in recs if x["method"] == "full"]
                return (full or recs)[0]["images_per_second"]
            e1, e64 = eng(1), eng(64)
            q1, q64 = r["peer_paper_b1"]["images_per_second"], r["peer_paper_b64"]["images_per_second"]
            target("paper MNIST KARM, 64 sequences vs peer (x)", e64 / q64, ">= 4", e64 / q64 >= 4)
            target("paper MNIST KARM, 1 sequence vs peer (x)", e1 / q1, ">= 2", e1 / q1 >= 2)
        c1 = p("classify_c1", "Classify", "p50")
        target("Classify p50 at concurrency 1 (ms)", 1e3 * c1, f"<= {1e3 * (fw1 + 5e-4):.2f} "
               f"(forward {1e3 * fw1:.2f} + 0.5)", c1 <= fw1 + 5e-4)
        c32 = lg("classify_c32")["images_per_second"]
        target("Classify c32 served / batch-32 forward", c32 / fw32, ">= 0.5", c32 / fw32 >= 0.5)
        ours_vit = r["forward_vit"][0]["images_per_second"]
        kv = fw32 / r["peer_classify_b32"]["images_per_second"]
        pv = ours_vit / r["peer_vit_b32"]["images_per_second"]
        target("Krause ViT forward vs peer dense masked, batch 32 (x)", kv, ">= 1", kv >= 1)
        target("ViT forward vs peer plain ViT, batch 32 (x)", pv, ">= 1", pv >= 1)
        g0 = lg("streams_alone")["generate_chunk_gap_seconds"]["p99"]
        g1 = lg("streams_burst")["generate_chunk_gap_seconds"]["p99"]
        target("p99 chunk gap with / without a burst of 64 completions", g1 / g0, "<= 2",
               g1 / g0 <= 2)
        t0 = p("generate_idle", "Generate", "p50")
        t1 = p("generate_scored", "Generate", "p50")
        target("1-image Generate beside 6 Score clients / idle", t1 / t0, "<= 3", t1 / t0 <= 3)

        lines = ["| target | measured | limit | |", "|---|---|---|---|"] + rows
        lines.append("")
        lines.append("Figures (images/s unless said):")

        def cpu(name):
            x = lg(name)
            return f"load generator CPU {x['cpu_seconds']:.1f} s of {x['wall_seconds']:.1f} s"
        lines += [
            f"- karm-fmnist served: 1 stream {s1:.2f}, 64 streams {s64:.2f}; peer sampler "
            f"batch 1 {pb1:.2f}, batch 64 {pb64:.2f} ({cpu('generate_s64')} at 64)",
            f"- krause-vit-fmnist forward: batch 1 {1e3 * fw1:.2f} ms, batch 32 {fw32:.0f}/s; "
            f"peer dense masked batch 1 {1e3 * r['peer_classify_b1']['median_seconds']:.2f} ms, "
            f"batch 32 {r['peer_classify_b32']['images_per_second']:.0f}/s (peer accuracy on "
            f"{r['peer_classify_b32']['accuracy_images']} test images "
            f"{100 * r['peer_classify_b32']['accuracy']:.2f}%); vit-fmnist forward batch 32 "
            f"{ours_vit:.0f}/s, peer plain ViT {r['peer_vit_b32']['images_per_second']:.0f}/s",
            f"- the RPC floor (GetModel at concurrency 1, no model): p50 "
            f"{1e3 * p('getmodel_c1', 'GetModel', 'p50'):.2f} ms",
            "- Classify at concurrency 1 inside the server (means, from /metrics): call "
            f"{1e3 * lg('classify_c1')['server']['classify_call_mean_seconds']:.2f} ms, waiting for "
            f"the batcher {1e3 * lg('classify_c1')['server']['classify_queue_mean_seconds']:.3f} ms,"
            f" forward {1e3 * lg('classify_c1')['server']['classify_batch_compute_mean_seconds']:.2f} ms",
            f"- Classify served: c1 p50 {1e3 * c1:.2f} ms p99 "
            f"{1e3 * p('classify_c1', 'Classify', 'p99'):.2f} ms; c32 {c32:.0f}/s, p50 "
            f"{1e3 * p('classify_c32', 'Classify', 'p50'):.1f} ms, mean batch "
            f"{lg('classify_c32').get('server', {}).get('classify_mean_batch_images', 0):.1f} "
            f"({cpu('classify_c32')})",
            f"- chunk gaps of 4 running streams (50 ms interval): p99 {1e3 * g0:.1f} ms alone, "
            f"{1e3 * g1:.1f} ms with the burst (max {1e3 * lg('streams_alone')['generate_chunk_gap_seconds']['max']:.1f}"
            f" / {1e3 * lg('streams_burst')['generate_chunk_gap_seconds']['max']:.1f} ms)",
            f"- 1-image Generate p50: {1e3 * t0:.1f} ms idle, {1e3 * t1:.1f} ms beside Score "
            f"clients ({r.get('score_clients', {}).get('images_per_second', 0):.1f} Score images/s"
            " meanwhile)"]
        if "paper_engine" in r:
            lines.append(f"- paper MNIST KARM engine: 1 sequence {e1:.3f}, 64 sequences {e64:.3f}; "
                         f"peer {q1:.3f} / {q64:.3f}")
        text = "\n".join(lines)
        return text, {"targets": targets, "records": r,
                      "date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[1:]))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--quick", action="store_true",
                    help="shorter loads, no paper-size model (about 2 minutes)")
    ap.add_argument("--json", default="", help="write the records and targets here")
    ap.add_argument("--text", default="", help="write the table here too")
    ap.add_argument("--report", default="", help="only reprint the report of a run's raw records")
    ap.add_argument("--against", default="",
                    help="compare this build's server with the one in this bin folder")
    ap.add_argument("--rounds", type=int, default=3,
                    help="with --against: rounds per build; with --protocols: per protocol")
    ap.add_argument("--protocols", action="store_true",
                    help="compare krause.v1 Classify with the Open Inference Protocol's ModelInfer")
    args = ap.parse_args()
    bench = Bench(args)
    if args.report:
        with open(args.report) as f:
            bench.records = json.load(f)
        if "compare" in bench.records:
            text, data = bench.compare_report()
        elif "protocols" in bench.records:
            text, data = bench.protocols_report()
        else:
            text, data = bench.report()
    elif args.protocols:
        text, data = bench.protocols()
    elif args.against:
        text, data = bench.compare()
    else:
        text, data = bench.run()
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    if args.text:
        with open(args.text, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
