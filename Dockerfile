# syntax=docker/dockerfile:1
# tstaged's image: built in the CUDA devel image, run in the matching CUDA
# runtime image with only the runtime libraries, as a non-root user.
#
#   docker build -t tstage/tstaged:0.1.0 .                                # CUDA
#   docker build --build-arg VARIANT=cpu -t tstage/tstaged:0.1.0-cpu .    # CPU only
#   docker run --gpus all -p 8470:8470 \
#       -v "$PWD/token:/run/secrets/tstage-token:ro" tstage/tstaged:0.1.0
#
# The build stage installs the build half of scripts/deps.sh's list and runs
# the Makefile's own `make all`; tests/deploy/check_dockerfile.py keeps both in
# step (package lists, the make line, the runtime libraries the binary needs).

# cuda (default) or cpu: the cpu variant builds and runs on debian:bookworm-slim
ARG VARIANT=cuda
ARG CUDA_VERSION=12.4.1

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04 AS build-cuda
ENV TS_CUDA=1
FROM debian:bookworm-slim AS build-cpu
ENV TS_CUDA=0

# build-cuda or build-cpu above: a stage of this file, whose images are tagged
# checkov:skip=CKV_DOCKER_7: the FROM names a stage of this file, not an image
# hadolint ignore=DL3006
FROM build-${VARIANT} AS build
ARG GIT_REV=unknown
# Versions follow the base image's release (Ubuntu 22.04 / Debian 12): pinning
# each would break on every point release of the archive.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential pkg-config libmicrohttpd-dev libjansson-dev libopenblas-dev \
        libcurl4-openssl-dev libhwloc-dev libucx-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make -j"$(nproc)" CUDA="${TS_CUDA}" GIT_REV="${GIT_REV}" all \
 && build/tstaged --version

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu22.04 AS runtime-cuda
FROM debian:bookworm-slim AS runtime-cpu

# hadolint ignore=DL3006
FROM runtime-${VARIANT} AS runtime
LABEL org.opencontainers.image.title="tstaged" \
      org.opencontainers.image.description="tstage: a tensor staging service for GPU nodes" \
      org.opencontainers.image.licenses="Apache-2.0"
# the runtime libraries of the build stage's -dev packages, nothing else
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libmicrohttpd12 libjansson4 libopenblas0-pthread libcurl4 libhwloc15 libucx0 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 tstage \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin tstage
COPY --from=build /src/build/tstaged /usr/local/bin/tstaged
USER 10001:10001
# TSTAGE_TOKEN_FILE names where the token is mounted; the token itself is
# never in the image
# hadolint ignore=DL3064
ENV TSTAGE_BIND=0.0.0.0 \
    TSTAGE_PORT=8470 \
    TSTAGE_TOKEN_FILE=/run/secrets/tstage-token
EXPOSE 8470
# no curl in the image: tstaged checks itself (exit 0 on a 2xx answer)
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/tstaged", "--probe", "http://127.0.0.1:8470/readyz"]
ENTRYPOINT ["/usr/local/bin/tstaged"]
