"""krause_serve against real krause-server processes on the bundled models, checked against the
C++ client (krause-client) and the server's own metrics:
  - classify's probabilities equal krause-client's JSON output, for arrays, PIL images, paths
    and PNG bytes alike;
  - generated images (and the rows streamed) byte-equal krause-client's for the same settings;
  - leaving a generate loop early (sync or async) brings the server's cache slots back to 0;
  - a replica killed (SIGKILL) mid-stream, among two, still gives the undisturbed images;
  - bad input raises KrauseError with the field the server names;
  - AsyncClient runs concurrent calls with the same answers;
  - model control with admin tokens, and a refusal's google.rpc details (reason, model, delay).
Run by ctest `python_client` (scripts/python-client-test.sh installs the package first) with
KRAUSE_BIN_DIR and KRAUSE_SOURCE_DIR set.
"""
import asyncio
import gzip
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import numpy as np
import pytest
from PIL import Image

import krause_serve
from krause_serve import AsyncClient, Client, GeneratedImage, KrauseError, Rows

BIN = os.environ.get("KRAUSE_BIN_DIR", "build/bin")
SRC = os.environ.get("KRAUSE_SOURCE_DIR", ".")
FMNIST = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fashion_images(n):
    with gzip.open(FMNIST, "rb") as f:
        data = f.read()
    return np.frombuffer(data[16:16 + n * 784], dtype=np.uint8).reshape(n, 28, 28, 1)


