#!/usr/bin/env python3
"""The deployment kit against a real server.

Usage: deploy_test.py BIN_DIR PROJECT_DIR

- every Kubernetes manifest parses (YAML), has apiVersion/kind/metadata.name, and every
  kustomization's resources and patches exist; where kubectl exists, the cpu, gpu and gpu-hpa
  overlays render (kubectl kustomize) with the autoscaler each should have (the CPU HPA, the KEDA
  ScaledObject, the queue HPA) scaling the Deployment, and every metric a scaler uses is exported; the Deployment's probes are gRPC and its grace
  period covers the drain plus the preStop pause; every selector of a rendered overlay selects
  what it must (the Deployment's, each Service's and the PDB's the pods; the ServiceMonitor's a
  Service with its port), and the model manifest is a generated ConfigMap (a content hash in its
  name) that the Deployment mounts;
- the KServe InferenceService (deploy/kserve) runs the image as a v2 predictor: its container,
  first port, server flags and /v2/health probes agree, it renders with kubectl kustomize, and
  its probe paths answer 200 on the real server below;
- the Grafana dashboard parses and every panel has a query;
- krause-server serves the bundled models, krause-client sends a classify, a generate and a score,
  and every metric name the dashboard and the alert rules use is in the server's /metrics;
- the Dockerfile has the cpu and gpu runtime stages, non-root with a HEALTHCHECK, installing no
  packages (the staged binaries and libraries only), the GPU build compiles the CUDA kernels, and
  .dockerignore keeps build folders out;
- promtool check config / rules / metrics and test rules (deploy/prometheus/alerts_test.yml) pass (skipped with exit code 77 when promtool is missing).
"""
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

BIN, ROOT = sys.argv[1], sys.argv[2]
DEPLOY = os.path.join(ROOT, "deploy")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metric_names(expr):
    # Metric names: krause_* identifiers not followed by '(' (functions) or '=' (labels).
    return set(re.findall(r"\b(krause_[a-z_]+)\b(?!\s*[(=])", expr))


# --- Kubernetes manifests -------------------------------------------------------------------
docs = {}
for path in sorted(glob.glob(os.path.join(DEPLOY, "k8s", "**", "*.yaml"), recursive=True)):
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            check(isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc, f"{path}: apiVersion and kind")
            if os.path.basename(path) == "kustomization.yaml":
                for r in doc.get("resources", []):
                    check(os.path.exists(os.path.join(os.path.dirname(path), r)), f"{path}: resource {r} exists")
                for p in doc.get("patches", []):
                    check(os.path.exists(os.path.join(os.path.dirname(path), p["path"])), f"{path}: patch {p['path']} exists")
            else:
                check("name" in doc.get("metadata", {}), f"{path}: metadata.name")
            docs.setdefault(doc.get("kind"), []).append((path, doc))
for kind in ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor",
             "ScaledObject"]:
    check(kind in docs, f"a {kind} manifest exists")
dep = next(d for p, d in docs["Deployment"] if "base" in p)
c = dep["spec"]["template"]["spec"]["containers"][0]
for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
    check("grpc" in c.get(probe, {}), f"{probe} is a native gRPC probe")
drain = next(float(a.split("=")[1]) for a in c["args"] if a.startswith("--drain_seconds="))
pause = float(c["lifecycle"]["preStop"]["exec"]["command"][-1])
check(dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain + pause,
      "terminationGracePeriodSeconds > drain + preStop")
