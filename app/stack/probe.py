"""A container's health check: `python -m app.stack.probe --config F --identity NAME PORT` exits 0 when the
gRPC server on this host's PORT answers SERVING, 1 otherwise. It dials as the config says (with
`tls.enabled`, as `--identity` with that identity's certificate), which a plain gRPC probe cannot
(Kubernetes' `grpc:` probe and `grpc.insecure_channel` speak plaintext only).

It runs every few seconds in every container, so it reads only the config's `tls` section (and its
`GYRE_TLS__*` overrides) instead of loading and validating the whole config, which costs seconds of a
busy node's CPU; the service itself validated the same file when it started.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _tls_section(config: Path) -> tuple[bool, Path]:
    import yaml

    section = (yaml.safe_load(config.read_text()) or {}).get("tls") or {}
    enabled = os.environ.get("GYRE_TLS__ENABLED", str(section.get("enabled", False)))
    directory = os.environ.get("GYRE_TLS__DIR", section.get("dir", "/etc/gyre/tls"))
    return enabled.strip().lower() in ("1", "true", "yes", "on"), Path(directory)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.stack.probe", description=__doc__)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--identity", required=True, help="the TLS identity to dial as (the service's own)")
    parser.add_argument("--timeout-s", type=float, default=3.0)
    parser.add_argument("port", type=int)
    args = parser.parse_args(argv)

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from gyre import tls
    from gyre.rpc import sync_channel

    enabled, directory = _tls_section(args.config)
    if enabled:
        tls.configure(tls.TlsFiles.under(directory, args.identity))
    with sync_channel(f"127.0.0.1:{args.port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=args.timeout_s
            )
        except grpc.RpcError as e:
            print(f"UNREACHABLE: {e.code().name}")  # type: ignore[attr-defined]
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
