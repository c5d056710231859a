#!/usr/bin/env python3
"""Start-up time with and without the load-time kernel check, side by side in one run.

  bench/startup_bench.py [--bin build/bin] [--models models] [--rounds 7]
                         [--json bench/results/startup-kernel-check.json]

Each round starts krause-server on the bundled models twice, once with --kernel_check=off and
once with --kernel_check=fallback (the default), the order alternating from round to round so
that a slow phase of the machine hits both. A start is timed from the process's launch to its
--port_file appearing (written once every model is loaded and health says SERVING); the server is
then stopped with SIGTERM. Reports the median of each mode and their ratio (target: the check
adds at most 10%), and each model's check time from the server's log lines.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def start_once(binary, models, mode, workdir):
    port_file = os.path.join(workdir, f"port-{mode}")
    if os.path.exists(port_file):
        os.remove(port_file)
    log_path = os.path.join(workdir, f"log-{mode}")
    with open(log_path, "w") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--port_file", port_file, "--metrics_listen=",
             "--http_listen=", "--models_dir", models, f"--kernel_check={mode}"],
            stdout=subprocess.DEVNULL, stderr=log)
        while not os.path.exists(port_file):
            if proc.poll() is not None:
                sys.exit(f"startup_bench: krause-server --kernel_check={mode} exited with "
                         f"{proc.returncode}; log: {open(log_path).read()}")
            if time.monotonic() - t0 > 120:
                proc.kill()
                sys.exit("startup_bench: no port file after 120 s")
            time.sleep(0.002)
        seconds = time.monotonic() - t0
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    checks = {}
    for line in open(log_path):
        m = re.search(r"model (\S+) version \d+: serving on (\S+) .*kernel check: (.*)$", line)
        if m:
            ms = re.findall(r"in ([0-9.]+) ms", m.group(3))
            checks[m.group(1)] = {"implementation": m.group(2),
                                  "check_ms": sum(float(x) for x in ms),
                                  "log": m.group(3)}
    return seconds, checks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--models", default="models")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    binary = os.path.join(a.bin, "krause-server")
    times = {"off": [], "fallback": []}
    checks = {}
    t_begin = time.monotonic()
    with tempfile.TemporaryDirectory() as work:
        for r in range(a.rounds):
            order = ["off", "fallback"] if r % 2 == 0 else ["fallback", "off"]
            for mode in order:
                seconds, c = start_once(binary, a.models, mode, work)
                times[mode].append(seconds)
                if mode == "fallback":
                    for name, v in c.items():
                        checks.setdefault(name, []).append(v)
            done = r + 1
            elapsed = time.monotonic() - t_begin
            eta = elapsed / done * (a.rounds - done)
            print(f"startup_bench: round {done}/{a.rounds} (off {times['off'][-1]:.3f} s, "
                  f"fallback {times['fallback'][-1]:.3f} s), eta {eta:.0f} s", file=sys.stderr)
    off, on = statistics.median(times["off"]), statistics.median(times["fallback"])
    ratio = on / off
    print(f"start-up to SERVING, bundled models, median of {a.rounds}:")
    print(f"  --kernel_check=off       {off * 1e3:8.1f} ms")
    print(f"  --kernel_check=fallback  {on * 1e3:8.1f} ms   ratio {ratio:.3f} (target <= 1.10)")
    per_model = {}
    for name, runs in sorted(checks.items()):
        ms = statistics.median(v["check_ms"] for v in runs)
        per_model[name] = {"implementation": runs[-1]["implementation"], "check_ms_median": ms,
                           "log": runs[-1]["log"]}
        print(f"  {name:20s} check {ms:7.1f} ms, serving on {runs[-1]['implementation']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": a.rounds, "seconds": times, "median_off_s": off,
                       "median_fallback_s": on, "ratio": ratio, "target_ratio": 1.10,
                       "models": per_model,
                       "machine": {"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}},
                      f, indent=2)
    return 0 if ratio <= 1.10 else 1


if __name__ == "__main__":
    sys.exit(main())
