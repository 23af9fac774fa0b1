"""Config section of transport security between hosts (`gyre.tls`): off by default (the embedded stack
talks over loopback), on in the compose deployment."""

from __future__ import annotations

from pathlib import Path

from gyre.config.base import Section


class TlsSection(Section):
    enabled: bool = False
    """Mutual TLS on every connection between Gyre's processes and to NATS and Redis: gRPC, the engines'
    HTTP, the proxy's HTTP (server side only: harnesses authenticate with their per-execution keys), NATS
    (`nats.url` may stay `nats://`; the client upgrades) and Redis (`redis.url` must be `rediss://`). The
    servers must be configured for TLS themselves (deploy/nats/nats.conf, deploy/redis/redis.conf),
    so the embedded stack, which starts plaintext ones on loopback, refuses it. The cells' collectives and
    snapshot pulls are TLS with `cell_agent.trainer.dist_backend: tls` (the TLS star); what stays
    plaintext where selected: gloo or NCCL, Mooncake, the weight-update group, SGLang's HTTP
    (`cell_agent.engine.backend: sglang`: its server takes no client certificates) and `/metrics`; keep
    them on a private network (deploy/k8s's NetworkPolicies)."""
    dir: Path = Path("/etc/gyre/tls")
    """Directory of `<identity>/tls.crt`, `tls.key`, `ca.crt` per identity (`gyre tls init --out DIR`
    writes them; a cert-manager Certificate's secret mounted at `DIR/<identity>/` holds the same keys).
    Identities: scheduler, proxy, runner, evaluator, packer, cell_agent, nats, redis, cli."""
