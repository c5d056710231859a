# krause-serve images. Two targets:
#   docker build --target cpu -t krause-serve:cpu .   Debian + Debian's LibTorch (the default)
#   docker build --target gpu -t krause-serve:gpu .   PyTorch's CUDA LibTorch (CUDA runtime
#                                                      libraries come with the wheel; the driver
#                                                      from the host's NVIDIA container toolkit)
# Both serve the bundled models on port 50051 (gRPC) and 9464 (/metrics), run as a non-root
# user and carry a health check. CI builds and runs the CPU image with buildah and podman
# (scripts/container-check.sh); plain `docker build` works the same.

# ---- CPU -------------------------------------------------------------------------------------
FROM debian:bookworm AS build-cpu
WORKDIR /src
# Dependencies first (a layer of their own: rebuilding after a source change skips them).
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --build-only && rm -rf /var/lib/apt/lists/*
COPY . .
RUN SKIP_INSTALL=1 CONFIGURE_ONLY=1 \
    CMAKE_ARGS="-DKRAUSE_BUILD_TESTS=OFF -DKRAUSE_BUILD_BENCH=OFF" scripts/build.sh && \
    cmake --build build -j "$(nproc)" --target krause-server krause-client krause-loadgen && \
    scripts/stage-runtime.sh /stage build/bin/krause-server build/bin/krause-client \
      build/bin/krause-loadgen

FROM debian:bookworm AS cpu
# Only the binaries and the shared libraries they load (scripts/stage-runtime.sh: their ldd
# closure, from the build stage's packages): no compiler, -dev package, Python or data set.
COPY --from=build-cpu /stage/ /
COPY models /opt/krause/models
COPY LICENSE /opt/krause/LICENSE
RUN ldconfig && useradd --system --uid 10001 krause
WORKDIR /opt/krause
USER 10001
EXPOSE 50051 8000 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s \
  CMD ["/opt/krause/bin/krause-client", "--server=localhost:50051", "--timeout=4", "health"]
ENTRYPOINT ["/opt/krause/bin/krause-server", "--models_dir=/opt/krause/models"]
CMD ["--listen=0.0.0.0:50051", "--http_listen=0.0.0.0:8000", "--metrics_listen=0.0.0.0:9464"]

# ---- GPU -------------------------------------------------------------------------------------
# Builds the CUDA kernels with nvcc from NVIDIA's CUDA 12.6 packages for Debian 12, against
# PyTorch's CUDA 12.6 LibTorch (pip); needs both download sites, so it is not built on the
# development machines (see docs/deploying.md for what is checked there).
FROM debian:bookworm AS build-gpu
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --build-only && \
    apt-get install -y --no-install-recommends ca-certificates wget python3-venv && \
    wget -q -O /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb && \
    dpkg -i /tmp/cuda-keyring.deb && apt-get update && \
    apt-get install -y --no-install-recommends cuda-nvcc-12-6 cuda-cudart-dev-12-6 \
      cuda-nvrtc-dev-12-6 cuda-nvtx-12-6 cuda-profiler-api-12-6 libcublas-dev-12-6 \
      libcusparse-dev-12-6 libcurand-dev-12-6 libcufft-dev-12-6 libcusolver-dev-12-6 && \
    rm -rf /var/lib/apt/lists/* && \
    python3 -m venv /opt/torch && \
    /opt/torch/bin/pip install --no-cache-dir torch --index-url https://download.pytorch.org/whl/cu126
COPY . .
# 80, 86, 89, 90: A100, A10/RTX 30xx, L4/L40/RTX 40xx, H100/H200.
RUN TORCH_PREFIX="$(/opt/torch/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
    CUDACXX=/usr/local/cuda-12.6/bin/nvcc SKIP_INSTALL=1 CONFIGURE_ONLY=1 \
    CMAKE_ARGS="-DKRAUSE_BUILD_TESTS=OFF -DKRAUSE_BUILD_BENCH=OFF -DKRAUSE_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=80;86;89;90" \
    scripts/build.sh && \
    cmake --build build -j "$(nproc)" --target krause-server krause-client krause-loadgen && \
    site=$(/opt/torch/bin/python -c 'import site; print(site.getsitepackages()[0])') && \
    scripts/stage-runtime.sh /stage build/bin/krause-server build/bin/krause-client \
      build/bin/krause-loadgen -- "$site/torch/lib" "$site"/nvidia/*/lib

FROM debian:bookworm AS gpu
# The binaries, their ldd closure and every library of PyTorch's torch/lib and nvidia/*/lib
# (cuDNN, cuBLAS and NVRTC parts are loaded with dlopen); the driver comes from the host's
# NVIDIA container toolkit.
COPY --from=build-gpu /stage/ /
COPY models /opt/krause/models
COPY LICENSE /opt/krause/LICENSE
RUN ldconfig && useradd --system --uid 10001 krause
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /opt/krause
USER 10001
EXPOSE 50051 8000 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s \
  CMD ["/opt/krause/bin/krause-client", "--server=localhost:50051", "--timeout=4", "health"]
ENTRYPOINT ["/opt/krause/bin/krause-server", "--models_dir=/opt/krause/models"]
CMD ["--listen=0.0.0.0:50051", "--http_listen=0.0.0.0:8000", "--metrics_listen=0.0.0.0:9464"]

# The default target (a plain `docker build .`) is the CPU image.
FROM cpu
