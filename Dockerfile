# krause-serve CPU image, built from Debian with the same install script as every other machine.
# The gRPC server does not exist yet: the image builds everything and runs the attention
# benchmark. (No Docker engine runs on the development machines; the install script it runs is
# the one CI exercises.)
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
RUN useradd --system --uid 10001 krause
USER krause
ENTRYPOINT ["/opt/krause/bin/krause-attention-bench"]
CMD ["--quick"]
