#!/usr/bin/env bash
# The container check: builds the CPU image from the Dockerfile and runs it the way a cluster
# would, from the host:
#   1. a Debian 12 base image, made with debootstrap and imported as debian:bookworm unless
#      local storage has one (no image registry is needed);
#   2. `buildah bud --target cpu` (the Dockerfile, unchanged: `docker build` works the same);
#   3. the image runs (podman, runc) with its ports published on loopback, as uid 10001;
#   4. the health probe (from the host, and the image's own HEALTHCHECK) turns SERVING;
#   5. list, classify, score and generate from the host with build/bin/krause-client, and a
#      /metrics scrape;
#   6. SIGTERM while a generate call is in flight: the call completes (the drain), the server
#      exits 0;
#   7. prints the image size and how long each step took.
# Needs root (rootful podman) and build/bin/krause-client (scripts/build.sh). Environment:
#   SKIP_INSTALL=0      1: do not install podman, buildah, runc, debootstrap
#   DEBIAN_MIRROR=http://deb.debian.org/debian   the mirror debootstrap and the image use
#   IMAGE=localhost/krause-serve:cpu             the tag to build
#   KEEP_IMAGE=1        0: remove the built image at the end
#   LAYERS=0            1: buildah keeps each step's layer (fast reruns, ~3 GB more storage)
# Exit 0: every step passed; 1: a step failed (the server's log is printed).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/krause-serve:cpu}
BASE=docker.io/library/debian:bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CLIENT=${CLIENT:-build/bin/krause-client}
FMNIST=/usr/share/datasets/fashion-mnist
NAME=krause-check-$$
t0=$(date +%s)
step_start=$t0

say() { echo "container-check: $*"; }
fail() {
  say "FAILED: $*"
  if podman container exists "$NAME" 2> /dev/null; then
    say "server log:"
    podman logs "$NAME" 2>&1 | tail -40 | sed 's/^/  /'
  fi
  exit 1
}
step() {
  local now
  now=$(date +%s)
  say "$1 ($((now - step_start)) s)"
  step_start=$now
}

if [ "$(id -u)" -ne 0 ]; then fail "needs root (rootful podman)"; fi
if [ "${SKIP_INSTALL:-0}" != 1 ]; then scripts/install-deps.sh --containers; fi
[ -x "$CLIENT" ] || fail "$CLIENT missing (scripts/build.sh builds it)"

work=$(mktemp -d)
cleanup() {
  podman rm -f "$NAME" > /dev/null 2>&1 || true
  [ "${KEEP_IMAGE:-1}" = 1 ] || podman rmi -f "$IMAGE" > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# Setting RLIMIT_NPROC inside containers is not permitted on these machines: no default ulimits.
# crun fails on their hybrid cgroups: runc.
printf '[containers]\ndefault_ulimits = []\n' > "$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf
pod() { podman --runtime runc "$@"; }

# 1. The base image.
if podman image exists "$BASE"; then
  step "base image $BASE present"
else
  debootstrap --variant=minbase bookworm "$work/rootfs" "$MIRROR" > "$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log"; fail "debootstrap"; }
  rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
  tar -C "$work/rootfs" -c . | podman import - "$BASE" > "$work/import.log" 2>&1 ||
    { cat "$work/import.log"; fail "podman import"; }
  rm -rf "$work/rootfs"
  step "base image $BASE made with debootstrap --variant=minbase from $MIRROR"
fi

# 2. The image.
# Docker format: OCI images drop HEALTHCHECK. LAYERS=1 keeps every step's layer (a rerun after a
# source change skips the dependency step; the build stage's layers then stay in storage, ~3 GB).
buildah bud --isolation chroot --pull=never --layers="${LAYERS:-0}" --format docker --target cpu \
  -t "$IMAGE" . > "$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; fail "buildah bud"; }
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
step "built $IMAGE: $(awk -v b="$size" 'BEGIN { printf "%.0f MB (%d bytes)", b / 1e6, b }')"

# 3. Run it. Free loopback ports for gRPC and /metrics.
read -r grpc_port metrics_port http_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
# (podman logs that it cannot start the HEALTHCHECK timer without systemd: kept in run.log.)
pod run -d --name "$NAME" -p "127.0.0.1:$grpc_port:50051" -p "127.0.0.1:$metrics_port:9464" \
  -p "127.0.0.1:$http_port:8000" \
  "$IMAGE" > "$work/run.log" 2>&1 || { cat "$work/run.log"; fail "podman run"; }
uid=$(pod exec "$NAME" id -u) || fail "podman exec id -u"
[ "$uid" = 10001 ] || fail "the server runs as uid $uid, not 10001"
step "started as uid $uid, gRPC on 127.0.0.1:$grpc_port, metrics on 127.0.0.1:$metrics_port, REST on 127.0.0.1:$http_port"

