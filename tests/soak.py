#!/usr/bin/env python3
"""The soak: a real krause-server on the bundled models with small queues, driven past what its
queues admit by several client processes with a hostile mix, then checked.

  tests/soak.py BIN_DIR SOURCE_DIR [--seconds 45] [--processes 3] [--threads 8] [--tenants]
                [--json FILE]

(scripts/soak.sh runs it: a short mode for CI, --long for 6 minutes.) The mix, per call: valid
Classify / Score / Generate / completion calls, 10% malformed requests (wrong shapes, junk and
lying PNGs, empty and oversized requests, unknown models), calls with deadlines of a few
milliseconds, Generate streams cancelled after their first message, and in every process streams
that never read (64 images each, more than the HTTP/2 flow-control window) held for seconds and
then cancelled. It fails on:
  - a crash (the server process gone) or an exit code other than 0 after SIGTERM;
  - a hang: a call that ends more than 5 s after its deadline;
  - a status the API does not document for that call (INTERNAL, UNKNOWN, ...; malformed calls
    must get INVALID_ARGUMENT or NOT_FOUND);
  - work left behind when idle: calls in flight, queued images, active sequences or cache slots
    in use (from /metrics) not back to 0 within 15 s;
  - resident memory after the warm-up (the first 30%) growing more than --rss_mb (64) above the
    warm-up's peak;
  - results that differ from the idle results (Classify probabilities, a seeded Generate's PNG,
    Score's bits/dim, bit for bit).
With --tenants the server has a token file of two tenants of equal weight: the hostile mix is
tenant "flood" (at most 2 calls queued per model: past that RESOURCE_EXHAUSTED, TENANT_LIMIT),
and a polite tenant "quiet" classifies one image and generates one at a time beside it; the
soak then also fails on any error a quiet call gets, or one that waits longer than its share
allows (10 s).
Progress with an ETA goes to stderr; the report (calls, mix, statuses, RSS, duration) to stdout.
"""
import argparse
import gzip
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE = "/krause.v1.KrauseService/"
DOCUMENTED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "UNAVAILABLE",
              "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED"}
FMNIST = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compile_api(source_dir, tmp):
    """The API's descriptor set, from the .proto through protoc (no generated Python code).
    Compiled once by the parent: workers that each rewrote the same file read it half-written."""
    desc = os.path.join(tmp, "krause.desc")
    subprocess.run(["protoc", "--include_imports", f"--descriptor_set_out={desc}",
                    "-I", os.path.join(source_dir, "proto"), "krause/v1/krause.proto"], check=True)
    return desc


def messages(desc):
    """The API's message classes from the descriptor set compile_api wrote."""
    fds = descriptor_pb2.FileDescriptorSet.FromString(open(desc, "rb").read())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    factory = message_factory.MessageFactory(pool)
    return {n: factory.GetPrototype(pool.FindMessageTypeByName("krause.v1." + n))
            for n in ["ClassifyRequest", "ClassifyResponse", "GenerateRequest",
                      "GenerateResponse", "ScoreRequest", "ScoreResponse", "Image"]}


def test_images(n):
    with gzip.open(FMNIST, "rb") as f:
        data = f.read()
    count, rows, cols = struct.unpack(">III", data[4:16])
    return [data[16 + i * rows * cols:16 + (i + 1) * rows * cols] for i in range(min(n, count))]


def png(width, height, rows, color_type=0, claim=None):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    w, h = claim or (width, height)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    raw = b"".join(b"\0" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) +
            chunk(b"IEND", b""))


class Client:
    def __init__(self, address, msgs, token=""):
        self.m = msgs
        self.channel = grpc.insecure_channel(address)
        ser = lambda x: x.SerializeToString()
        md = [("authorization", f"Bearer {token}")] if token else None

        def with_token(call):
            return lambda req, timeout=None: call(req, timeout=timeout, metadata=md)
        self.classify = with_token(self.channel.unary_unary(
            SERVICE + "Classify", ser, msgs["ClassifyResponse"].FromString))
        self.score = with_token(self.channel.unary_unary(
            SERVICE + "Score", ser, msgs["ScoreResponse"].FromString))
        self.generate = with_token(self.channel.unary_stream(
            SERVICE + "Generate", ser, msgs["GenerateResponse"].FromString))

    def raw(self, pixels, h=28, w=28, c=1):
        im = self.m["Image"]()
        im.raw.pixels = pixels
        im.raw.height, im.raw.width, im.raw.channels = h, w, c
        return im

    def png_image(self, data):
        im = self.m["Image"]()
        im.png = data
        return im


