#!/usr/bin/env bash
# The serving performance report of docs/benchmarks.md: krause-loadgen against a real
# krause-server on this machine, side by side in one run. Writes bench/results/serving-cpu/*.json
# and prints a table.
#   scripts/perf-report.sh            (after scripts/build.sh; about 4 minutes on 2 cores)
# Environment: BUILD_DIR (build), DURATION (15 s of measured classify load), OUT (folder).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/bin
OUT=${OUT:-bench/results/serving-cpu}
DURATION=${DURATION:-15}
mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'kill $(cat "$tmp"/*.pid 2>/dev/null) 2>/dev/null || true; rm -rf "$tmp"' EXIT

# Two servers from one set of checkpoints: batching on (up to 64 images, natural batching) and off (1).
manifest() {  # $1 = max_batch_size, $2 = max_queue_delay_ms
  cat <<JSON
{"models": [
 {"name": "krause-vit", "checkpoint": "$PWD/models/krause_vit_fmnist.safetensors", "default": true,
  "max_batch_size": $1, "max_queue_delay_ms": $2, "max_queued_images": 4096},
 {"name": "karm", "checkpoint": "$PWD/models/karm_fmnist.safetensors", "default": true,
  "max_sequences": 64, "max_waiting": 1024},
 {"name": "arm", "checkpoint": "$PWD/models/arm_fmnist.safetensors",
  "max_sequences": 64, "max_waiting": 1024}]}
JSON
}
# The REST port (8000 by default) off where the build has one: two servers run at once.
# (grep reads the whole help text: grep -q would stop early and, under pipefail, fail the pipe)
http_off=$("$BIN/krause-server" --helpfull 2>&1 | grep -c -- '-http_listen' > /dev/null && echo --http_listen= || true)
start() {  # $1 = name, $2 = max batch, $3 = delay
  manifest "$2" "$3" > "$tmp/$1.json"
  "$BIN/krause-server" --manifest "$tmp/$1.json" --listen 127.0.0.1:0 --port_file "$tmp/$1.port" \
    --metrics_listen "127.0.0.1:$4" $http_off --quiet & echo $! > "$tmp/$1.pid"
  for _ in $(seq 600); do [ -s "$tmp/$1.port" ] && break; sleep 0.1; done
}
start batched 64 0 19461
start unbatched 1 0 19462
B=127.0.0.1:$(cat "$tmp/batched.port"); U=127.0.0.1:$(cat "$tmp/unbatched.port")

run() {  # name, server, metrics port, loadgen args...
  local name=$1 server=$2 mport=$3; shift 3
  echo "== $name" >&2
  "$BIN/krause-loadgen" --server "$server" --metrics "127.0.0.1:$mport" --json "$OUT/$name.json" "$@"
}
run classify-batched-c32 "$B" 19461 --workload classify --concurrency 32 --duration "$DURATION" --warmup 3
run classify-unbatched-c32 "$U" 19462 --workload classify --concurrency 32 --duration "$DURATION" --warmup 3
run classify-batched-c1 "$B" 19461 --workload classify --concurrency 1 --duration "$DURATION" --warmup 1
for m in karm arm; do
  run generate-$m-s1 "$B" 19461 --workload generate --generate_model $m --concurrency 1 --requests 3 --warmup 0
  run generate-$m-s64 "$B" 19461 --workload generate --generate_model $m --concurrency 64 --requests 128 --warmup 0
done

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
r = {f[:-5]: json.load(open(os.path.join(out, f))) for f in os.listdir(out) if f.endswith(".json")}
def lat(x, rpc, q): return 1e3 * x["latency_seconds"][rpc][q]
print("| run | calls/s | images/s | p50 ms | p99 ms | server view |")
print("|---|---|---|---|---|---|")
for k in ["classify-batched-c32", "classify-unbatched-c32", "classify-batched-c1",
          "generate-karm-s1", "generate-karm-s64", "generate-arm-s1", "generate-arm-s64"]:
    x = r[k]; rpc = "Classify" if k.startswith("classify") else "Generate"; s = x.get("server", {})
    view = (f"mean batch {s.get('classify_mean_batch_images', 0):.1f} images" if rpc == "Classify"
            else f"mean decode batch {s.get('decode_mean_batch_sequences', 0):.1f}")
    view += f", FLOP saving {100 * s.get('flop_saving', 0):.1f}%"
    print(f"| {k} | {x['calls_per_second']:.2f} | {x['images_per_second']:.2f} | {lat(x, rpc, 'p50'):.1f} | {lat(x, rpc, 'p99'):.1f} | {view} |")
b, u = r["classify-batched-c32"], r["classify-unbatched-c32"]
print(f"\nclassify at concurrency 32, dynamic batching vs none: {b['images_per_second'] / u['images_per_second']:.2f}x images/s")
for m in ["karm", "arm"]:
    print(f"generate {m}, 64 vs 1 concurrent streams: {r[f'generate-{m}-s64']['images_per_second'] / r[f'generate-{m}-s1']['images_per_second']:.2f}x images/s")
print(f"KARM vs ARM images/s at 64 streams: {r['generate-karm-s64']['images_per_second'] / r['generate-arm-s64']['images_per_second']:.2f}x; "
      f"at 1 stream: {r['generate-karm-s1']['images_per_second'] / r['generate-arm-s1']['images_per_second']:.2f}x")
PY
