#!/usr/bin/env python3
"""The reload soak: a real krause-server with --model_control explicit on a repository of the
bundled models (vit: 1 = the Krause ViT, 2 = the softmax ViT; karm: 1 = KARM, 2 = the softmax
ARM), swapping each model's version every --interval seconds (LoadModel of the other version,
then UnloadModel of the serving one) while Classify and Generate calls run without a version.

  tests/reload_soak.py BIN_DIR SOURCE_DIR [--seconds 60] [--interval 2] [--rss_mb 64]

It fails on: a failed call (a swap must never be seen), a reply naming a version other than 1
or 2, a failed LoadModel/UnloadModel, a server that crashes or does not exit 0 on SIGTERM,
resident memory after the warm-up (the first 30%) growing more than --rss_mb above the warm-up's
peak, and, once idle, a version still UNLOADING or the unloaded generator's KV cache gauge not
back to 0. Progress with an ETA goes to stderr; the figures (swaps, calls, RSS) to stdout.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from soak import compile_api, free_port, rss_mb, test_images

SERVICE = "/krause.v1.KrauseService/"
NAMES = ["ClassifyRequest", "ClassifyResponse", "GenerateRequest", "GenerateResponse", "Image",
         "LoadModelRequest", "LoadModelResponse", "UnloadModelRequest", "UnloadModelResponse",
         "RepositoryIndexRequest", "RepositoryIndexResponse"]


def messages(desc):
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(open(desc, "rb").read()).file:
        pool.Add(f)
    factory = message_factory.MessageFactory(pool)
    return {n: factory.GetPrototype(pool.FindMessageTypeByName("krause.v1." + n)) for n in NAMES}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bin_dir")
    ap.add_argument("source_dir")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--interval", type=float, default=2)
    ap.add_argument("--rss_mb", type=float, default=64)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="krause-reload-")
    models = os.path.join(os.path.abspath(args.source_dir), "models")
    repo = os.path.join(tmp, "repo")
    for name, version, file in [("vit", 1, "krause_vit_fmnist"), ("vit", 2, "vit_fmnist"),
                                ("karm", 1, "karm_fmnist"), ("karm", 2, "arm_fmnist")]:
        os.makedirs(os.path.join(repo, name, str(version)))
        os.symlink(os.path.join(models, file + ".safetensors"),
                   os.path.join(repo, name, str(version), "model.safetensors"))
    port, mport = free_port(), free_port()
    log = open(os.path.join(tmp, "server.log"), "w")
    server = subprocess.Popen(
        [os.path.join(args.bin_dir, "krause-server"), "--models_dir", repo,
         "--model_control=explicit", "--load_model=*", f"--listen=127.0.0.1:{port}",
         f"--metrics_listen=127.0.0.1:{mport}", "--http_listen=", "--drain_seconds=5"],
        stdout=log, stderr=subprocess.STDOUT)
    m = messages(compile_api(args.source_dir, tmp))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    ser = lambda x: x.SerializeToString()
    call = {n: channel.unary_unary(SERVICE + n, ser, m[n + "Response"].FromString)
            for n in ["Classify", "LoadModel", "UnloadModel", "RepositoryIndex"]}
    generate = channel.unary_stream(SERVICE + "Generate", ser, m["GenerateResponse"].FromString)
    grpc.channel_ready_future(channel).result(timeout=120)
    while True:  # the models load after the port opens
        try:
            idx = call["RepositoryIndex"](m["RepositoryIndexRequest"](ready_only=True), timeout=30)
            if len(idx.models) == 2:
                break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        time.sleep(0.1)
    serving = {e.name: e.version for e in idx.models}  # the policy's newest: 2 each

    images = test_images(8)
    failures, counts, lock = [], {}, threading.Lock()
    stop = threading.Event()

    def note(rpc, code, version):
        with lock:
            key = (rpc, code, version)
            counts[key] = counts.get(key, 0) + 1
            if code != "OK" or version not in ("1", "2"):
                if len(failures) < 20:
                    failures.append(f"{rpc}: {code} version {version!r}")

    def classify_loop():
        req = m["ClassifyRequest"](model="vit")
        for px in images:
            im = req.images.add()
            im.raw.pixels, im.raw.height, im.raw.width, im.raw.channels = px, 28, 28, 1
        while not stop.is_set():
            try:
                r = call["Classify"](req, timeout=30)
                note("Classify", "OK", r.model_version)
            except grpc.RpcError as e:
                note("Classify", e.code().name, "")

    def generate_loop():
        seed = 0
        while not stop.is_set():
            seed += 1
            version = ""
            try:
                for msg in generate(m["GenerateRequest"](model="karm", seed=seed), timeout=60):
                    if msg.HasField("summary"):
                        version = msg.summary.model_version
                note("Generate", "OK", version)
            except grpc.RpcError as e:
                note("Generate", e.code().name, "")

    workers = [threading.Thread(target=f) for f in (classify_loop, classify_loop, generate_loop)]
    for w in workers:
        w.start()
    t0 = time.time()
    samples, swaps, next_swap, next_line = [], 0, t0 + args.interval, t0
    while time.time() - t0 < args.seconds and server.poll() is None:
        if time.time() >= next_swap:
            for name in ("vit", "karm"):
                other = "1" if serving[name] == "2" else "2"
                try:
                    call["LoadModel"](m["LoadModelRequest"](name=name, version=other), timeout=60)
                    call["UnloadModel"](m["UnloadModelRequest"](name=name, version=serving[name]),
                                        timeout=60)
                    serving[name] = other
                except grpc.RpcError as e:
                    failures.append(f"swap {name} to {other}: {e.code().name} {e.details()}")
            swaps += 1
            next_swap += args.interval
        elapsed = time.time() - t0
        samples.append((elapsed, rss_mb(server.pid)))
        if time.time() >= next_line:
            next_line += 2
            sys.stderr.write(f"reload soak {100 * elapsed / args.seconds:5.1f}% {elapsed:5.0f} s "
                             f"elapsed, eta {max(0, args.seconds - elapsed):4.0f} s, {swaps} "
                             f"swaps, server RSS {samples[-1][1]:6.0f} MB\n")
        time.sleep(0.25)
    stop.set()
    for w in workers:
        w.join()
    if server.poll() is not None:
        failures.append(f"the server exited ({server.returncode}); log: {log.name}")
    else:
        # Idle: every unloaded version freed, its KV cache gauge at 0.
        deadline = time.time() + 15
        while time.time() < deadline:
            idx = call["RepositoryIndex"](m["RepositoryIndexRequest"](), timeout=30)
            states = {(e.name, e.version): e.State.Name(e.state) for e in idx.models}
            if "UNLOADING" not in states.values():
                break
            time.sleep(0.1)
        expected = {(n, v): ("READY" if serving[n] == v else "UNAVAILABLE")
                    for n in ("vit", "karm") for v in ("1", "2")}
        if states != expected:
            failures.append(f"index when idle: {states}, expected {expected}")
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read()
        gone = "1" if serving["karm"] == "2" else "2"
        line = re.search(rf'krause_kv_cache_bytes\{{model="karm",version="{gone}"\}} (\S+)',
                         scrape.decode())
        if line is None or float(line.group(1)) != 0:
            failures.append(f"the unloaded karm version {gone}'s KV cache gauge: "
                            f"{line.group(1) if line else 'absent'}")
        server.send_signal(signal.SIGTERM)
        if server.wait(timeout=60) != 0:
            failures.append(f"exit code {server.returncode} after SIGTERM; log: {log.name}")
    warm = [r for t, r in samples if t < 0.3 * args.seconds] or [samples[0][1]]
    after = [r for t, r in samples if t >= 0.3 * args.seconds] or [samples[-1][1]]
    growth = max(after) - max(warm)
    if growth > args.rss_mb:
        failures.append(f"RSS grew {growth:.0f} MB past the warm-up's peak (limit {args.rss_mb})")
    calls = sum(counts.values())
    print(f"reload soak: {swaps} swaps of both models in {args.seconds:.0f} s, {calls} calls")
    for (rpc, code, version), n in sorted(counts.items()):
        print(f"  {rpc} {code} version {version or '-'}: {n}")
    print(f"  server RSS MB: start {samples[0][1]:.0f}, warm-up peak {max(warm):.0f}, "
          f"after the warm-up max {max(after):.0f}, end {samples[-1][1]:.0f} "
          f"(growth {growth:+.0f}, limit {args.rss_mb:.0f})")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