def reference(client, images):
    """What the idle server answers to three fixed calls (compared bit for bit later)."""
    req = client.m["ClassifyRequest"](model="krause-vit-fmnist", return_probabilities=True)
    for px in images[:8]:
        req.images.append(client.raw(px))
    probs = [tuple(r.probabilities) for r in client.classify(req, timeout=30).results]
    gen = client.m["GenerateRequest"](model="karm-fmnist", num_images=1, seed=7)
    pngs = [g.png for msg in client.generate(gen, timeout=60) for g in msg.images]
    score = client.m["ScoreRequest"](model="karm-fmnist")
    for px in images[8:10]:
        score.images.append(client.raw(px))
    bits = tuple(client.score(score, timeout=30).bits_per_dim)
    return {"classify": probs, "generate": pngs, "score": bits}


def malformed(client, images, rnd):
    """A request the API must refuse with INVALID_ARGUMENT or NOT_FOUND (and nothing else)."""
    m = client.m
    kind = rnd.randrange(9)
    if kind == 0:  # wrong shape
        req = m["ClassifyRequest"]()
        req.images.append(client.raw(bytes(32 * 32), 32, 32, 1))
    elif kind == 1:  # junk PNG
        req = m["ClassifyRequest"]()
        req.images.append(client.png_image(os.urandom(rnd.randrange(1, 400))))
    elif kind == 2:  # a small PNG claiming 100000 x 100000 x 3
        req = m["ClassifyRequest"]()
        req.images.append(client.png_image(png(28, 28, [bytes(28)] * 28, 2, (100000, 100000))))
    elif kind == 3:  # a real PNG of the wrong size (a small bomb)
        req = m["ClassifyRequest"]()
        req.images.append(client.png_image(png(2000, 2000, [bytes(2000)] * 2000)))
    elif kind == 4:  # no images
        req = m["ClassifyRequest"]()
    elif kind == 5:  # too many images
        req = m["ClassifyRequest"]()
        for _ in range(40):
            req.images.append(client.raw(images[0]))
    elif kind == 6:  # unknown model
        req = m["ClassifyRequest"](model="no-such-model")
        req.images.append(client.raw(images[0]))
    elif kind == 7:  # raw size mismatch
        req = m["ClassifyRequest"]()
        req.images.append(client.raw(bytes(100)))
    else:  # a Generate with a bad prompt
        g = m["GenerateRequest"](model="karm-fmnist", prompt_rows=40)
        g.prompt.CopyFrom(client.raw(images[0]))
        return ("Generate", lambda: list(client.generate(g, timeout=10)), 10)
    return ("Classify", lambda: client.classify(req, timeout=10), 10)