# 4. Health: the probe from the host until SERVING (the server loads the models first), then the
# image's own HEALTHCHECK command.
server=127.0.0.1:$grpc_port
deadline=$(($(date +%s) + 120))
until "$CLIENT" --server="$server" --timeout=2 health > "$work/health.txt" 2>&1; do
  [ "$(pod inspect --format '{{.State.Running}}' "$NAME")" = true ] || fail "the server exited"
  [ "$(date +%s)" -lt "$deadline" ] || fail "not SERVING within 120 s: $(cat "$work/health.txt")"
  sleep 1
done
pod healthcheck run "$NAME" || fail "the image's HEALTHCHECK"
step "health: $(tr '\n' ' ' < "$work/health.txt")(and the image's HEALTHCHECK passes)"

# 5. Calls from the host.
c() { "$CLIENT" --server="$server" --timeout=60 "$@"; }
# The server's /metrics page, on stdout.
scrape() {
  python3 -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$metrics_port/metrics"
}
# The Open Inference Protocol's REST API (the KServe v2 predictor's probes and one inference).
python3 - "$http_port" > "$work/rest.txt" 2>&1 << 'EOF' || fail "REST (v2): $(cat "$work/rest.txt")"
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
for path in ["/v2/health/live", "/v2/health/ready", "/v2/models/krause-vit-fmnist/ready"]:
    assert urllib.request.urlopen(base + path, timeout=5).status == 200, path
body = {"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1, 28, 28, 1], "data": [0] * 784}]}
req = urllib.request.Request(base + "/v2/models/krause-vit-fmnist/infer", data=json.dumps(body).encode())
out = json.load(urllib.request.urlopen(req, timeout=30))
print("REST infer:", [o["name"] for o in out["outputs"]], out["outputs"][1]["data"])
EOF
step "$(cat "$work/rest.txt")"
c list > "$work/list.txt" || fail "list"
for m in krause-vit-fmnist karm-fmnist; do
  grep -q "$m" "$work/list.txt" || fail "list does not show $m: $(cat "$work/list.txt")"
done
c classify --model krause-vit-fmnist "$FMNIST/t10k-images-idx3-ubyte.gz" --index 0:32 --json \
  > "$work/classify.json" || fail "classify"
correct=$(python3 - "$work/classify.json" "$FMNIST/t10k-labels-idx1-ubyte.gz" << 'EOF'
import gzip, json, sys
labels = gzip.open(sys.argv[2]).read()[8:8 + 32]
out = json.load(open(sys.argv[1]))
results = out["results"] if isinstance(out, dict) else out
print(sum(1 for r, y in zip(results, labels) if r["top"][0]["index"] == y))
EOF
) || fail "reading the classify reply"
[ "$correct" -ge 24 ] || fail "classify: only $correct of 32 test images right"
c score --model karm-fmnist "$FMNIST/t10k-images-idx3-ubyte.gz" --index 0:8 > "$work/score.txt" ||
  fail "score"
c generate --model karm-fmnist --label Sneaker --num 2 --seed 1 --out "$work/gen" \
  > "$work/generate.txt" 2>&1 || fail "generate: $(cat "$work/generate.txt")"
[ "$(find "$work/gen" -name '*.png' | wc -l)" -ge 2 ] || fail "generate wrote no PNGs"
scrape > "$work/metrics.txt" || fail "/metrics"
grep -q '^krause_requests_total{.*rpc="Classify"' "$work/metrics.txt" ||
  fail "/metrics has no Classify request count"
step "list, classify ($correct/32 right), score ($(tail -1 "$work/score.txt")), generate (2 PNGs), /metrics"

# 6. SIGTERM with a generate call in flight: the drain lets it finish; the server exits 0.
# (the slower generator, guided: 16 images take seconds, long enough to be seen in flight)
c generate --model arm-fmnist --label Coat --guidance 1.75 --num 16 --seed 2 --out "$work/drain" \
  > "$work/drain.txt" 2>&1 &
gen_pid=$!
deadline=$(($(date +%s) + 30))
until scrape 2> /dev/null |
  awk '$1 ~ /^krause_calls_in_flight/ && $NF >= 1 { seen = 1 } END { exit !seen }'; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "the generate call never showed in flight"
  kill -0 "$gen_pid" 2> /dev/null || fail "the generate call ended before SIGTERM: $(cat "$work/drain.txt")"
done
pod kill --signal TERM "$NAME" > /dev/null
wait "$gen_pid" || fail "the generate call in flight at SIGTERM failed: $(cat "$work/drain.txt")"
code=$(pod wait "$NAME")
[ "$code" = 0 ] || fail "the server exited with $code after SIGTERM"
# Read whole before searching: with pipefail, grep -q stopping at its match would break the pipe
# under a log still being written, and the pipeline would fail on a log that has the line.
pod logs "$NAME" > "$work/server.log" 2>&1 || true
grep -q 'shutting down' "$work/server.log" || fail "no shutdown in the server log"
step "SIGTERM during a 16-image generate: the call completed ($(find "$work/drain" -name '*.png' | wc -l) PNGs), exit code 0"

say "passed in $(($(date +%s) - t0)) s; image $IMAGE $(awk -v b="$size" 'BEGIN { printf "%.0f MB", b / 1e6 }')"
