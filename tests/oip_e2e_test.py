#!/usr/bin/python3
"""The Open Inference Protocol (KServe v2) end to end, from clients that share nothing with the
server's gRPC stack or generated code: Debian's Python grpcio with message classes built at run
time from tests/oip/predict_v2_client.proto (written from the protocol's field table, not the
server's proto/inference file), and urllib / raw sockets for REST.

Against a real krause-server on the bundled models, with bearer tokens on:
  - every gRPC RPC and REST endpoint answers as the protocol says (probes without a token);
  - classifier probabilities equal native Classify's bit for bit (raw, typed and PNG inputs,
    gRPC and REST); the label is native's top-1;
  - generated images are byte-identical to native Generate's for the same seed and class, also
    with the numbers sent as int64, uint64 or double parameters;
  - bits/dim equal native Score's;
  - each bad input gets INVALID_ARGUMENT / 400 naming the tensor or parameter (unknown model or
    version: NOT_FOUND / 404; no token: UNAUTHENTICATED / 401; malformed JSON 400; a body over
    the limit 413; a slow body 408);
  - a request beside 200 idle REST connections is answered within 1 s;
  - the metrics count the calls with their protocol label, the request log names the protocol,
    and reflection lists inference.GRPCInferenceService.

Usage: oip_e2e_test.py BIN_DIR SOURCE_DIR
"""
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import grpc

from e2e import (check, classes, collect_generation, free_port, png, report, test_images,
                 wait_ready)
from oip_extensions import AUTH, TOKEN, check_extensions

BIN, SRC = sys.argv[1], sys.argv[2]


def main():
    tmp = tempfile.mkdtemp(prefix="oip-e2e-")
    oip = classes(tmp, os.path.join(SRC, "tests", "oip"), "predict_v2_client.proto", "inference",
                  ["ServerLiveRequest", "ServerLiveResponse", "ServerReadyRequest",
                   "ServerReadyResponse", "ModelReadyRequest", "ModelReadyResponse",
                   "ServerMetadataRequest", "ServerMetadataResponse", "ModelMetadataRequest",
                   "ModelMetadataResponse", "ModelInferRequest", "ModelInferResponse"])
    native = classes(tmp, os.path.join(SRC, "proto"), "krause/v1/krause.proto", "krause.v1",
                     ["ClassifyRequest", "ClassifyResponse", "GenerateRequest", "GenerateResponse",
                      "ScoreRequest", "ScoreResponse"])
    tokens = os.path.join(tmp, "tokens")
    open(tokens, "w").write(TOKEN + "\n")
    port, hport, mport = free_port(), free_port(), free_port()
    log_path = os.path.join(tmp, "requests.log")
    server = subprocess.Popen(
        [os.path.join(BIN, "krause-server"), "--models_dir", os.path.join(SRC, "models"),
         f"--listen=127.0.0.1:{port}", f"--http_listen=127.0.0.1:{hport}",
         f"--metrics_listen=127.0.0.1:{mport}", f"--auth_tokens={tokens}", "--threads=2",
         "--max_message_bytes=4194304", "--http_timeout_ms=1500", f"--request_log={log_path}",
         "--drain_seconds=2", "--quiet"])
    try:
        run(oip, native, port, hport, mport, log_path)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return report("OIP")


