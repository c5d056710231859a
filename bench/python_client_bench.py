#!/usr/bin/python3
"""The Python client (client/python) against the floor it stands on and against the C++ load
generator, in one run on one server (the bundled models), the loads alternating round by round:

  classify   Client.classify(numpy image) at concurrency 1 against a plain grpcio call of the
             generated stub with a prepared request (what the client adds: the request from
             numpy, the result's dataclasses and probabilities); target: +0.3 ms at most on
             the median
  generate   16 concurrent streams of one karm-fmnist image each, Client.generate_images from
             16 threads against krause-loadgen --workload generate --concurrency 16 (the same
             update interval); target: at least 90% of krause-loadgen's images/s

Usage: scripts/python-client-venv.sh /tmp/kc && /tmp/kc/bin/python bench/python_client_bench.py
       [--bin build/bin] [--rounds 3] [--seconds 8] [--json bench/results/python-client.json]
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (ROOT, Progress, first_test_image, free_port, median, stop,  # noqa: E402
                    write_manifest)

try:
    import krause_serve
    from krause_serve._gen.krause.v1 import krause_pb2, krause_pb2_grpc
except ImportError:
    sys.exit("python_client_bench: run it with a Python that has the client installed: "
             "scripts/python-client-venv.sh /tmp/kc && /tmp/kc/bin/python " + sys.argv[0])

UPDATE_MS = 50  # krause-loadgen's default --update_interval_ms


def classify_latencies(address, calls):
    """Median seconds of `calls` Classify calls: the client's, and grpcio's own stub's."""
    px = np.frombuffer(first_test_image(), dtype=np.uint8).reshape(28, 28, 1)
    client = krause_serve.Client(address)
    channel = grpc.insecure_channel(address)
    stub = krause_pb2_grpc.KrauseServiceStub(channel)
    request = krause_pb2.ClassifyRequest(images=[krause_pb2.Image(raw=krause_pb2.RawImage(
        pixels=px.tobytes(), height=28, width=28, channels=1))], top_k=5, return_probabilities=True)
    ours, raw = [], []
    for _ in range(20):  # warm both
        client.classify(px)
        stub.Classify(request)
    for i in range(calls):  # interleaved: the same machine noise for both
        t = time.perf_counter()
        client.classify(px)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        stub.Classify(request)
        raw.append(time.perf_counter() - t)
    client.close()
    channel.close()
    return median(ours), median(raw)


def python_generate(address, streams, seconds):
    """Images/s of `streams` threads each generating one image per call for `seconds`."""
    client = krause_serve.Client(address)
    done = [0] * streams
    stop_at = time.monotonic() + seconds

    def worker(k):
        seed = k * 1000003
        while time.monotonic() < stop_at:
            client.generate_images(n=1, seed=seed, update_interval_ms=UPDATE_MS)
            seed += 1
            done[k] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    client.close()
    return sum(done) / elapsed


def loadgen_generate(bin_dir, address, streams, seconds):
    out = subprocess.run(
        [f"{bin_dir}/krause-loadgen", "--server", address, "--workload", "generate",
         "--concurrency", str(streams), "--duration", str(seconds), "--warmup", "1",
         "--update_interval_ms", str(UPDATE_MS), "--progress=false", "--json=-", "--channels", "1"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{\n"):])["images_per_second"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8, help="each generation load")
    p.add_argument("--calls", type=int, default=500, help="classify calls per round and side")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="krause-python-client-bench-")
    port = free_port()
    server = subprocess.Popen([f"{args.bin}/krause-server", "--manifest", write_manifest(tmp),
                               "--listen", f"127.0.0.1:{port}", "--http_listen=",
                               "--metrics_listen=", "--quiet"])
    address = f"127.0.0.1:{port}"
    progress = Progress()
    steps = 1 + 3 * args.rounds
    try:
        progress("starting krause-server on the bundled models", steps)
        deadline = time.monotonic() + 60
        while True:
            try:
                krause_serve.Client(address, retries=0, timeout=5).models()
                break
            except krause_serve.KrauseError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("python_client_bench: the server did not start")
                time.sleep(0.1)
        rounds = []
        for r in range(args.rounds):
            progress(f"round {r + 1}: classify at concurrency 1, client and grpcio stub", steps)
            ours, raw = classify_latencies(address, args.calls)
            # Alternate which generation load goes first.
            order = ["python", "loadgen"] if r % 2 == 0 else ["loadgen", "python"]
            gen = {}
            for who in order:
                progress(f"round {r + 1}: 16 generate streams, {who}", steps)
                gen[who] = (python_generate(address, 16, args.seconds) if who == "python"
                            else loadgen_generate(args.bin, address, 16, args.seconds))
            rounds.append({"classify_client_ms": ours * 1e3, "classify_grpcio_ms": raw * 1e3,
                           "generate_python_images_per_s": gen["python"],
                           "generate_loadgen_images_per_s": gen["loadgen"]})
    finally:
        stop(server)
    med = {k: median([r[k] for r in rounds]) for k in rounds[0]}
    added = med["classify_client_ms"] - med["classify_grpcio_ms"]
    ratio = med["generate_python_images_per_s"] / med["generate_loadgen_images_per_s"]
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        f"python_client_bench, {when}, {os.cpu_count()} cores, {args.rounds} rounds "
        f"({args.calls} classify calls per side, {args.seconds:g} s per generation load)",
        "",
        "| figure | value | target |",
        "|---|---|---|",
        f"| Classify at concurrency 1, median: Client.classify / grpcio stub "
        f"({med['classify_client_ms']:.3f} / {med['classify_grpcio_ms']:.3f} ms) | "
        f"+{added:.3f} ms | at most +0.3 ms |",
        f"| 16 generate streams: Client.generate_images in 16 threads / krause-loadgen, images/s "
        f"({med['generate_python_images_per_s']:.1f} / {med['generate_loadgen_images_per_s']:.1f}) | "
        f"{ratio:.3f} | at least 0.9 |",
        "",
        "per round: " + json.dumps([{k: round(v, 3) for k, v in r.items()} for r in rounds]),
    ]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": when, "rounds": rounds, "medians": med,
                       "classify_added_ms": added, "generate_ratio": ratio}, f, indent=1)
        with open(os.path.splitext(args.json)[0] + ".txt", "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
