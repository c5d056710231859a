#!/usr/bin/env python3
"""OpenAI's Images API driven by the official `openai` SDK from npm (tests/openai_sdk/: Node.js,
the package installed by scripts/install-node-deps.sh): against krause-server on the bundled
models with a token, `images.generate` with n 2, seed 7 and prompt "Sneaker" gives PNGs
byte-identical to `krause-client generate --label Sneaker --num 2 --seed 7`'s; a streamed call
yields partial images then the completed one; an unknown label and a wrong size come back as the
SDK's BadRequestError naming the param; a wrong token as its AuthenticationError.

    openai_sdk_test.py BIN_DIR SOURCE_DIR

Exits 77 (skipped) when Node.js 20 or the SDK is not installed, saying which.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from e2e import check, free_port, report, wait_ready

BIN, SRC = sys.argv[1], sys.argv[2]
SDK = os.path.join(SRC, "tests", "openai_sdk")
TOKEN = "sdk-test-token"


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
        env = dict(os.environ, BASE_URL=f"http://127.0.0.1:{hport}/v1", TOKEN=TOKEN, OUT=tmp)
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
