"""oip_e2e_test.py's checks of two extensions of the Open Inference Protocol, built from their
specifications' byte layouts (what tritonclient.http and tritonclient.grpc send) and nothing of
the server's: binary tensor data (a JSON header, then each tensor's bytes) and classification
(the top k classes as BYTES "score:index:label"), against krause.v1's answers; and the bearer
token the test's server is started with.
"""
import json
import struct
import urllib.error
import urllib.request

from e2e import check

TOKEN = "oip-secret"
AUTH = [("authorization", f"Bearer {TOKEN}")]


def binary_body(header, tensors):
    """A request of the binary tensor data extension, laid out as its specification says: the
    JSON, then each binary tensor's bytes in the inputs' order; the headers that go with it."""
    head = json.dumps(header).encode()
    return head + b"".join(tensors), {"Inference-Header-Content-Length": str(len(head)),
                                      "Content-Type": "application/octet-stream"}


def split_binary(headers, body):
    """A response's JSON and each binary output's bytes, by name (the specification's layout)."""
    n = int(headers.get("Inference-Header-Content-Length", len(body)))
    res = json.loads(body[:n])
    at, raw = n, {}
    for o in res["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is not None:
            raw[o["name"]] = body[at:at + size]
            at += size
    if at != len(body):
        raise ValueError(f"{len(body) - at} bytes after the outputs' binary data")
    return res, raw


def bytes_elements(raw):
    """BYTES in the raw form: each element a 4-byte little-endian length, then its bytes."""
    out, at = [], 0
    while at < len(raw):
        (n,) = struct.unpack_from("<I", raw, at)
        out.append(raw[at + 4:at + 4 + n])
        at += 4 + n
    return out


def top_k(row, k):
    """The k highest classes, highest first, ties to the lower index (krause.v1's order)."""
    return sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]