check(any(d["spec"].get("clusterIP") == "None" for _, d in docs["Service"]), "a headless Service")
gpu = [d for p, d in docs["Deployment"] if "gpu" in p]
check(gpu and gpu[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu") == 1,
      "the gpu overlay asks for one GPU")
# The model manifests are generated ConfigMaps (configMapGenerator: a content hash in the name,
# so that editing one rolls the pods); each file they name must parse.
generated = 0
for path in sorted(glob.glob(os.path.join(DEPLOY, "k8s", "**", "kustomization.yaml"), recursive=True)):
    with open(path) as f:
        k = yaml.safe_load(f)
    for gen in k.get("configMapGenerator", []):
        for spec in gen.get("files", []):
            file = os.path.join(os.path.dirname(path), spec.split("=")[-1])
            generated += 1
            with open(file) as f:
                m = json.load(f)
            check(len(m["models"]) > 0, f"{file}: the model manifest parses")
check(generated >= 2, "the base and the gpu overlay generate their model manifests")

# --- rendered overlays (kubectl kustomize, where kubectl exists) ------------------------------
scaler_metrics = set()
for _, so in docs.get("ScaledObject", []):
    if "$patch" in so:
        continue
    for t in so["spec"]["triggers"]:
        check(t["type"] == "prometheus", "the ScaledObject's trigger is Prometheus")
        check(float(t["metadata"]["activationThreshold"]) < float(t["metadata"]["threshold"]),
              "the activation threshold is below the target")
        scaler_metrics |= metric_names(t["metadata"]["query"])
for _, hpa in docs.get("HorizontalPodAutoscaler", []):
    if "$patch" in hpa:
        continue
    for m in hpa["spec"]["metrics"]:
        if m["type"] == "Pods":
            scaler_metrics.add(m["pods"]["metric"]["name"])
check("krause_queued_images" in scaler_metrics, "the scalers use the queue gauge")
# --- the KServe InferenceService ---------------------------------------------------------------
with open(os.path.join(DEPLOY, "kserve", "inferenceservice.yaml")) as f:
    isvc = yaml.safe_load(f)
check(isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService",
      "kserve: a v1beta1 InferenceService")
(kc,) = isvc["spec"]["predictor"]["containers"]
check(kc["name"] == "kserve-container", "kserve: the container is kserve-container")
http_port = kc["ports"][0]["containerPort"]
check(f"--http_listen=0.0.0.0:{http_port}" in kc["args"],
      f"kserve: the first port ({http_port}) is the server's REST port")
check(kc["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": http_port} and
      kc["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": http_port},
      "kserve: the probes are the protocol's /v2/health endpoints on that port")


def check_selectors(overlay, rendered):
    """Every selector of a rendered overlay against what it must select: the Deployment's pods
    (its own selector, each Service, the PodDisruptionBudget), the Services (the ServiceMonitor,
    with its endpoint port on one of them), and the Deployment's manifest volume against the
    generated ConfigMap."""
    def of(kind):
        return [d for d in rendered if d["kind"] == kind]

    def selects(selector, labels):
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

    (dep,) = of("Deployment")
    pod_labels = dep["spec"]["template"]["metadata"].get("labels", {})
    check(selects(dep["spec"]["selector"].get("matchLabels"), pod_labels),
          f"overlay {overlay}: the Deployment's selector matches its pods")
    for svc in of("Service"):
        check(selects(svc["spec"].get("selector"), pod_labels),
              f"overlay {overlay}: Service {svc['metadata']['name']} selects the pods")
    for pdb in of("PodDisruptionBudget"):
        check(selects(pdb["spec"].get("selector", {}).get("matchLabels"), pod_labels),
              f"overlay {overlay}: the PodDisruptionBudget selects the pods (a PDB without a "
              "selector protects nothing)")
    for sm in of("ServiceMonitor"):
        chosen = [s for s in of("Service")
                  if selects(sm["spec"].get("selector", {}).get("matchLabels"),
                             s["metadata"].get("labels", {}))]
        check(chosen, f"overlay {overlay}: the ServiceMonitor selects a Service")
        ports = {p.get("name") for s in chosen for p in s["spec"]["ports"]}
        for e in sm["spec"]["endpoints"]:
            check(e["port"] in ports, f"overlay {overlay}: ServiceMonitor port {e['port']} is a "
                                      "port of a selected Service")
    maps = {c["metadata"]["name"]: c for c in of("ConfigMap")}
    for v in dep["spec"]["template"]["spec"].get("volumes", []):
        if "configMap" not in v:
            continue
        name = v["configMap"]["name"]
        check(name in maps, f"overlay {overlay}: volume {v['name']} names a rendered ConfigMap")
        check(name.startswith("krause-serve-models-"),
              f"overlay {overlay}: the manifest ConfigMap's name carries its content hash ({name})")
        if name in maps:
            m = json.loads(maps[name]["data"]["manifest.json"])
            check(len(m["models"]) > 0, f"overlay {overlay}: its manifest parses")
            cuda = all(x.get("device", "cpu").startswith("cuda") for x in m["models"])
            check(cuda == overlay.startswith("gpu"), f"overlay {overlay}: the manifest's devices")


kubectl = shutil.which("kubectl")
if kubectl is None:
    print("kubectl not installed: the overlays are not rendered")
else:
    want = {"cpu": ("HorizontalPodAutoscaler", "ScaledObject"), "gpu": ("ScaledObject", "HorizontalPodAutoscaler"),
            "gpu-hpa": ("HorizontalPodAutoscaler", "ScaledObject")}
    for overlay, (present, absent) in want.items():
        r = subprocess.run([kubectl, "kustomize", os.path.join(DEPLOY, "k8s", "overlays", overlay)],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"overlay {overlay} renders: {r.stderr.strip()[:300]}")
        if r.returncode != 0:
            continue
        rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
        kinds = [d["kind"] for d in rendered]
        for k in ["Deployment", "Service", "ConfigMap", "PodDisruptionBudget", present]:
            check(k in kinds, f"overlay {overlay} has a {k}")
        check(absent not in kinds, f"overlay {overlay} has no {absent}")
        check_selectors(overlay, rendered)
        for d in rendered:
            check("name" in d.get("metadata", {}), f"overlay {overlay}: {d['kind']} has a name")
            if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"):
                ref = d["spec"]["scaleTargetRef"]
                check(ref["kind"] == "Deployment" and ref["name"] in
                      [x["metadata"]["name"] for x in rendered if x["kind"] == "Deployment"],
                      f"overlay {overlay}: the {d['kind']} scales the Deployment")
            if d["kind"] == "HorizontalPodAutoscaler":
                types = [m["type"] for m in d["spec"]["metrics"]]
                check(types == (["Pods"] if overlay == "gpu-hpa" else ["Resource"]),
                      f"overlay {overlay}: the HPA scales on {types}")
            if d["kind"] == "Deployment":
                c0 = d["spec"]["template"]["spec"]["containers"][0]
                gpus = c0.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
                check((gpus == 1) == overlay.startswith("gpu"), f"overlay {overlay}: GPU limit {gpus}")
        print(f"overlay {overlay}: {len(rendered)} objects ({', '.join(sorted(set(kinds)))})")
    r = subprocess.run([kubectl, "kustomize", os.path.join(DEPLOY, "kserve")], capture_output=True,
                       text=True)
    rendered = [d for d in yaml.safe_load_all(r.stdout) if d] if r.returncode == 0 else []
    check(r.returncode == 0 and [d["kind"] for d in rendered] == ["InferenceService"],
          f"kserve renders to one InferenceService: {r.stderr.strip()[:300]}")

# --- Dockerfile (static; scripts/container-check.sh builds and runs the CPU image) ------------
stages = {}
with open(os.path.join(ROOT, "Dockerfile")) as f:
    name = None
    for line in f.read().replace("\\\n", " ").splitlines():
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line.strip(), re.I)
        if m:
            name = m.group(2) or "default"
            stages[name] = []
        elif name and line.strip() and not line.lstrip().startswith("#"):
            stages[name].append(line.strip())
