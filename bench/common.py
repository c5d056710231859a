"""What the serving benchmarks share (serving_bench.py, http_bench.py): the statistics, a free
port, the progress line with its ETA, the first test image, and the manifest they serve the bundled models with (the
Krause ViT and the KARM, with queues deep enough for their loads)."""
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"  # Debian's test images


def first_test_image():
    """The first Fashion-MNIST test image's 784 bytes (28x28 grey)."""
    with gzip.open(FMNIST, "rb") as f:
        return f.read()[16:16 + 784]


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Progress:
    """"[step/steps] what  (elapsed, eta)" on stderr, one line per step."""

    def __init__(self):
        self.start = time.time()
        self.step = 0

    def __call__(self, what, steps):
        self.step += 1
        elapsed = time.time() - self.start
        eta = elapsed / (self.step - 1) * (steps - self.step + 1) if self.step > 1 else 0
        print(f"[{self.step}/{steps}] {what}  ({elapsed:.0f} s elapsed, eta {eta:.0f} s)",
              file=sys.stderr, flush=True)


def write_manifest(folder):
    """The benchmarks' manifest in `folder`; its path."""
    m = os.path.join(ROOT, "models")
    manifest = {"models": [
        {"name": "krause-vit-fmnist", "checkpoint": f"{m}/krause_vit_fmnist.safetensors",
         "default": True, "max_queued_images": 4096},
        {"name": "karm-fmnist", "checkpoint": f"{m}/karm_fmnist.safetensors",
         "default": True, "max_sequences": 128, "max_waiting": 1024}]}
    path = os.path.join(folder, "manifest.json")
    with open(path, "w") as f:
        json.dump(manifest, f)
    return path


def stop(server):
    """SIGTERM (a drain), then SIGKILL after 30 s."""
    if server is not None and server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
