"""What the serving benchmarks share (serving_bench.py, http_bench.py, weights_bench.py,
paper_vit_bench.py): the statistics, a free port, the progress line with its ETA, the first test
image, the manifest they serve the bundled models with (the Krause ViT and the KARM, with queues
deep enough for their loads), a krause-server started on a manifest, and the report's output."""
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


def start_server(bin_dir, manifest, servers, timeout=300):
    """krause-server on `manifest` (loopback, a free port, no HTTP or metrics port), appended to
    `servers` (for stop); its gRPC address once it listens."""
    port_file = manifest + ".port"
    server = subprocess.Popen(
        [f"{bin_dir}/krause-server", "--manifest", manifest, "--listen", "127.0.0.1:0",
         "--port_file", port_file, "--http_listen", "", "--metrics_listen", "", "--quiet"])
    servers.append(server)
    deadline = time.time() + timeout
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if server.poll() is not None or time.time() > deadline:
            sys.exit(f"{bin_dir}/krause-server did not start")
        time.sleep(0.2)
    return "127.0.0.1:" + open(port_file).read().strip()


def report(text, runs, text_path="", json_path=""):
    """Prints the report's text; writes it (and the runs as JSON) where asked."""
    print(text)
    if text_path:
        with open(text_path, "w") as f:
            f.write(text + "\n")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(runs, f, indent=1)


def stop(server):
    """SIGTERM (a drain), then SIGKILL after 30 s."""
    if server is not None and server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
