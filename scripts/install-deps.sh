#!/usr/bin/env bash
# Installs every Debian package that krause-serve's build, tests, benchmarks and tools use.
# Idempotent: packages already present are left alone; safe to run on every build.
# Usage: scripts/install-deps.sh [--serve | --fuzz | --build-only | --containers]   (as root, or
# with sudo)
#   --serve:      what scripts/serve.sh needs: the build packages and GoogleTest's headers (CMake
#                 configures the test suites too, so that build/ is configured exactly as
#                 scripts/test.sh configures it and the test command reuses what serve built);
#                 not the Python, data set and Prometheus packages the tests use
#   --fuzz:       also clang-14 with libFuzzer and the sanitizer runtimes (scripts/fuzz.sh; kept
#                 out of the default set so that images built with this script do not carry a
#                 compiler twice)
#   --build-only: only what compiling the server and clients needs (the image's build stage: no
#                 test, Python or data set packages)
#   --containers: also podman, buildah, runc and debootstrap (scripts/container-check.sh)
set -euo pipefail

BUILD_PACKAGES=(
  # toolchain
  build-essential cmake ninja-build ccache pkg-config git
  # LibTorch (CPU, 1.13 on Debian 12) and a fast BLAS for it
  libtorch-dev libopenblas0-pthread
  # oneDNN's headers (the library is LibTorch's own): the bf16 linear layers
  libdnnl-dev
  # gRPC, protobuf, Abseil, Prometheus
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev
  # image and compressed-data I/O
  libpng-dev zlib1g-dev
  # JSON (safetensors headers, model configs, reports)
  nlohmann-json3-dev
  # Boost.Beast and Asio (header-only): the event-driven HTTP server (server/edge/http_server.h),
  # and OpenSSL for its HTTPS
  libboost-dev libssl-dev
)
# Configuring the tree (tests/CMakeLists.txt: find_package(GTest REQUIRED)).
CONFIGURE_PACKAGES=(libgtest-dev libgmock-dev)
PACKAGES=(
  "${BUILD_PACKAGES[@]}"
  # tests and benchmarks
  "${CONFIGURE_PACKAGES[@]}" libbenchmark-dev
  # the TLS tests make throw-away certificates
  openssl
  # the deployment kit test: promtool (in Debian's prometheus package) and YAML
  prometheus python3-yaml
  # real data (Fashion-MNIST IDX files)
  dataset-fashion-mnist
  # PyTorch for the checkpoint converter and its test
  python3 python3-torch python3-numpy
  # the soak's clients (tests/soak.py: gRPC from Python, messages from the .proto at run time)
  python3-grpcio python3-protobuf
  # the Python client (client/python): built into a virtual environment, tested with pytest
  python3-venv python3-pil python3-pytest
  # the web page's test in a real browser (tests/web_ui_test.py): headless Chromium, driven by
  # its WebDriver through Selenium
  chromium chromium-driver python3-selenium
)
case "${1:-}" in
  "") ;;
  --serve) PACKAGES=("${BUILD_PACKAGES[@]}" "${CONFIGURE_PACKAGES[@]}") ;;
  --fuzz) PACKAGES+=(clang-14 libclang-rt-14-dev libomp-14-dev) ;;
  --build-only) PACKAGES=("${BUILD_PACKAGES[@]}") ;;
  # uidmap: podman's user namespaces; the rest builds, imports and runs the images
  --containers) PACKAGES+=(podman buildah runc debootstrap uidmap) ;;
  *)
    echo "install-deps: unknown argument $1 (usage: install-deps.sh [--serve | --fuzz | --build-only | --containers])" >&2
    exit 2
    ;;
esac

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

# The prometheus package is here for promtool only. On a systemd machine installing it starts a
# Prometheus server on :9090; if this script installed it, stop and disable that service again.
for p in "${missing[@]}"; do
  if [ "$p" = prometheus ] && [ -d /run/systemd/system ] && command -v systemctl > /dev/null; then
    $SUDO systemctl disable --now prometheus > /dev/null 2>&1 || true
  fi
done
echo "install-deps: done"