class Server:
    """A krause-server process on the bundled models, with its gRPC and /metrics ports."""

    def __init__(self, models_dir=None, *flags, token=None):
        self.port, self.metrics = free_port(), free_port()
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "krause-server"), "--models_dir",
             models_dir or os.path.join(SRC, "models"), f"--listen=127.0.0.1:{self.port}",
             "--http_listen=", f"--metrics_listen=127.0.0.1:{self.metrics}", "--quiet",
             "--drain_seconds=1", *flags])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if Client(self.address, timeout=5, retries=0, token=token).models():
                    return
            except KrauseError:
                pass
            time.sleep(0.1)
        raise RuntimeError("krause-server did not start")

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def slots_in_use(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        return sum(float(v) for v in re.findall(
            r'^krause_kv_cache_slots_in_use\{[^}]*model="karm-fmnist"[^}]*\} (\S+)$', text, re.M))

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    with Client(server.address, timeout=60) as c:
        yield c


def cpp_client(server, *args, cwd=None):
    out = subprocess.run([os.path.join(BIN, "krause-client"), "--server", server.address,
                          "--progress=false"] + list(args), capture_output=True, text=True,
                         cwd=cwd, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_models(client):
    models = {m.name: m for m in client.models()}
    assert set(models) == {"krause-vit-fmnist", "vit-fmnist", "karm-fmnist", "arm-fmnist"}
    karm = client.model("karm-fmnist")
    assert karm == models["karm-fmnist"]
    assert (karm.kind, karm.attention, karm.shape, karm.classes) == ("generator", "krause", (28, 28, 1), 10)
    assert karm.labels[7] == "Sneaker" and 0 < karm.flop_saving < 1
    assert models["krause-vit-fmnist"].kernel_checks[0].result == "passed"
    assert karm.weights_dtype == "float32" and karm.cpu_kernels in ("base", "avx2", "avx512")


def test_classify_equals_the_cpp_client(server, client, tmp_path):
    images = fashion_images(4)
    paths = []
    for i, a in enumerate(images):
        paths.append(str(tmp_path / f"t{i}.png"))
        Image.fromarray(a[:, :, 0]).save(paths[-1])
    want = json.loads(cpp_client(server, "--json", "--top", "10", "classify", *paths))["results"]
    as_array = client.classify(images, top_k=10)
    answers = [as_array, client.classify(paths), client.classify([Image.open(p) for p in paths]),
               client.classify([open(p, "rb").read() for p in paths])]
    for got in answers:
        assert len(got) == 4 and got.model == "krause-vit-fmnist"
        for g, w in zip(got, want):
            assert g.label == w["top"][0]["label"]
            for t in w["top"]:  # every class (top 10 of 10): bit for bit, as float32
                assert g.probabilities[t["index"]] == np.float32(t["probability"])
    assert [s.index for s in as_array[0].top] == [t["index"] for t in want[0]["top"]]
    assert as_array.flops_executed > 0 and as_array.probabilities.shape == (4, 10)
    one = client.classify(images[0, :, :, 0])  # [H, W]
    assert one.labels == [want[0]["top"][0]["label"]]
    grey = client.classify(images[:, :, :, 0], top_k=10, priority=1)  # [N, H, W], as loaders give
    assert np.array_equal(grey.probabilities, as_array.probabilities)


def test_generated_images_equal_the_cpp_client(server, client, tmp_path):
    cpp_client(server, "generate", "--num", "3", "--seed", "11", "--label", "Sneaker",
               "--guidance", "2", "--top_p", "0.95", "--out", str(tmp_path), "--prefix", "s")
    events = list(client.generate(n=3, seed=11, label="Sneaker", guidance=2, top_p=0.95))
    images = [e for e in events if isinstance(e, GeneratedImage)]
    assert sorted(g.image for g in images) == [0, 1, 2]
    rows = {i: np.zeros((28, 28, 1), np.uint8) for i in range(3)}
    seen = {i: 0 for i in range(3)}
    for e in events:
        if isinstance(e, Rows):
            assert e.first_row == seen[e.image], "every row once, in order"
            rows[e.image][e.first_row:e.first_row + len(e.pixels)] = e.pixels
            seen[e.image] += len(e.pixels)
    for g in images:
        assert g.png == open(tmp_path / f"s-{g.image}.png", "rb").read(), f"image {g.image}"
        assert np.array_equal(g.array, rows[g.image]) and seen[g.image] == 28
    summary = events[-1]
    assert isinstance(summary, krause_serve.Summary) and summary.images == 3
    assert summary.seed == 11 and summary.resumed == 0
    # A completion of the top half: the prompt rows kept, the same as krause-client's.
    prompt = fashion_images(2)[1]
    Image.fromarray(prompt[:, :, 0]).save(tmp_path / "prompt.png")
    cpp_client(server, "complete", str(tmp_path / "prompt.png"), "--rows", "14", "--num", "2",
               "--seed", "5", "--out", str(tmp_path), "--prefix", "c")
    done = client.generate_images(n=2, seed=5, prompt=prompt, prompt_rows=14)
    for g in done:
        assert g.png == open(tmp_path / f"c-{g.image}.png", "rb").read()
        assert np.array_equal(g.array[:14], prompt[:14])


def test_leaving_the_loop_frees_the_cache_slots(server, client):
    held = 0
    for e in client.generate(n=16, seed=3):
        if isinstance(e, Rows):
            held = server.slots_in_use()
            break  # closes the generator: the call is cancelled
    assert held > 0, "the generation held cache slots while it ran"
    deadline = time.monotonic() + 5
    while server.slots_in_use() > 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.slots_in_use() == 0


def test_leaving_an_async_loop_frees_the_cache_slots(server):
    async def run():
        async with AsyncClient(server.address, timeout=60) as ac:
            held = 0
            async for e in ac.generate(n=16, seed=4):
                if isinstance(e, Rows):
                    held = server.slots_in_use()
                    break  # the abandoned async generator is closed: the call is cancelled
            deadline = time.monotonic() + 5
            while server.slots_in_use() > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return held, server.slots_in_use()

    held, after = asyncio.run(run())
    assert held > 0 and after == 0


def test_bad_input_raises_with_the_field(client):
    with pytest.raises(KrauseError) as e:
        client.classify(np.zeros((2, 2), np.uint8))
    assert e.value.code.name == "INVALID_ARGUMENT" and e.value.field == "images[0]"
    assert "28x28x1" in e.value.message
    with pytest.raises(KrauseError) as e:
        client.generate_images(label="Unicorn")
    assert e.value.field == "label" and "Unicorn" in e.value.message
    with pytest.raises(KrauseError) as e:
        client.generate_images(guidance=float("nan"), label="Bag")
    assert e.value.field == "guidance"
    with pytest.raises(KrauseError) as e:
        client.model("nope")
    assert e.value.code.name == "NOT_FOUND"
    with pytest.raises(TypeError):
        client.classify(np.zeros((28, 28), np.float32))
    with pytest.raises(KrauseError) as e:  # without a token: the default tenant, max_priority 1
        client.classify(np.zeros((28, 28), np.uint8), priority=2)
    assert e.value.code.name == "PERMISSION_DENIED" and "max_priority is 1" in e.value.message
    with pytest.raises(KrauseError) as e:
        client.generate_images(priority=3)
    assert e.value.code.name == "INVALID_ARGUMENT" and e.value.field == "priority"


def test_score_and_inspect(server, client):
    image = fashion_images(1)[0]
    s = client.score([image, image], label=["", "Ankle boot"])
    out = cpp_client(server, "--json", "score", "--label", "Ankle boot",
                     *[_png_file(image)])
    assert s.bits_per_dim.shape == (2,) and s.bits_per_dim[1] < s.bits_per_dim[0]
    assert abs(json.loads(out)["results"][0]["bits_per_dim"] - s.bits_per_dim[1]) < 1e-9
    ins = client.inspect(image, layers=[2], heads=[1], queries=[0, 26])
    (layer,) = ins.layers
    (head,) = layer.heads
    assert layer.layer == 2 and head.head == 1 and list(ins.queries) == [0, 26]
    assert head.keys.shape == (2, layer.keys_per_query) and (head.keys >= 0).all()
    assert np.all(head.weights > 0) and ins.grid == (7, 7)


def _png_file(pixels):
    path = tempfile.mktemp(suffix=".png")
    Image.fromarray(pixels[:, :, 0]).save(path)
    return path


def test_async_client_runs_concurrent_calls(server, client):
    images = fashion_images(8)
    want_classes = client.classify(images).probabilities
    want_images = [g.png for g in client.generate_images(n=2, seed=21, label="Bag")]

    async def run():
        async with AsyncClient(server.address, timeout=60) as ac:
            calls = [ac.classify(images[i]) for i in range(8)]
            calls += [ac.generate_images(n=2, seed=21, label="Bag") for _ in range(2)]
            calls.append(ac.models())
            return await asyncio.gather(*calls)

    got = asyncio.run(run())
    for i in range(8):
        assert np.array_equal(got[i].probabilities[0], want_classes[i])
    for g in got[8:10]:
        assert [x.png for x in g] == want_images
    assert len(got[10]) == 4


def test_a_replica_killed_mid_stream_gives_the_undisturbed_images():
    a, b = Server(), Server()
    try:
        settings = dict(n=16, seed=99, label="Dress", update_interval_ms=10)
        with Client([a.address, b.address], timeout=120, attempt_timeout=30) as c:
            killed = None
            images = {}
            summary = None
            for e in c.generate(**settings):
                if isinstance(e, Rows) and killed is None:
                    killed = a if a.slots_in_use() > 0 else b
                    killed.stop(signal.SIGKILL)
                elif isinstance(e, GeneratedImage):
                    images[e.image] = e.png
                elif isinstance(e, krause_serve.Summary):
                    summary = e
        survivor = b if killed is a else a
        assert killed is not None and summary.resumed >= 1, summary
        with Client(survivor.address, timeout=120) as c:
            want = [g.png for g in c.generate_images(**settings)]
        assert [images[i] for i in range(16)] == want
    finally:
        a.stop(signal.SIGKILL)
        b.stop(signal.SIGKILL)


def test_model_control(tmp_path):
    repo = tmp_path / "repo"
    for version, file in [(1, "krause_vit_fmnist"), (2, "vit_fmnist")]:
        (repo / "vit" / str(version)).mkdir(parents=True)
        os.symlink(os.path.join(os.path.abspath(SRC), "models", file + ".safetensors"),
                   repo / "vit" / str(version) / "model.safetensors")
    (tmp_path / "serve").write_text("serve-token\n")
    (tmp_path / "admin").write_text("admin-token\n")
    s = Server(str(repo), "--model_control=explicit", "--load_model=*",
               f"--auth_tokens={tmp_path / 'serve'}", f"--admin_tokens={tmp_path / 'admin'}",
               token="admin-token")
    try:
        image = fashion_images(1)[0]
        with Client(s.address, token="serve-token", timeout=60, retries=0) as user, \
                Client(s.address, token="admin-token", timeout=60) as admin:
            with pytest.raises(KrauseError) as e:
                user.unload_model("vit")
            assert e.value.code.name == "PERMISSION_DENIED"
            ready = [(v.name, v.version) for v in admin.repository_index(ready=True)]
            assert ("vit", "2") in ready
            assert user.classify(image, model="vit").model_version == "2"
            after = admin.unload_model("vit")
            assert after and all(v.state != "READY" for v in after)
            with pytest.raises(KrauseError) as e:
                user.classify(image, model="vit")
            # The refusal's google.rpc details, read: ErrorInfo's reason and model, RetryInfo.
            assert (e.value.code.name, e.value.reason, e.value.metadata) == (
                "UNAVAILABLE", "MODEL_UNLOADED", {"model": "vit"})
            assert e.value.retry_delay is not None and e.value.retryable
            loaded = admin.load_model("vit", version="1")
            assert ("1", "READY") in [(v.version, v.state) for v in loaded]
            assert user.classify(image, model="vit", version="1").model_version == "1"
    finally:
        s.stop()
