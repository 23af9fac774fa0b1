# A local stand-in for the upstream redis:7.2-alpine image (what deploy/compose/compose.yaml names), for
# machines without an image registry: `gyre bench cluster` builds it from the local Debian base with
# Debian's redis-server (7.0, TLS built in). As upstream: a `redis` user (uid 999, group 1000, which the
# Kubernetes manifests run as) that owns /data, and redis-cli for the compose file's healthcheck.
ARG BASE_IMAGE=localhost/gyre/debian-base:bookworm
FROM ${BASE_IMAGE}
RUN groupadd --system --gid 1000 redis && useradd --system --uid 999 --gid redis --no-create-home redis \
 && echo force-unsafe-io > /etc/dpkg/dpkg.cfg.d/gyre-build \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /etc/dpkg/dpkg.cfg.d/gyre-build \
 && install -d -o redis -g redis -m 0750 /data
EXPOSE 6379
CMD ["redis-server"]
