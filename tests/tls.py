"""A throwaway certificate authority for tests: a CA, server and client certificates, as PEM files.

Generated at test time with ``cryptography`` so that no key material lives in the repository and
nothing expires between runs. EC P-256 keys: fast to generate, accepted by etcd (Go) and Python's ssl.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)
_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


@dataclass(frozen=True)
class CertFiles:
    """One identity on disk: its certificate and private key (PEM), and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


def _name(cn: str | None) -> x509.Name:
    return x509.Name([] if cn is None else [x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


class TestCA:
    """A CA that issues server and client certificates into ``directory``."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "elasticd test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_path = directory / "ca.pem"
        self.ca_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        cn: str,
        *,
        server: bool = False,
        client: bool = True,
        hosts: tuple[str, ...] = (),
        subject_cn: bool = True,
    ) -> CertFiles:
        """A leaf certificate for ``cn``; ``hosts`` (IPs or DNS names) go into the SAN. Without
        ``subject_cn`` the subject is empty and ``cn`` is only a DNS name of the (then critical)
        SAN: a client certificate that etcd's JSON gateway accepts with auth on."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn if subject_cn else None))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        sans = hosts if subject_cn else (*hosts, cn)
        if sans:
            names: list[x509.GeneralName] = []
            for host in sans:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=not subject_cn)
        cert = builder.sign(self._key, hashes.SHA256())
        stem = cn.replace("/", "_")
        files = CertFiles(self.directory / f"{stem}.pem", self.directory / f"{stem}-key.pem", self.ca_path)
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, files.key)
        return files

    def server(self, cn: str = "etcd", hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> CertFiles:
        """For etcd's client and peer listeners: it serves, and (as a peer) also connects."""
        return self.issue(cn, server=True, client=True, hosts=hosts)
