# krause-serve CPU image, built from Debian with the same install script as every other machine.
# It serves the bundled models on port 50051. (No Docker engine runs on the development machines;
# the install script it runs is the one CI exercises.)
FROM debian:bookworm AS build
WORKDIR /src
COPY . .
RUN scripts/build.sh

FROM debian:bookworm
WORKDIR /opt/krause
# The runtime needs LibTorch, OpenBLAS and Abseil's shared libraries; the install script brings
# them (with the development packages, for now: a slimmer runtime set comes with the server).
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/bin /opt/krause/bin
COPY models /opt/krause/models
RUN useradd --system --uid 10001 krause
USER krause
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s \
  CMD ["/opt/krause/bin/krause-client", "--server=localhost:50051", "--timeout=4", "health"]
ENTRYPOINT ["/opt/krause/bin/krause-server", "--models_dir=/opt/krause/models"]
CMD ["--listen=0.0.0.0:50051"]