def run(oip, native, port, hport, mport, log_path):
    rest = f"http://127.0.0.1:{hport}"

    def http(method, path, body=None, token=True, raw=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(rest + path, data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {TOKEN}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, {"raw": text.decode(errors="replace")}

    wait_ready(rest)  # the models load after the ports open
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    ser = lambda m: m.SerializeToString()

    def rpc(name, resp, service="/inference.GRPCInferenceService/"):
        return channel.unary_unary(service + name, ser, resp.FromString)

    live = rpc("ServerLive", oip["ServerLiveResponse"])
    ready = rpc("ServerReady", oip["ServerReadyResponse"])
    model_ready = rpc("ModelReady", oip["ModelReadyResponse"])
    server_md = rpc("ServerMetadata", oip["ServerMetadataResponse"])
    model_md = rpc("ModelMetadata", oip["ModelMetadataResponse"])
    infer = rpc("ModelInfer", oip["ModelInferResponse"])
    classify = rpc("Classify", native["ClassifyResponse"], "/krause.v1.KrauseService/")
    score = rpc("Score", native["ScoreResponse"], "/krause.v1.KrauseService/")
    generate = channel.unary_stream("/krause.v1.KrauseService/Generate", ser,
                                    native["GenerateResponse"].FromString)

    def code_of(fn, req, metadata=AUTH):
        try:
            fn(req, metadata=metadata, timeout=60)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details()

    # --- probes and metadata (gRPC) ---
    check(live(oip["ServerLiveRequest"](), timeout=10).live, "gRPC ServerLive: live, no token")
    check(ready(oip["ServerReadyRequest"](), timeout=10).ready, "gRPC ServerReady: ready")
    check(model_ready(oip["ModelReadyRequest"](name="krause-vit-fmnist"), timeout=10).ready,
          "gRPC ModelReady: the classifier is ready")
    check(model_ready(oip["ModelReadyRequest"](name="karm-fmnist", version="1"), timeout=10).ready,
          "gRPC ModelReady: the generator at version 1 is ready")
    c, _ = code_of(model_ready, oip["ModelReadyRequest"](name="nope"))
    check(c == grpc.StatusCode.NOT_FOUND, f"gRPC ModelReady of an unknown model: NOT_FOUND ({c})")
    c, _ = code_of(server_md, oip["ServerMetadataRequest"](), metadata=[])
    check(c == grpc.StatusCode.UNAUTHENTICATED, f"gRPC ServerMetadata without a token: {c}")
    smd = server_md(oip["ServerMetadataRequest"](), metadata=AUTH, timeout=10)
    check(smd.name == "krause-serve" and smd.version != "",
          f"gRPC ServerMetadata: {smd.name} {smd.version} extensions {list(smd.extensions)}")
    md = model_md(oip["ModelMetadataRequest"](name="krause-vit-fmnist"), metadata=AUTH, timeout=10)
    tensors = lambda ts: [(t.name, t.datatype, list(t.shape)) for t in ts]
    check(tensors(md.inputs) == [("image", "UINT8", [-1, 28, 28, 1])] and
          tensors(md.outputs) == [("probabilities", "FP32", [-1, 10]), ("label", "BYTES", [-1])] and
          list(md.versions) == ["1"], f"gRPC ModelMetadata of the classifier: {md}".replace("\n", " "))
    gmd = model_md(oip["ModelMetadataRequest"](name="karm-fmnist"), metadata=AUTH, timeout=10)
    check(("images", "UINT8", [-1, 28, 28, 1]) in tensors(gmd.outputs) and
          ("bits_per_dim", "FP64", [-1]) in tensors(gmd.outputs),
          "gRPC ModelMetadata of the generator: images and bits_per_dim")
    c, _ = code_of(model_md, oip["ModelMetadataRequest"](name="krause-vit-fmnist", version="2"))
    check(c == grpc.StatusCode.NOT_FOUND, f"gRPC ModelMetadata of an unknown version: {c}")

    # --- classify: native vs OIP raw, typed, PNG ---
    images = test_images(6)
    nreq = native["ClassifyRequest"](model="krause-vit-fmnist", return_probabilities=True)
    for px in images:
        im = nreq.images.add()
        im.raw.pixels, im.raw.height, im.raw.width, im.raw.channels = px, 28, 28, 1
    nres = classify(nreq, metadata=AUTH, timeout=60)
    want = want_probs = [list(r.probabilities) for r in nres.results]
    want_labels = [r.top[0].label for r in nres.results]

    def image_input(req, n=len(images), datatype="UINT8", shape=None):
        t = req.inputs.add(name="image", datatype=datatype)
        t.shape.extend(shape or [n, 28, 28, 1])
        return t

    def probs_of(res):
        out = {o.name: (o, res.raw_output_contents[i]) for i, o in enumerate(res.outputs)}
        o, raw = out["probabilities"]
        flat = struct.unpack(f"<{len(raw) // 4}f", raw)
        rows = [list(flat[i * o.shape[1]:(i + 1) * o.shape[1]]) for i in range(o.shape[0])]
        labels = []
        if "label" in out:
            raw = out["label"][1]
            at = 0
            while at < len(raw):
                (n,) = struct.unpack("<I", raw[at:at + 4])
                labels.append(raw[at + 4:at + 4 + n].decode())
                at += 4 + n
        return rows, labels

    req = oip["ModelInferRequest"](model_name="krause-vit-fmnist", id="raw-1")
    image_input(req)
    req.raw_input_contents.append(b"".join(images))
    res = infer(req, metadata=AUTH, timeout=60)
    got, labels = probs_of(res)
    check(got == want, "gRPC ModelInfer (raw) probabilities equal native Classify's bit for bit")
    check(labels == want_labels, f"gRPC ModelInfer labels are native's top-1: {labels}")
    check(res.id == "raw-1" and res.model_name == "krause-vit-fmnist" and res.model_version == "1",
          "gRPC ModelInfer echoes the id, names the model and version 1")
    check(len(res.raw_output_contents) == len(res.outputs) and
          not any(o.HasField("contents") for o in res.outputs),
          "gRPC ModelInfer answers in raw_output_contents")
    req = oip["ModelInferRequest"](model_name="krause-vit-fmnist")
    image_input(req).contents.uint_contents.extend(b"".join(images))
    got_typed, _ = probs_of(infer(req, metadata=AUTH, timeout=60))
    check(got_typed == want, "gRPC ModelInfer (typed uint_contents) equals native")
    req = oip["ModelInferRequest"](model_name="krause-vit-fmnist")
    req.outputs.add(name="probabilities")
    image_input(req, datatype="BYTES", shape=[len(images)]).contents.bytes_contents.extend(
        [png(28, 28, px) for px in images])
    res = infer(req, metadata=AUTH, timeout=60)
    got_png, _ = probs_of(res)
    check(got_png == want and [o.name for o in res.outputs] == ["probabilities"],
          "gRPC ModelInfer (BYTES PNGs, only probabilities requested) equals native")

    # --- generate: native vs OIP, parameters as each numeric type ---
    def native_images(seed, n, class_index=None, guidance=None, model="karm-fmnist"):
        g = native["GenerateRequest"](model=model, num_images=n, seed=seed, stream_rows=True)
        if class_index is not None:
            g.class_index = class_index
        if guidance is not None:
            g.guidance = guidance
        pixels, _, _ = collect_generation(generate(g, metadata=AUTH, timeout=120), n)
        return b"".join(pixels)

    def param(req, name, kind, value):
        setattr(req.parameters[name], kind, value)

    def oip_images(res):
        (o,) = res.outputs
        return list(o.shape), o.datatype, res.raw_output_contents[0]

    want = native_images(1234, 3, class_index=3, guidance=2.0)
    req = oip["ModelInferRequest"](model_name="karm-fmnist")
    param(req, "seed", "uint64_param", 1234)
    param(req, "guidance", "double_param", 2.0)
    t = req.inputs.add(name="class_index", datatype="INT32", shape=[3])
    t.contents.int_contents.extend([3, 3, 3])
    shape, dtype, got = oip_images(infer(req, metadata=AUTH, timeout=120))
    check(shape == [3, 28, 28, 1] and dtype == "UINT8" and got == want,
          "gRPC ModelInfer generation (seed uint64, guidance double, class_index typed) is "
          "byte-identical to native Generate")
    want = native_images(99, 2)
    req = oip["ModelInferRequest"](model_name="karm-fmnist")
    param(req, "seed", "int64_param", 99)
    param(req, "num_images", "double_param", 2.0)
    param(req, "temperature", "int64_param", 1)
    shape, _, got = oip_images(infer(req, metadata=AUTH, timeout=120))
    check(shape == [2, 28, 28, 1] and got == want,
          "gRPC ModelInfer generation (seed int64, num_images double, no class) equals native")

    # --- score ---
    sreq = native["ScoreRequest"](model="karm-fmnist", class_indices=[1, -1, 7])
    for px in images[:3]:
        im = sreq.images.add()
        im.raw.pixels, im.raw.height, im.raw.width, im.raw.channels = px, 28, 28, 1
    want_bits = list(score(sreq, metadata=AUTH, timeout=60).bits_per_dim)
    req = oip["ModelInferRequest"](model_name="karm-fmnist")
    image_input(req, 3)
    t = req.inputs.add(name="class_index", datatype="INT32", shape=[3])
    req.raw_input_contents.extend([b"".join(images[:3]), struct.pack("<3i", 1, -1, 7)])
    res = infer(req, metadata=AUTH, timeout=60)
    got_bits = list(struct.unpack("<3d", res.raw_output_contents[0]))
    check(res.outputs[0].name == "bits_per_dim" and res.outputs[0].datatype == "FP64" and
          got_bits == want_bits, f"gRPC ModelInfer scoring equals native Score: {got_bits}")

    # --- bad input over gRPC ---
    def bad(what, build, want_code=grpc.StatusCode.INVALID_ARGUMENT, needle=""):
        req = oip["ModelInferRequest"](model_name="krause-vit-fmnist")
        build(req)
        c, msg = code_of(infer, req)
        check(c == want_code and needle in msg, f"gRPC bad input, {what}: {c.name} \"{msg}\"")

    px = images[0]
    bad("wrong datatype", lambda r: (image_input(r, 1, "FP32"), r.raw_input_contents.append(bytes(3136))),
        needle="datatype FP32")
    bad("wrong shape", lambda r: (image_input(r, 1, shape=[1, 27, 28, 1]),
                                  r.raw_input_contents.append(px[:756])), needle="shape")
    bad("byte count", lambda r: (image_input(r, 1), r.raw_input_contents.append(px[:783])),
        needle="783 bytes")
    bad("unknown input name", lambda r: (r.inputs.add(name="pixels", datatype="UINT8", shape=[1]),
                                         r.raw_input_contents.append(b"\0")),
        needle="unknown input \"pixels\"")
    bad("missing input", lambda r: None, needle="input image is missing")
    bad("raw and typed contents", lambda r: (image_input(r, 1).contents.uint_contents.extend(px),
                                             r.raw_input_contents.append(px)),
        needle="raw_input_contents")
    bad("a PNG that does not decode",
        lambda r: image_input(r, 1, "BYTES", [1]).contents.bytes_contents.append(b"\x89PNGjunk"),
        needle="not a readable PNG")
    bad("a PNG of the wrong size",
        lambda r: image_input(r, 1, "BYTES", [1]).contents.bytes_contents.append(png(14, 14, bytes(196))),
        needle="takes 28x28x1")
    bad("an unknown parameter", lambda r: (param(r, "temperature", "double_param", 0.5),
                                          image_input(r, 1), r.raw_input_contents.append(px)),
        needle="unknown parameter \"temperature\"")

    def gen_bad(what, build, needle):
        req = oip["ModelInferRequest"](model_name="karm-fmnist")
        build(req)
        c, msg = code_of(infer, req)
        check(c == grpc.StatusCode.INVALID_ARGUMENT and needle in msg,
              f"gRPC bad input, {what}: {c.name} \"{msg}\"")

    gen_bad("a parameter of the wrong type", lambda r: param(r, "seed", "string_param", "7"),
            "parameter seed must be an integer")
    gen_bad("a sampling parameter out of range", lambda r: param(r, "top_p", "double_param", 2.0),
            "top_p")
    gen_bad("guidance without a class", lambda r: param(r, "guidance", "double_param", 2.0),
            "guidance")
    gen_bad("too many images", lambda r: param(r, "num_images", "int64_param", 1000), "num_images")
    c, _ = code_of(infer, oip["ModelInferRequest"](model_name="nope"))
    check(c == grpc.StatusCode.NOT_FOUND, f"gRPC ModelInfer of an unknown model: {c}")
    c, _ = code_of(infer, oip["ModelInferRequest"](model_name="krause-vit-fmnist",
                                                   model_version="7"))
    check(c == grpc.StatusCode.NOT_FOUND, f"gRPC ModelInfer of an unknown version: {c}")
    c, _ = code_of(infer, oip["ModelInferRequest"](model_name="krause-vit-fmnist"), metadata=[])
    check(c == grpc.StatusCode.UNAUTHENTICATED, f"gRPC ModelInfer without a token: {c}")

    # --- REST ---
    s, body = http("GET", "/v2/health/live", token=False)
    check(s == 200 and body == {"live": True}, f"REST /v2/health/live without a token: {s} {body}")
    s, body = http("GET", "/v2/health/ready", token=False)
    check(s == 200 and body == {"ready": True}, f"REST /v2/health/ready: {s} {body}")
    s, body = http("GET", "/v2")
    check(s == 200 and body["name"] == "krause-serve" and
          body["extensions"] == ["binary_tensor_data", "classification", "model_repository",
                                 "statistics"],
          f"REST /v2 lists exactly the extensions served: {s} {body}")
    s, body = http("GET", "/v2", token=False)
    check(s == 401 and "error" in body, f"REST /v2 without a token: {s} {body}")
    s, body = http("GET", "/v2/models/krause-vit-fmnist")
    check(s == 200 and body["inputs"] == [{"name": "image", "datatype": "UINT8",
                                          "shape": [-1, 28, 28, 1]}] and body["versions"] == ["1"],
          f"REST model metadata: {s}")
    s, _ = http("GET", "/v2/models/krause-vit-fmnist/versions/1")
    check(s == 200, f"REST model metadata at version 1: {s}")
    s, body = http("GET", "/v2/models/krause-vit-fmnist/versions/2")
    check(s == 404 and "version" in body.get("error", ""), f"REST unknown version: {s} {body}")
    s, body = http("GET", "/v2/models/nope")
    check(s == 404 and "error" in body, f"REST unknown model: {s} {body}")
    s, _ = http("GET", "/v2/models/krause-vit-fmnist/ready", token=False)
    check(s == 200, f"REST model ready without a token: {s}")
    s, _ = http("GET", "/v2/models/karm-fmnist/versions/1/ready", token=False)
    check(s == 200, f"REST model ready at version 1: {s}")
    s, _ = http("GET", "/v2/models/krause-vit-fmnist/infer")
    check(s == 405, f"REST GET of .../infer: {s}")

    infer_path = "/v2/models/krause-vit-fmnist/infer"
    body = {"id": "rest-1", "inputs": [{"name": "image", "datatype": "UINT8",
                                        "shape": [len(images), 28, 28, 1],
                                        "data": [list(px) for px in images]}]}
    s, res = http("POST", infer_path, body)
    ok = s == 200 and res["id"] == "rest-1" and res["model_version"] == "1"
    if ok:
        out = {o["name"]: o for o in res["outputs"]}
        rest_probs = [struct.unpack("<f", struct.pack("<f", v))[0]
                      for v in out["probabilities"]["data"]]
        flat_want = [v for row in want_probs for v in row]
        ok = rest_probs == flat_want and out["label"]["data"] == want_labels and \
            out["probabilities"]["shape"] == [len(images), 10]
    check(ok, f"REST infer (classifier) equals native Classify: {s}")
    body = {"parameters": {"seed": 1234, "guidance": 2.0},
            "inputs": [{"name": "class_index", "datatype": "INT32", "shape": [3], "data": [3, 3, 3]}]}
    s, res = http("POST", "/v2/models/karm-fmnist/infer", body)
    ok = s == 200 and bytes(res["outputs"][0]["data"]) == native_images(1234, 3, 3, 2.0)
    check(ok, f"REST infer (generator) is byte-identical to native Generate: {s}")
    body = {"inputs": [{"name": "image", "datatype": "UINT8", "shape": [3, 28, 28, 1],
                        "data": list(b"".join(images[:3]))},
                       {"name": "class_index", "datatype": "INT32", "shape": [3], "data": [1, -1, 7]}]}
    s, res = http("POST", "/v2/models/karm-fmnist/infer", body)
    check(s == 200 and res["outputs"][0]["data"] == want_bits,
          f"REST infer (scoring) equals native Score: {s}")

    def rest_bad(what, body, status, needle, raw=None, path=infer_path):
        s, res = http("POST", path, body, raw=raw)
        msg = res.get("error", "") if isinstance(res, dict) else ""
        check(s == status and needle in msg, f"REST bad input, {what}: {s} \"{msg}\"")

    img = lambda **kw: {"name": "image", "datatype": "UINT8", "shape": [1, 28, 28, 1],
                        "data": list(px), **kw}
    rest_bad("malformed JSON", None, 400, "not valid JSON", raw=b"{\"inputs\": [")
    rest_bad("wrong datatype", {"inputs": [img(datatype="FP32")]}, 400, "datatype FP32")
    rest_bad("wrong shape", {"inputs": [img(shape=[1, 28, 27, 1], data=list(px[:756]))]}, 400,
             "shape")
    rest_bad("element count", {"inputs": [img(data=list(px[:783]))]}, 400, "783 elements")
    rest_bad("a value out of range", {"inputs": [img(data=[300] + list(px[1:]))]}, 400,
             "does not fit UINT8")
    rest_bad("unknown input", {"inputs": [img(name="pixels")]}, 400, "unknown input \"pixels\"")
    rest_bad("missing input", {"inputs": []}, 400, "input image is missing")
    rest_bad("unknown parameter", {"parameters": {"top_k": 3}, "inputs": [img()]}, 400,
             "unknown parameter \"top_k\"")
    rest_bad("parameter of the wrong type", {"parameters": {"seed": "x"}, "inputs": []}, 400,
             "parameter seed", path="/v2/models/karm-fmnist/infer")
    rest_bad("unknown model", {"inputs": []}, 404, "nope", path="/v2/models/nope/infer")
    # Priority (Triton's parameter): 0 .. 2 within the caller's tenant; 2 needs max_priority=2.
    rest_bad("priority out of range", {"parameters": {"priority": 7}, "inputs": [img()]}, 400,
             "parameter priority 7 is out of range [0, 2]")
    rest_bad("priority above the tenant's", {"parameters": {"priority": 2}, "inputs": [img()]},
             403, "max_priority is 1")
    rest_bad("generation priority above the tenant's", {"parameters": {"priority": 2},
             "inputs": []}, 403, "max_priority is 1", path="/v2/models/karm-fmnist/infer")
    s, _ = http("POST", infer_path, {"parameters": {"priority": 1}, "inputs": [img()]})
    check(s == 200, f"REST classify at priority 1: {s}")
    check_extensions(oip, rest, infer, images, want_probs, want_labels, native_images)
    rest_bad("a body over --max_message_bytes", None, 413, "limit", raw=b" " * (5 << 20))

    # A slow body: the headers promise 100 bytes, 10 come, then nothing.
    with socket.create_connection(("127.0.0.1", hport)) as sock:
        sock.sendall(f"POST {infer_path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"inputs\":".encode())
        sock.settimeout(10)
        start = time.monotonic()
        answer = sock.recv(4096).decode(errors="replace")
        check(answer.startswith("HTTP/1.1 408") and time.monotonic() - start < 5,
              f"REST slow body: {answer.splitlines()[0] if answer else 'nothing'} after "
              f"{time.monotonic() - start:.1f} s")

    # 200 idle connections, then a request.
    idle = [socket.create_connection(("127.0.0.1", hport)) for _ in range(200)]
    time.sleep(0.2)
    start = time.monotonic()
    s, _ = http("POST", infer_path, {"inputs": [img()]})
    took = time.monotonic() - start
    check(s == 200 and took < 1.0, f"REST beside 200 idle connections: {s} in {took:.3f} s")
    for sock in idle:
        sock.close()

    # --- metrics, request log, reflection ---
    text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
    def count(protocol, rpc="ModelInfer", code="OK"):
        total = 0.0
        for line in text.splitlines():
            if line.startswith("krause_requests_total{") and f'rpc="{rpc}"' in line and \
                    f'protocol="{protocol}"' in line and f'code="{code}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total
    check(count("oip-grpc") >= 6 and count("oip-rest") >= 3 and
          count("oip-grpc", code="INVALID_ARGUMENT") >= 9 and count("krause.v1", "Classify") >= 1,
          f"metrics: ModelInfer oip-grpc OK {count('oip-grpc')}, oip-rest OK {count('oip-rest')}, "
          f"oip-grpc INVALID_ARGUMENT {count('oip-grpc', code='INVALID_ARGUMENT')}")
    # The requests the HTTP server refused itself (413 before the body, 408) count and log too.
    check(count("oip-rest", code="RESOURCE_EXHAUSTED") >= 1 and
          count("oip-rest", code="DEADLINE_EXCEEDED") >= 1,
          f"metrics: REST refusals counted (413: {count('oip-rest', code='RESOURCE_EXHAUSTED')}, "
          f"408: {count('oip-rest', code='DEADLINE_EXCEEDED')})")
    lines = [json.loads(l) for l in open(log_path) if l.strip()]
    check(any(l["rpc"] == "ModelInfer" and l["protocol"] == "oip-rest" and l["images"] == 6
              for l in lines), "request log: a REST ModelInfer with its protocol and images")
    check(any(l["rpc"] == "ModelInfer" and l["protocol"] == "oip-rest" and
              l["code"] == "RESOURCE_EXHAUSTED" and "127.0.0.1" in l["peer"] for l in lines),
          "request log: the 413 refused by the HTTP server, with its peer")

    # Reflection (grpc.reflection.v1alpha), spoken by hand: list_services (field 7) = "".
    reflect = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                    lambda b: b, lambda b: b)
    answer = b"".join(reflect(iter([b"\x3a\x00"]), timeout=10))
    check(b"inference.GRPCInferenceService" in answer and b"krause.v1.KrauseService" in answer,
          "reflection lists inference.GRPCInferenceService beside krause.v1")


if __name__ == "__main__":
    sys.exit(main())
