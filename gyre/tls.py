"""Transport security between hosts: one CA per deployment, one certificate per identity, mutual TLS.

    files = tls_files(config.tls, "scheduler")       # None when tls.enabled is false
    configure(files)                                  # this process's identity, set once at its start
    current()                                         # what gyre.rpc, gyre.http_host, the engine client,
                                                      # the NATS and Redis clients use (None: plaintext)
    issue(Path("tls"), {"scheduler": ["scheduler"], "cell_agent-0": ["cell-agent-0"], ...})  # gyre tls init

Layout, as `gyre tls init` writes it and as a cert-manager `Certificate`'s secret holds it (keys `tls.crt`,
`tls.key`, `ca.crt`), so a Kubernetes secret mounted at `<tls.dir>/<identity>/` works unchanged:

    <tls.dir>/<identity>/tls.crt     the identity's certificate (its DNS names, localhost, 127.0.0.1)
    <tls.dir>/<identity>/tls.key     its private key (mode 0600)
    <tls.dir>/<identity>/ca.crt      the deployment's CA, which every peer's certificate must chain to

A cell agent's certificate is its cell's own: subject `CN=cell_agent` (the role the authorization table,
NATS and Redis know) and the URI `urn:gyre:cell:<k>` (`cell_uri`), in `<tls.dir>/cell_agent-<k>/`
(`cell_directory`; a container mounts it at `<tls.dir>/cell_agent/`). The star admits a member claiming
cell k only with cell k's certificate, and a cell may give notice for itself alone (gyre.authz), so one
cell's key cannot pose as the core or as another cell. A cell agent refuses to start on a certificate that
names another cell, or none.

Every server asks for a client certificate and refuses a client without one the CA signed (gRPC, NATS,
Redis, the engines' HTTP); the proxy's harness-facing HTTP is TLS too but asks for none (a harness
authenticates with its per-execution key, as before). Clients check the server's name against its
certificate. Identities are the services (`scheduler`, `proxy`, `runner`, `evaluator`, `packer`,
and `cell_agent` for the cells, each cell with its own certificate), the servers `nats` and `redis`, and `cli` for tools outside the
deployment (`gyre status`, `gyre bench cluster`).
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
import re
import ssl
from collections.abc import Iterable
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
CELL_AGENT = "cell_agent"
"""The cell agents' role: the subject CN of every cell's certificate (`gyre.authz.CELL_AGENT`)."""
CELL_URI_PREFIX = "urn:gyre:cell:"
_CELL_DIRECTORY = re.compile(r"cell_agent-(0|[1-9][0-9]*)")


def cell_uri(cell: int) -> str:
    """The URI a certificate of cell `cell` names (its subjectAltName): `urn:gyre:cell:<cell>`."""
    return f"{CELL_URI_PREFIX}{cell}"


def cell_directory(cell: int) -> str:
    """The directory `gyre tls init` writes cell `cell`'s identity to, under tls.dir: `cell_agent-<cell>`."""
    return f"{CELL_AGENT}-{cell}"


def common_name(identity: str) -> str:
    """The subject CN `issue` gives `identity`: `cell_agent` for a cell's own (`cell_agent-<k>`), else itself."""
    return CELL_AGENT if _CELL_DIRECTORY.fullmatch(identity) else identity


def cell_of_uris(uris: Iterable[str]) -> int | None:
    """The cell a certificate's URIs name, or None: none, or more than one (then it names no one cell)."""
    cells = {uri[len(CELL_URI_PREFIX) :] for uri in uris if uri.startswith(CELL_URI_PREFIX)}
    if len(cells) != 1:
        return None
    (cell,) = cells
    return int(cell) if cell.isdigit() and (cell == "0" or not cell.startswith("0")) else None


def certificate_cell(cert: object) -> int | None:
    """The cell a peer certificate names, as `ssl.SSLSocket.getpeercert()` decodes it (None: no one cell)."""
    if not isinstance(cert, dict):
        return None
    return cell_of_uris(value for kind, value in cert.get("subjectAltName", ()) if kind == "URI")


@dataclass(frozen=True)
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

    @functools.cached_property
    def cell(self) -> int | None:
        """The cell this certificate names (`cell_uri`), or None: not a cell's certificate."""
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(self.cert.read_bytes())
        try:
            names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return None
        return cell_of_uris(names.get_values_for_type(x509.UniformResourceIdentifier))

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


def tls_files(section: TlsSection, identity: str, cell: int | None = None) -> TlsFiles | None:
    """The files of `identity` under `section.dir` (None when TLS is off); missing ones raise ValueError
    naming the file and the command that writes it. A cell agent (`cell` given) takes `cell_agent-<cell>/`
    where it exists (one directory holds every cell's: the local stack), else `cell_agent/` (a container's
    mount of its own cell's), and its certificate must name `cell` (ValueError otherwise)."""
    if not section.enabled:
        return None
    base = Path(section.dir)
    if cell is not None and (base / cell_directory(cell)).is_dir():
        files = TlsFiles(identity, *(base / cell_directory(cell) / f for f in (CERT_FILE, KEY_FILE, CA_FILE)))
    else:
        files = TlsFiles.under(base, identity)
    for path in (files.cert, files.key, files.ca):
        if not path.is_file():
            raise ValueError(
                f"tls: {path} not found (`gyre tls init --out {section.dir}` writes a CA and every "
                "identity's certificate; or mount the identity's secret there)"
            )
    if cell is not None and files.cell != cell:
        named = "no cell" if files.cell is None else f"cell {files.cell}"
        raise ValueError(
            f"tls: {files.cert} names {named}, not cell {cell}: each cell agent needs its own cell's certificate "
            f"(`gyre tls init` writes {base / cell_directory(cell)}; mount it at {base / identity})"
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
    usable as server and as client; returns each identity's directory. An identity named
    `cell_agent-<k>` (`cell_directory`) is cell k's: subject CN `cell_agent` and the URI `cell_uri(k)`. The CA's key stays in
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
        cell = _CELL_DIRECTORY.fullmatch(identity)
        if cell is not None:  # a cell's own identity: the cell agents' CN, its cell in a URI
            alt.append(x509.UniformResourceIdentifier(cell_uri(int(cell.group(1)))))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name(identity))]))
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
