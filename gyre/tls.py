"""Transport security between hosts: one CA per deployment, one certificate per identity, mutual TLS.

    files = tls_files(config.tls, "scheduler")       # None when tls.enabled is false
    configure(files)                                  # this process's identity, set once at its start
    current()                                         # what gyre.rpc, gyre.http_host, the engine client,
                                                      # the NATS and Redis clients use (None: plaintext)
    issue(Path("tls"), {"scheduler": ["scheduler"], "cell_agent": ["cell-agent-0", ...]})   # gyre tls init

Layout, as `gyre tls init` writes it and as a cert-manager `Certificate`'s secret holds it (keys `tls.crt`,
`tls.key`, `ca.crt`), so a Kubernetes secret mounted at `<tls.dir>/<identity>/` works unchanged:

    <tls.dir>/<identity>/tls.crt     the identity's certificate (its DNS names, localhost, 127.0.0.1)
    <tls.dir>/<identity>/tls.key     its private key (mode 0600)
    <tls.dir>/<identity>/ca.crt      the deployment's CA, which every peer's certificate must chain to

Every server asks for a client certificate and refuses a client without one the CA signed (gRPC, NATS,
Redis, the engines' HTTP); the proxy's harness-facing HTTP is TLS too but asks for none (a harness
authenticates with its per-execution key, as before). Clients check the server's name against its
certificate. Identities are the services (`scheduler`, `proxy`, `runner`, `evaluator`, `packer`,
`cell_agent`: one for every cell), the servers `nats` and `redis`, and `cli` for tools outside the
deployment (`gyre status`, `gyre bench cluster`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gyre.config.tls import TlsSection

CERT_FILE, KEY_FILE, CA_FILE = "tls.crt", "tls.key", "ca.crt"
LOCAL_NAMES = ("localhost",)
LOCAL_ADDRESSES = ("127.0.0.1", "::1")
"""Every certificate also names the loopback: a container's health check and a relay inside a sandbox
dial the service at 127.0.0.1."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """One identity's certificate, key and the CA its peers chain to."""

    identity: str
    cert: Path
    key: Path
    ca: Path

    @classmethod
    def under(cls, directory: Path, identity: str) -> TlsFiles:
        """`identity`'s files in `directory/<identity>/`, as `gyre tls init --out directory` writes them."""
        base = Path(directory) / identity
        return cls(identity, base / CERT_FILE, base / KEY_FILE, base / CA_FILE)

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(certificate chain, private key, CA) as PEM bytes."""
        return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()

    def server_context(self, require_client: bool = True) -> ssl.SSLContext:
        """A server's context: its certificate; clients must show one the CA signed unless told otherwise."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        context.verify_mode = ssl.CERT_REQUIRED if require_client else ssl.CERT_NONE
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client's context: trusts the CA only, checks the server's name, shows this identity."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context


def tls_files(section: TlsSection, identity: str) -> TlsFiles | None:
    """The files of `identity` under `section.dir` (None when TLS is off); missing ones raise ValueError
    naming the file and the command that writes it."""
    if not section.enabled:
        return None
    files = TlsFiles.under(section.dir, identity)
    for path in (files.cert, files.key, files.ca):
        if not path.is_file():
            raise ValueError(
                f"tls: {path} not found (`gyre tls init --out {section.dir}` writes a CA and every "
                "identity's certificate; or mount the identity's secret there)"
            )
    return files


_current: TlsFiles | None = None


def configure(files: TlsFiles | None) -> None:
    """Set this process's identity (None: plaintext, the embedded default)."""
    global _current
    _current = files


def current() -> TlsFiles | None:
    return _current


def http_scheme() -> str:
    """The scheme of URLs this process hands out for its HTTP servers."""
    return "https" if _current is not None else "http"


# ---- issuing: `gyre tls init` ----------------------------------------------------------------------


def issue(out: Path, identities: dict[str, list[str]], days: int = 365) -> dict[str, Path]:
    """A new CA and, for each identity, a key and a certificate for its DNS names (plus the loopback),
    usable as server and as client; returns each identity's directory. The CA's key stays in
    `out/ca/ca.key` (0600) and signs nothing else."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Gyre deployment CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    _write(out / "ca" / "ca.key", _key_pem(ca_key), private=True)
    _write(out / "ca" / CA_FILE, ca_pem)
    written: dict[str, Path] = {}
    for identity, names in identities.items():
        key = ec.generate_private_key(ec.SECP256R1())
        dns = list(dict.fromkeys([*names, *LOCAL_NAMES]))
        alt: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
        alt += [x509.IPAddress(ipaddress.ip_address(a)) for a in LOCAL_ADDRESSES]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        directory = out / identity
        _write(directory / KEY_FILE, _key_pem(key), private=True)
        _write(directory / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM))
        _write(directory / CA_FILE, ca_pem)
        written[identity] = directory
    return written


def _key_pem(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)