check({"build-cpu", "cpu", "build-gpu", "gpu"} <= set(stages), f"Dockerfile stages: {sorted(stages)}")
for runtime in ("cpu", "gpu"):
    body = "\n".join(stages.get(runtime, []))
    check("USER 10001" in body, f"the {runtime} image runs as uid 10001")
    check("HEALTHCHECK" in body, f"the {runtime} image has a HEALTHCHECK")
    check("install-deps" not in body and "apt-get" not in body,
          f"the {runtime} runtime stage installs no packages (only the staged binaries and libraries)")
    check(f"COPY --from=build-{runtime} /stage/ /" in body, f"the {runtime} image copies the staged tree")
gpu_build = "\n".join(stages.get("build-gpu", []))
check("-DKRAUSE_WITH_CUDA=ON" in gpu_build and "CUDACXX=" in gpu_build,
      "the GPU build stage compiles the CUDA kernels with nvcc")
with open(os.path.join(ROOT, ".dockerignore")) as f:
    ignored = f.read().split()
check("build/" in ignored and "build-*/" in ignored, ".dockerignore keeps build folders out")

# --- dashboard and alert rules ---------------------------------------------------------------
with open(os.path.join(DEPLOY, "grafana", "krause-serve.json")) as f:
    dash = json.load(f)
used = set()
for p in dash["panels"]:
    check(p.get("targets"), f"panel {p.get('title')} has queries")
    for t in p.get("targets", []):
        used |= metric_names(t["expr"])