def check_extensions(oip, rest, infer, images, want_probs, want_labels, native_images):
    """The binary tensor data and classification extensions, built from their specifications'
    byte layouts (what tritonclient.http and tritonclient.grpc send), against krause.v1."""
    def post(path, body, headers):
        req = urllib.request.Request(rest + path, data=body, method="POST")
        req.add_header("Authorization", f"Bearer {TOKEN}")
        for k, v in headers.items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    labels = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
              "Sneaker", "Bag", "Ankle boot"]
    path = "/v2/models/krause-vit-fmnist/infer"
    n = len(images)
    image = {"name": "image", "datatype": "UINT8", "shape": [n, 28, 28, 1],
             "parameters": {"binary_data_size": 784 * n}}
    # Binary in, every output binary (tritonclient.http's default).
    body, headers = binary_body({"inputs": [image], "parameters": {"binary_data_output": True}},
                                [b"".join(images)])
    s, h, raw = post(path, body, headers)
    ok = s == 200 and h.get("Content-Type") == "application/octet-stream"
    if ok:
        res, out = split_binary(h, raw)
        probs = struct.unpack(f"<{10 * n}f", out["probabilities"])
        flat = [v for row in want_probs for v in row]
        ok = max(abs(a - b) for a, b in zip(probs, flat)) <= 1e-6 and \
            [e.decode() for e in bytes_elements(out["label"])] == want_labels
    check(ok, f"REST binary tensors in and out equal native Classify: {s}")
    # Binary in; probabilities binary, the label as JSON.
    body, headers = binary_body({"inputs": [image], "outputs": [
        {"name": "probabilities", "parameters": {"binary_data": True}}, {"name": "label"}]},
        [b"".join(images)])
    s, h, raw = post(path, body, headers)
    ok = s == 200
    if ok:
        res, out = split_binary(h, raw)
        by = {o["name"]: o for o in res["outputs"]}
        ok = list(out) == ["probabilities"] and by["label"]["data"] == want_labels
    check(ok, f"REST one output binary, the other JSON: {s}")
    # A generator's images as binary data: the same bytes as native Generate.
    body, headers = binary_body({"parameters": {"seed": 99, "num_images": 2},
                                 "inputs": [], "outputs": [{"name": "images",
                                                            "parameters": {"binary_data": True}}]},
                                [])
    s, h, raw = post("/v2/models/karm-fmnist/infer", body, headers)
    ok = s == 200
    if ok:
        _, out = split_binary(h, raw)
        ok = out["images"] == native_images(99, 2)
    check(ok, f"REST generated images as binary data equal native Generate: {s}")

    # Classification, k = 3: over REST (JSON) and over gRPC (raw BYTES).
    def classes_ok(elements):
        for i, row in enumerate(want_probs):
            got = [e.split(":") for e in elements[3 * i:3 * i + 3]]
            if [int(g[1]) for g in got] != top_k(row, 3):
                return False
            if any(abs(float(g[0]) - row[int(g[1])]) > 1e-6 or g[2] != labels[int(g[1])]
                   for g in got):
                return False
        return len(elements) == 3 * len(want_probs)
    body = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [n, 28, 28, 1],
                                   "data": list(b"".join(images))}],
                       "outputs": [{"name": "probabilities",
                                    "parameters": {"classification": 3}}]}).encode()
    s, h, raw = post(path, body, {"Content-Type": "application/json"})
    ok = s == 200
    if ok:
        (o,) = json.loads(raw)["outputs"]
        ok = o["datatype"] == "BYTES" and o["shape"] == [n, 3] and classes_ok(o["data"])
    check(ok, f"REST classification 3: the top 3 classes of native Classify, with labels: {s}")
    req = oip["ModelInferRequest"](model_name="krause-vit-fmnist")
    t = req.inputs.add(name="image", datatype="UINT8")
    t.shape.extend([n, 28, 28, 1])
    req.raw_input_contents.append(b"".join(images))
    o = req.outputs.add(name="probabilities")
    o.parameters["classification"].int64_param = 3
    res = infer(req, metadata=AUTH, timeout=60)
    ok = [(x.name, x.datatype, list(x.shape)) for x in res.outputs] == \
        [("probabilities", "BYTES", [n, 3])] and \
        classes_ok([e.decode() for e in bytes_elements(res.raw_output_contents[0])])
    check(ok, "gRPC classification 3: the top 3 classes of native Classify, with labels")

    # Bad binary and classification requests: 400 naming the field.
    def bad(what, body, headers, needle):
        s, _, raw = post(path, body, headers)
        msg = json.loads(raw).get("error", "") if raw.startswith(b"{") else raw.decode()
        check(s == 400 and needle in msg, f"REST bad input, {what}: {s} \"{msg}\"")
    body, headers = binary_body({"inputs": [image]}, [b"".join(images)])
    bad("a header length past the body", body, {**headers, "Inference-Header-Content-Length":
                                                str(len(body) + 1)}, "Inference-Header-Content-Length")
    bad("a header length that is not a number", body,
        {**headers, "Inference-Header-Content-Length": "12x"}, "Inference-Header-Content-Length")
    bad("binary data shorter than binary_data_size", body[:-1], headers, "binary_data_size")
    bad("bytes that no input takes", body + b"\0", headers, "belong to no input")
    bad("binary_data_size without the header", body[:int(headers[
        "Inference-Header-Content-Length"])], {"Content-Type": "application/json"},
        "Inference-Header-Content-Length header")
    bad("binary_data not a bool", json.dumps({"inputs": [dict(image, parameters={}, data=list(
        b"".join(images)))], "outputs": [{"name": "label", "parameters": {"binary_data": 1}}]}
                                               ).encode(), {}, "binary_data")
    for k in (0, 11):
        bad(f"classification {k}", json.dumps({"inputs": [dict(image, parameters={}, data=list(
            b"".join(images)))], "outputs": [{"name": "probabilities", "parameters": {
                "classification": k}}]}).encode(), {}, "classification is")
    bad("classification on the label", json.dumps({"inputs": [dict(image, parameters={}, data=list(
        b"".join(images)))], "outputs": [{"name": "label", "parameters": {"classification": 1}}]}
                                                  ).encode(), {}, "unknown parameter")

