#!/usr/bin/env python3
"""OpenAI's Images API driven by the official `openai` SDK from npm (tests/openai_sdk/: Node.js,
the package installed by scripts/install-node-deps.sh): against krause-server on the bundled
models with a token, `images.generate` with n 2, seed 7 and prompt "Sneaker" gives PNGs
byte-identical to `krause-client generate --label Sneaker --num 2 --seed 7`'s; a streamed call
yields partial images then the completed one; `images.edit` of the first image with a mask whose
bottom 14 rows are transparent gives `krause-client complete --rows 14`'s PNG; an unknown label and a wrong size come back as the
SDK's BadRequestError naming the param; a wrong token as its AuthenticationError.

    openai_sdk_test.py BIN_DIR SOURCE_DIR

Exits 77 (skipped) when Node.js 20 or the SDK is not installed, saying which.
"""
import json
import os
import shutil
import subprocess
import sys
import struct
import tempfile
import zlib

from e2e import check, free_port, report, wait_ready

BIN, SRC = sys.argv[1], sys.argv[2]
SDK = os.path.join(SRC, "tests", "openai_sdk")
TOKEN = "sdk-test-token"


def gray_alpha_png(alpha_rows):
    """A PNG of gray 0 and, per row, the alpha in `alpha_rows` (8-bit gray and alpha)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    width = 28
    raw = b"".join(b"\0" + bytes([0, a]) * width for a in alpha_rows)
    return (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", width, len(alpha_rows), 8, 4, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def main():
    node = shutil.which("node")
    if node is None:
        print("skipped: no node (Node.js 20) on PATH")
        return 77
    major = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
    if not major.startswith("v") or int(major[1:].split(".")[0]) < 20:
        print(f"skipped: node {major.strip()} is older than 20")
        return 77
    if not os.path.isdir(os.path.join(SDK, "node_modules", "openai")):
        print("skipped: the SDK is not installed (scripts/install-node-deps.sh)")
        return 77
    tmp = tempfile.mkdtemp(prefix="openai-sdk-")
    tokens = os.path.join(tmp, "tokens")
    open(tokens, "w").write(TOKEN + "\n")
    port, hport = free_port(), free_port()
    server = subprocess.Popen(
        [os.path.join(BIN, "krause-server"), "--models_dir", os.path.join(SRC, "models"),
         f"--listen=127.0.0.1:{port}", f"--http_listen=127.0.0.1:{hport}", "--metrics_listen=",
         f"--auth_tokens={tokens}", "--drain_seconds=2", "--quiet"])
    try:
        check(wait_ready(f"http://127.0.0.1:{hport}"), "the server is ready")
        subprocess.run([os.path.join(BIN, "krause-client"), "--server", f"127.0.0.1:{port}",
                        "--token", TOKEN, "generate", "--label", "Sneaker", "--num", "2",
                        "--seed", "7", "--out", tmp, "--prefix", "client"],
                       check=True, stdout=subprocess.DEVNULL)
        mask = os.path.join(tmp, "mask.png")
        open(mask, "wb").write(gray_alpha_png([255] * 14 + [0] * 14))
        subprocess.run([os.path.join(BIN, "krause-client"), "--server", f"127.0.0.1:{port}",
                        "--token", TOKEN, "complete", os.path.join(tmp, "client-0.png"),
                        "--rows", "14", "--label", "Sneaker", "--seed", "7", "--out", tmp,
                        "--prefix", "complete"], check=True, stdout=subprocess.DEVNULL)
        env = dict(os.environ, BASE_URL=f"http://127.0.0.1:{hport}/v1", TOKEN=TOKEN, OUT=tmp,
                   EDIT_IMAGE=os.path.join(tmp, "client-0.png"), EDIT_MASK=mask)
        run = subprocess.run([node, os.path.join(SDK, "sdk_test.mjs")], cwd=SDK, env=env,
                             capture_output=True, text=True, timeout=120)
        check(run.returncode == 0, f"the SDK script ran (exit {run.returncode}) {run.stderr[-800:]}")
        lines = [line for line in run.stdout.split("\n") if line.strip()]
        steps = {s["step"]: s for s in map(json.loads, lines)} if run.returncode == 0 else {}
        read = lambda name: open(os.path.join(tmp, name), "rb").read()
        gen = steps.get("generate", {})
        check(gen.get("images") == 2 and gen.get("output_tokens") == 2 * 784,
              f"images.generate: 2 images, 1568 tokens ({gen})")
        for i in range(2):
            same = os.path.exists(os.path.join(tmp, f"sdk-{i}.png")) and \
                read(f"sdk-{i}.png") == read(f"client-{i}.png")
            check(same, f"image {i}: the SDK's PNG is byte-identical to krause-client's")
        events = [e["type"] for e in steps.get("stream", {}).get("events", [])]
        check(events == ["image_generation.partial_image"] * 2 + ["image_generation.completed"],
              f"a stream: two partial images, then the completed one ({events})")
        edit = steps.get("edit", {})
        check(edit.get("images") == 1 and
              edit.get("usage", {}).get("input_tokens") == 14 * 28 and
              edit.get("usage", {}).get("output_tokens") == 14 * 28,
              f"images.edit: 1 image, 14 rows kept and 14 sampled ({edit})")
        same = os.path.exists(os.path.join(tmp, "sdk-edit.png")) and \
            read("sdk-edit.png") == read("complete-0.png")
        check(same, "images.edit: the PNG is byte-identical to krause-client complete's")
        for step, param in (("unknown label", "prompt"), ("wrong size", "size")):
            e = steps.get(step, {})
            check(e.get("error") == "BadRequestError" and e.get("status") == 400 and
                  e.get("param") == param, f"{step}: BadRequestError naming {param} ({e})")
        e = steps.get("wrong token", {})
        check(e.get("error") == "AuthenticationError" and e.get("status") == 401,
              f"a wrong token: AuthenticationError ({e})")
    finally:
        server.terminate()
        server.wait(timeout=30)
    return report("OpenAI SDK")


if __name__ == "__main__":
    sys.exit(main())
