# krause-serve images. Two targets:
#   docker build --target cpu -t krause-serve:cpu .   Debian + Debian's LibTorch (the default)
#   docker build --target gpu -t krause-serve:gpu .   PyTorch's CUDA LibTorch (CUDA runtime
#                                                      libraries come with the wheel; the driver
#                                                      from the host's NVIDIA container toolkit)
# Both serve the bundled models on port 50051 (gRPC) and 9464 (/metrics), run as a non-root
# user and carry a health check. No Docker engine runs on the development machines: the image
# is kept buildable by construction (it runs the same install and build scripts that CI runs).

# ---- CPU -------------------------------------------------------------------------------------
FROM debian:bookworm AS build-cpu
WORKDIR /src
COPY . .
RUN CMAKE_ARGS="-DKRAUSE_BUILD_TESTS=OFF -DKRAUSE_BUILD_BENCH=OFF" scripts/build.sh

FROM debian:bookworm AS cpu
# The runtime needs LibTorch, OpenBLAS, gRPC, protobuf, Abseil and libpng's shared libraries;
# the install script brings them (with the development packages: simple and identical to CI).
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/krause
COPY --from=build-cpu /src/build/bin /opt/krause/bin
COPY models /opt/krause/models
RUN useradd --system --uid 10001 krause
USER 10001
EXPOSE 50051 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s \
  CMD ["/opt/krause/bin/krause-client", "--server=localhost:50051", "--timeout=4", "health"]
ENTRYPOINT ["/opt/krause/bin/krause-server", "--models_dir=/opt/krause/models"]
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464"]

# ---- GPU -------------------------------------------------------------------------------------
FROM debian:bookworm AS build-gpu
WORKDIR /src
COPY . .
RUN scripts/install-deps.sh && apt-get install -y --no-install-recommends python3-venv && \
    python3 -m venv /opt/torch && \
    /opt/torch/bin/pip install --no-cache-dir torch --index-url https://download.pytorch.org/whl/cu126
RUN TORCH_PREFIX="$(/opt/torch/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
    SKIP_INSTALL=1 CMAKE_ARGS="-DKRAUSE_BUILD_TESTS=OFF -DKRAUSE_BUILD_BENCH=OFF -DKRAUSE_WITH_CUDA=OFF" \
    scripts/build.sh

FROM debian:bookworm AS gpu
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY --from=build-gpu /opt/torch /opt/torch
ENV LD_LIBRARY_PATH=/opt/torch/lib/python3.11/site-packages/torch/lib
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /opt/krause
COPY --from=build-gpu /src/build/bin /opt/krause/bin
COPY models /opt/krause/models
RUN useradd --system --uid 10001 krause
USER 10001
EXPOSE 50051 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s \
  CMD ["/opt/krause/bin/krause-client", "--server=localhost:50051", "--timeout=4", "health"]
ENTRYPOINT ["/opt/krause/bin/krause-server", "--models_dir=/opt/krause/models"]
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464"]

# The default target (a plain `docker build .`) is the CPU image.
FROM cpu