with open(os.path.join(DEPLOY, "prometheus", "alerts.yml")) as f:
    rules = yaml.safe_load(f)
for g in rules["groups"]:
    for r in g["rules"]:
        used |= metric_names(r["expr"])
check(len(used) >= 10, f"the dashboard and alerts use metrics ({len(used)})")

# --- a real server ---------------------------------------------------------------------------
tmp = tempfile.mkdtemp(prefix="krause-deploy-")
grpc_port_file = os.path.join(tmp, "port")
mport, hport = free_port(), free_port()
server = subprocess.Popen([os.path.join(BIN, "krause-server"), "--listen=127.0.0.1:0",
                           f"--metrics_listen=127.0.0.1:{mport}", f"--port_file={grpc_port_file}",
                           f"--http_listen=127.0.0.1:{hport}",
                           "--models_dir=" + os.path.join(ROOT, "models"), "--threads=2", "--quiet"])
try:
    deadline = time.time() + 120
    while not os.path.exists(grpc_port_file):
        running = server.poll() is None
        check(running, "krause-server runs")
        if not running or time.time() > deadline:
            raise SystemExit("krause-server did not start")
        time.sleep(0.1)
    port = open(grpc_port_file).read().strip()
    client = [os.path.join(BIN, "krause-client"), f"--server=127.0.0.1:{port}"]
    idx = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
    subprocess.run(client + ["classify", "--index=0:4", idx], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(client + ["generate", "--progress=false", "--out=" + tmp], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(client + ["score", os.path.join(tmp, "sample-0.png")], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(client + ["classify", "--model=nope", "--index=0", idx], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scrape = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10).read().decode()
    for probe in ["readinessProbe", "livenessProbe"]:
        path = kc[probe]["httpGet"]["path"]
        status = urllib.request.urlopen(f"http://127.0.0.1:{hport}{path}", timeout=10).status
        check(status == 200, f"kserve: the {probe} {path} answers {status} on a real server")
finally:
    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=60)
    check(code == 0, f"krause-server exits 0 on SIGTERM (got {code})")

exported = set()
for line in scrape.splitlines():
    if line.startswith("# TYPE "):
        exported.add(line.split()[2])
    elif line and not line.startswith("#"):
        exported.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
# Counters that have no sample until their event happens (a refusal needs a full queue or a
# drain, which this short session does not provoke; a tenant's figures need a token file's
# tenants, which this server has not): the server must still define them, and
# server_e2e_test / server_access_test check their samples after the event.
EVENT_ONLY = {"krause_refusals_total", "krause_tenant_images_total",
              "krause_tenant_refusals_total"}
metrics_source = open(os.path.join(ROOT, "server", "edge", "metrics.cc")).read()
for name in sorted(used):
    if name in EVENT_ONLY:
        check(f'"{name}"' in metrics_source, f"metric {name} (alerts) is defined by the server")
        continue
    check(name in exported, f"metric {name} (dashboard/alerts) is exported by the server")
for name in sorted(scaler_metrics):
    check(name in exported, f"metric {name} (autoscaling) is exported by the server")

# --- promtool ---------------------------------------------------------------------------------
promtool = shutil.which("promtool")
if promtool is None:
    print("promtool not installed (Debian package prometheus): skipping its checks")
    sys.exit(77 if not failures else 1)
r = subprocess.run([promtool, "check", "config", os.path.join(DEPLOY, "prometheus", "prometheus.yml")],
                   capture_output=True, text=True)
check(r.returncode == 0, "promtool check config: " + r.stdout + r.stderr)
r = subprocess.run([promtool, "check", "rules", os.path.join(DEPLOY, "prometheus", "alerts.yml")],
                   capture_output=True, text=True)
check(r.returncode == 0, "promtool check rules: " + r.stdout + r.stderr)
# What pages and what does not (drains and clients' own deadlines do not): the rules' unit tests.
r = subprocess.run([promtool, "test", "rules", os.path.join(DEPLOY, "prometheus", "alerts_test.yml")],
                   capture_output=True, text=True)
check(r.returncode == 0, "promtool test rules: " + r.stdout + r.stderr)
r = subprocess.run([promtool, "check", "metrics"], input=scrape, capture_output=True, text=True)
check(r.returncode == 0, "promtool check metrics: " + r.stdout + r.stderr)

shutil.rmtree(tmp, ignore_errors=True)
print(f"{len(used)} metric names checked against the scrape; {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