def worker(address, desc, seconds, threads, seed, queue, token=""):
    msgs = messages(desc)
    client = Client(address, msgs, token)
    images = test_images(512)
    stats = {}
    violations = []
    lock = threading.Lock()
    end = time.time() + seconds

    def record(rpc, kind, code, elapsed, deadline):
        with lock:
            key = f"{rpc} {kind} {code}"
            stats[key] = stats.get(key, 0) + 1
            if elapsed > deadline + 5:
                violations.append(f"hang: {key} took {elapsed:.1f} s (deadline {deadline} s)")
            if code not in DOCUMENTED:
                violations.append(f"undocumented status: {key}")
            if kind == "malformed" and code not in ("INVALID_ARGUMENT", "NOT_FOUND"):
                violations.append(f"malformed request answered {code}: {rpc}")

    def run(rpc, kind, fn, deadline):
        t0 = time.time()
        try:
            fn()
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
        record(rpc, kind, code, time.time() - t0, deadline)

    def one(rnd):
        r = rnd.random()
        px = images[rnd.randrange(len(images))]
        m = msgs
        if r < 0.10:
            rpc, fn, d = malformed(client, images, rnd)
            return run(rpc, "malformed", fn, d)
        if r < 0.45:
            req = m["ClassifyRequest"]()
            for _ in range(rnd.choice([1, 1, 1, 4, 16])):
                req.images.append(client.raw(images[rnd.randrange(len(images))]))
            return run("Classify", "valid", lambda: client.classify(req, timeout=10), 10)
        if r < 0.52:  # deadlines of a few milliseconds
            req = m["ClassifyRequest"]()
            req.images.append(client.raw(px))
            t = rnd.choice([0.001, 0.003, 0.01])
            return run("Classify", "short-deadline", lambda: client.classify(req, timeout=t), t)
        if r < 0.62:
            req = m["GenerateRequest"](model="karm-fmnist", num_images=rnd.choice([1, 2]),
                                       seed=rnd.randrange(1 << 30))
            return run("Generate", "valid", lambda: list(client.generate(req, timeout=10)), 10)
        if r < 0.68:  # completion
            req = m["GenerateRequest"](model="karm-fmnist", prompt_rows=14, seed=3)
            req.prompt.CopyFrom(client.raw(px))
            return run("Generate", "complete", lambda: list(client.generate(req, timeout=10)), 10)
        if r < 0.76:  # cancelled after the first message
            req = m["GenerateRequest"](model="karm-fmnist", num_images=4, seed=5)
            def cancel_early():
                it = client.generate(req, timeout=10)
                next(it, None)
                it.cancel()
                list(it)
            return run("Generate", "cancelled", cancel_early, 10)
        if r < 0.82:  # a Generate deadline shorter than the image
            req = m["GenerateRequest"](model="karm-fmnist", num_images=2, seed=9)
            return run("Generate", "short-deadline",
                       lambda: list(client.generate(req, timeout=0.05)), 0.05)
        req = m["ScoreRequest"](model="karm-fmnist")
        for _ in range(rnd.choice([1, 2, 8])):
            req.images.append(client.raw(images[rnd.randrange(len(images))]))
        return run("Score", "valid", lambda: client.score(req, timeout=10), 10)

    def loop(i):
        rnd = random.Random(seed * 1000 + i)
        while time.time() < end:
            one(rnd)

    def never_reads(i):
        # 64 images a stream (more bytes than the HTTP/2 window), never read, held, cancelled.
        rnd = random.Random(seed * 7777 + i)
        while time.time() < end:
            req = msgs["GenerateRequest"](model="karm-fmnist", num_images=64,
                                          seed=rnd.randrange(1 << 30), update_interval_ms=10)
            t0 = time.time()
            it = client.generate(req, timeout=30)
            time.sleep(min(3.0, max(0.0, end - time.time())))
            it.cancel()
            code = "CANCELLED"
            try:
                for _ in it:
                    pass
            except grpc.RpcError as e:
                code = e.code().name
            record("Generate", "never-reads", code, time.time() - t0, 30)

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    pool += [threading.Thread(target=never_reads, args=(i,)) for i in range(2)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    queue.put((stats, violations))


def quiet_tenant(client, images, end, out):
    """The polite tenant: one call at a time, alternating a one-image Classify and a one-image
    Generate; every status and the longest call go to `out`."""
    rnd = random.Random(99)
    while time.time() < end:
        t0 = time.time()
        try:
            if rnd.random() < 0.5:
                req = client.m["ClassifyRequest"](model="krause-vit-fmnist")
                req.images.append(client.raw(images[rnd.randrange(len(images))]))
                client.classify(req, timeout=30)
                rpc = "Classify"
            else:
                req = client.m["GenerateRequest"](model="karm-fmnist", num_images=1,
                                                  seed=rnd.randrange(1 << 30))
                list(client.generate(req, timeout=30))
                rpc = "Generate"
            code = "OK"
        except grpc.RpcError as e:
            rpc, code = "call", e.code().name
        key = f"{rpc} {code}"
        out["statuses"][key] = out["statuses"].get(key, 0) + 1
        out["longest"] = max(out["longest"], time.time() - t0)


def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bin_dir")
    ap.add_argument("source_dir")
    ap.add_argument("--seconds", type=float, default=45)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--rss_mb", type=float, default=64)
    ap.add_argument("--json", default="")
    ap.add_argument("--tenants", action="store_true")
    args = ap.parse_args()
    args.bin_dir, args.source_dir = os.path.abspath(args.bin_dir), os.path.abspath(args.source_dir)

    tmp = tempfile.mkdtemp(prefix="krause-soak-")
    models = os.path.join(args.source_dir, "models")
    manifest = os.path.join(tmp, "manifest.json")
    json.dump({"models": [
        {"name": "krause-vit-fmnist", "checkpoint": f"{models}/krause_vit_fmnist.safetensors",
         "default": True, "max_batch_size": 32, "max_queued_images": 48,
         "max_images_per_request": 16},
        {"name": "karm-fmnist", "checkpoint": f"{models}/karm_fmnist.safetensors", "default": True,
         "max_sequences": 32, "max_waiting": 96, "max_images_per_request": 64}]},
        open(manifest, "w"))
    port, mport = free_port(), free_port()
    log = open(os.path.join(tmp, "server.log"), "w")
    flags = []
    flood_token = quiet_token = ""
    if args.tenants:
        # The flood's 2 queued calls (at most 2 x 64 generation images) leave the quiet tenant room
        # in every queue: a waiting room of 160 images, a classify queue of 48 (2 x 16 + 16).
        m = json.load(open(manifest))
        m["models"][1]["max_waiting"] = 160
        json.dump(m, open(manifest, "w"))
        tokens = os.path.join(tmp, "tokens")
        open(tokens, "w").write("tok-flood tenant=flood max_queued=2\ntok-quiet tenant=quiet\n")
        flags = [f"--auth_tokens={tokens}"]
        flood_token, quiet_token = "tok-flood", "tok-quiet"
    server = subprocess.Popen([os.path.join(args.bin_dir, "krause-server"), "--manifest", manifest,
                               f"--listen=127.0.0.1:{port}", f"--metrics_listen=127.0.0.1:{mport}",
                               "--http_listen=", "--drain_seconds=5"] + flags,
                              stdout=log, stderr=subprocess.STDOUT)
    failures = []
    address = f"127.0.0.1:{port}"
    desc = compile_api(args.source_dir, tmp)
    msgs = messages(desc)
    client = Client(address, msgs, quiet_token)
    try:
        grpc.channel_ready_future(client.channel).result(timeout=120)
    except grpc.FutureTimeoutError:
        print(f"soak: the server did not start (log: {log.name})", file=sys.stderr)
        return 1
    images = test_images(16)
    ref = None
    for _ in range(100):  # the models load after the port opens
        try:
            ref = reference(client, images)
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(0.2)
    rss_start = rss_mb(server.pid)

    # Spawned, not forked: this process already has a gRPC channel, and gRPC's threads do not
    # survive a fork.
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    t0 = time.time()
    procs = [ctx.Process(target=worker, args=(address, desc, args.seconds,
                                             args.threads, s, queue, flood_token))
             for s in range(args.processes)]
    for p in procs:
        p.start()
    quiet = {"statuses": {}, "longest": 0.0}
    quiet_thread = None
    if args.tenants:
        quiet_thread = threading.Thread(target=quiet_tenant,
                                        args=(client, test_images(64), t0 + args.seconds, quiet))
        quiet_thread.start()
    samples = []
    while any(p.is_alive() for p in procs):
        el = time.time() - t0
        if server.poll() is not None:
            failures.append(f"crash: the server exited with {server.returncode} during the load")
            break
        samples.append((el, rss_mb(server.pid)))
        print(f"\rsoak {min(100, 100 * el / args.seconds):5.1f}%  {el:5.0f} s elapsed, eta "
              f"{max(0, args.seconds - el):4.0f} s, server RSS {samples[-1][1]:6.0f} MB",
              end="", file=sys.stderr, flush=True)
        time.sleep(0.5)
    print(file=sys.stderr)
    stats, violations = {}, []
    for _ in procs:
        try:
            s, v = queue.get(timeout=60)
        except Exception:
            failures.append("a client process ended without a report")
            continue
        for k, n in s.items():
            stats[k] = stats.get(k, 0) + n
        violations += v
    for p in procs:
        p.join(timeout=30)
    if quiet_thread is not None:
        quiet_thread.join(timeout=60)
        bad = {k: n for k, n in quiet["statuses"].items() if not k.endswith(" OK")}
        if bad or not quiet["statuses"]:
            failures.append(f"the quiet tenant's calls: {quiet['statuses']} (only OK expected)")
        if quiet["longest"] > 10:
            failures.append(f"a quiet tenant's call took {quiet['longest']:.1f} s (bound 10 s)")
    duration = time.time() - t0
    failures += sorted(set(violations))

    warm = [r for t, r in samples if t <= 0.3 * args.seconds]
    after = [r for t, r in samples if t > 0.3 * args.seconds]
    warm_peak = max(warm) if warm else rss_start
    peak_after = max(after) if after else warm_peak
    if peak_after > warm_peak + args.rss_mb:
        failures.append(f"RSS grew after the warm-up: {warm_peak:.0f} -> {peak_after:.0f} MB "
                        f"(bound +{args.rss_mb:.0f} MB)")

    idle = None
    if server.poll() is None:
        for _ in range(150):  # 15 s
            g = scrape(mport)
            left = {k: g.get(k, 0) for k in ["krause_calls_in_flight", "krause_queued_images",
                                             "krause_active_sequences",
                                             "krause_kv_cache_slots_in_use"]}
            if all(v == 0 for v in left.values()):
                idle = left
                break
            time.sleep(0.1)
        if idle is None:
            failures.append(f"not idle 15 s after the load: {left}")
        again = reference(client, images)
        for k in ref:
            if again[k] != ref[k]:
                failures.append(f"{k}: the result after the load differs from the idle result")
    rss_end = rss_mb(server.pid) if server.poll() is None else 0
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            rc = server.wait(timeout=5 + 5)
            if rc != 0:
                failures.append(f"exit code {rc} after SIGTERM")
        except subprocess.TimeoutExpired:
            failures.append("no exit within drain + 5 s after SIGTERM")
            server.kill()

    calls = sum(stats.values())
    by_code = {}
    for k, n in stats.items():
        code = k.rsplit(" ", 1)[1]
        by_code[code] = by_code.get(code, 0) + n
    report = {"seconds": round(duration, 1), "calls": calls, "processes": args.processes,
              "threads_per_process": args.threads, "statuses": by_code, "mix": stats,
              "rss_mb": {"start": round(rss_start), "warmup_peak": round(warm_peak),
                         "peak_after_warmup": round(peak_after), "end": round(rss_end)},
              "failures": failures}
    if args.tenants:
        report["quiet_tenant"] = quiet
    print(f"soak: {calls} calls in {duration:.0f} s from {args.processes} processes x "
          f"{args.threads} threads (+2 never-reading streams each)")
    print("  statuses: " + ", ".join(f"{c} {n}" for c, n in sorted(by_code.items())))
    if args.tenants:
        print(f"  quiet tenant: {quiet['statuses']}, longest call {quiet['longest']:.2f} s")
    for k in sorted(stats):
        print(f"    {k}: {stats[k]}")
    print(f"  server RSS MB: start {rss_start:.0f}, warm-up peak {warm_peak:.0f}, peak after "
          f"warm-up {peak_after:.0f}, end {rss_end:.0f}")
    if args.json:
        json.dump(report, open(args.json, "w"), indent=1)
    if failures:
        print("soak: FAILED\n  " + "\n  ".join(failures))
        print(f"  (server log: {log.name})")
        return 1
    print("soak: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
