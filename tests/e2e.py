"""What the Python end-to-end tests share (oip_e2e_test.py, web_ui_test.py): a check list, free
ports, krause.v1 and other message classes built at run time from a .proto (no generated code
of the server's), Fashion-MNIST test images, a plain grey PNG writer, a Generate stream's images, and waiting for
a server.
"""
import gzip
import os
import socket
import struct
import subprocess
import time
import urllib.request
import zlib

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

FMNIST = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def report(what):
    """The exit status of a test script: 0 when every check passed."""
    if failures:
        print(f"{len(failures)} failure(s):\n  " + "\n  ".join(failures))
        return 1
    print(f"all {what} checks passed")
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def classes(tmp, proto_dir, proto, package, names):
    """Message classes of `package` by name, from `proto` compiled by protoc at run time."""
    desc = os.path.join(tmp, os.path.basename(proto) + ".desc")
    subprocess.run(["protoc", "--include_imports", f"--descriptor_set_out={desc}", "-I", proto_dir,
                    proto], check=True)
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(open(desc, "rb").read()).file:
        pool.Add(f)
    factory = message_factory.MessageFactory(pool)
    return {n: factory.GetPrototype(pool.FindMessageTypeByName(f"{package}.{n}")) for n in names}


def test_images(n):
    """The first n Fashion-MNIST test images, 784 bytes each (28x28 grey)."""
    with gzip.open(FMNIST, "rb") as f:
        data = f.read()
    _, rows, cols = struct.unpack(">III", data[4:16])
    return [data[16 + i * rows * cols:16 + (i + 1) * rows * cols] for i in range(n)]


def png(width, height, pixels):
    """An 8-bit grey PNG of the pixels (row-major), written from the format's layout."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    raw = b"".join(b"\0" + pixels[r * width:(r + 1) * width] for r in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def collect_generation(messages, n, row_bytes=28):
    """A krause.v1 Generate stream's n images: each image's pixels from its rows, and its PNG and
    seed by image index."""
    pixels = [bytearray(28 * row_bytes) for _ in range(n)]
    pngs, seeds = {}, {}
    for msg in messages:
        for r in msg.rows:
            pixels[r.image][r.first_row * row_bytes:(r.first_row + r.num_rows) * row_bytes] = r.pixels
        for im in msg.images:
            pngs[im.image], seeds[im.image] = im.png, im.seed
    return [bytes(p) for p in pixels], pngs, seeds


def wait_ready(rest, seconds=60):
    """Waits until the server at `rest` (http://host:port) answers /v2/health/ready with 200."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(rest + "/v2/health/ready", timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False
