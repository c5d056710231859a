"""serving_bench.py's two comparing modes, a mixin of its Bench (which gives them the server,
the load generator, the records and the progress line):

  --against OTHER_BIN  the served loads on this build's krause-server and on OTHER_BIN's, build by
                       build within each of --rounds rounds (the order alternating); each figure's
                       median per build and their ratio, this build / OTHER_BIN's;
  --protocols          Classify through krause.v1 and through the Open Inference Protocol's
                       ModelInfer over gRPC on one server, protocol by protocol within each round,
                       against the targets.
"""
import json
import os
import sys
import time

from common import median


class CompareModes:
    # The figures --against compares: name, what it is, and whether higher is better.
    COMPARED = [
        ("classify_c1_p50_ms", "Classify p50 at concurrency 1 (ms)", False),
        ("classify_c32_images_per_s", "Classify at concurrency 32 (images/s)", True),
        ("generate_s1_images_per_s", "Generate, 1 stream (images/s)", True),
        ("generate_s64_images_per_s", "Generate, 64 streams (images/s)", True),
        ("burst_gap_ratio", "p99 chunk gap with / without a burst of 64 completions", False),
        ("scored_generate_ratio", "1-image Generate beside 6 Score clients / idle", False),
        ("getmodel_c1_p50_ms", "the RPC floor, GetModel p50 (ms)", False),
    ]

    def figures(self, prefix):
        lg = lambda name: self.records[prefix + name]
        p = lambda name, rpc, q: lg(name)["latency_seconds"][rpc][q]
        return {
            "classify_c1_p50_ms": 1e3 * p("classify_c1", "Classify", "p50"),
            "classify_c32_images_per_s": lg("classify_c32")["images_per_second"],
            "generate_s1_images_per_s": lg("generate_s1")["images_per_second"],
            "generate_s64_images_per_s": lg("generate_s64")["images_per_second"],
            "burst_gap_ratio": lg("streams_burst")["generate_chunk_gap_seconds"]["p99"] /
                               lg("streams_alone")["generate_chunk_gap_seconds"]["p99"],
            "scored_generate_ratio": p("generate_scored", "Generate", "p50") /
                                     p("generate_idle", "Generate", "p50"),
            "getmodel_c1_p50_ms": 1e3 * p("getmodel_c1", "GetModel", "p50"),
        }

    def compare(self):
        a = self.args
        builds = [("this", self.bin), ("other", os.path.abspath(a.against))]
        steps = a.rounds * len(builds) * 5 + 1
        for rnd in range(a.rounds):
            order = builds if rnd % 2 == 0 else builds[::-1]
            for label, server_bin in order:
                prefix = f"{label}_r{rnd}_"
                self.served_loads(server_bin, prefix, lambda what: self.progress(
                    f"round {rnd + 1} of {a.rounds}, {label} build ({server_bin}): {what}", steps))
        self.progress("report", steps)
        raw = os.path.join(self.tmp, "records.json")
        self.records["compare"] = {"rounds": a.rounds, "this": self.bin,
                                   "other": os.path.abspath(a.against)}
        with open(raw, "w") as f:
            json.dump(self.records, f)
        print(f"raw records: {raw} (bench/serving_bench.py --report {raw} reprints the report)",
              file=sys.stderr)
        return self.compare_report()

    def compare_report(self):
        c = self.records["compare"]
        per = {label: [self.figures(f"{label}_r{rnd}_") for rnd in range(c["rounds"])]
               for label in ("this", "other")}

        lines = [f"this build: {c['this']}", f"other build: {c['other']}",
                 f"{c['rounds']} rounds, medians; ratio = this / other", "",
                 "| figure | this | other | ratio | better |", "|---|---|---|---|---|"]
        ratios = []
        for key, what, higher in self.COMPARED:
            t = median([f[key] for f in per["this"]])
            o = median([f[key] for f in per["other"]])
            ratios.append({"figure": key, "this": t, "other": o, "ratio": t / o,
                           "higher_is_better": higher,
                           "this_rounds": [f[key] for f in per["this"]],
                           "other_rounds": [f[key] for f in per["other"]]})
            lines.append(f"| {what} | {t:.4g} | {o:.4g} | {t / o:.3f} | "
                         f"{'higher' if higher else 'lower'} |")
        text = "\n".join(lines)
        return text, {"compare": ratios, "records": self.records,
                      "date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count()}

    def protocols(self):
        a = self.args
        dur = "4" if a.quick else "8"
        steps = a.rounds * 2 + 1
        self.start_server(self.bin)
        try:
            for rnd in range(a.rounds):
                for proto in (["krause", "oip"] if rnd % 2 == 0 else ["oip", "krause"]):
                    self.progress(f"round {rnd + 1} of {a.rounds}: {proto}, Classify at "
                                  "concurrency 1 and 32", steps)
                    for c in ("1", "32"):
                        self.loadgen(f"{proto}_r{rnd}_classify_c{c}", "--protocol", proto,
                                     "--workload", "classify", "--concurrency", c, "--duration",
                                     dur, "--warmup", "1")
        finally:
            self.stop_server()
        self.progress("report", steps)
        self.records["protocols"] = {"rounds": a.rounds, "bin": self.bin}
        raw = os.path.join(self.tmp, "records.json")
        with open(raw, "w") as f:
            json.dump(self.records, f)
        print(f"raw records: {raw} (bench/serving_bench.py --report {raw} reprints the report)",
              file=sys.stderr)
        return self.protocols_report()

    def protocols_report(self):
        rounds = self.records["protocols"]["rounds"]
        rpc = {"krause": "Classify", "oip": "ModelInfer"}


        def figures(proto):
            r = [(self.records[f"{proto}_r{i}_classify_c1"], self.records[f"{proto}_r{i}_classify_c32"])
                 for i in range(rounds)]
            return ([1e3 * c1["latency_seconds"][rpc[proto]]["p50"] for c1, _ in r],
                    [c32["images_per_second"] for _, c32 in r])
        (n_p50, n_tput), (o_p50, o_tput) = figures("krause"), figures("oip")
        p50_ratio = median(o_p50) / median(n_p50)
        tput_ratio = median(o_tput) / median(n_tput)
        lines = [f"{rounds} rounds, medians; ratio = OIP (gRPC ModelInfer) / krause.v1 Classify", "",
                 "| figure | krause.v1 | OIP | ratio | target |", "|---|---|---|---|---|",
                 f"| Classify p50 at concurrency 1 (ms) | {median(n_p50):.3f} | {median(o_p50):.3f} | "
                 f"{p50_ratio:.3f} | <= 1.2: {'met' if p50_ratio <= 1.2 else 'MISSED'} |",
                 f"| Classify at concurrency 32 (images/s) | {median(n_tput):.0f} | "
                 f"{median(o_tput):.0f} | {tput_ratio:.3f} | >= 0.9: "
                 f"{'met' if tput_ratio >= 0.9 else 'MISSED'} |",
                 "", f"per round, krause.v1 p50 ms {[round(x, 3) for x in n_p50]}, OIP "
                 f"{[round(x, 3) for x in o_p50]}; images/s {[round(x) for x in n_tput]}, OIP "
                 f"{[round(x) for x in o_tput]}"]
        return "\n".join(lines), {
            "protocols": {"p50_ms": {"krause": n_p50, "oip": o_p50}, "p50_ratio": p50_ratio,
                          "images_per_s": {"krause": n_tput, "oip": o_tput},
                          "throughput_ratio": tput_ratio},
            "records": self.records, "date": time.strftime("%Y-%m-%d %H:%M"),
            "cores": os.cpu_count()}
