"""Certificates without an external tool: a CA, and serving certificates it signs.

Used for the bus's TLS (``tessera secrets``, the local cluster) and the local API
server. Keys are ECDSA P-256 (fast to make, accepted by nats-server, Go and Python TLS);
everything is PEM bytes, so callers write files or Secret data as they need.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key."""

    cert: bytes
    key: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)


def new_ca(common_name: str, *, days: int = 3650) -> KeyPair:
    """A self-signed CA certificate that may sign serving certificates."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert=cert.public_bytes(serialization.Encoding.PEM), key=_key_pem(key))


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    hosts: Iterable[str],
    days: int = 365,
    client: bool = False,
    organization: str = "",
) -> KeyPair:
    """A certificate signed by ``ca`` for ``hosts`` (DNS names or IP addresses), for
    serving TLS (and, with ``client``, for presenting as a client too). ``organization``
    is the subject's O: the group a Kubernetes API server reads from a client
    certificate (``system:nodes`` for a kubelet)."""
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError("the CA key must be ECDSA or RSA")
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, *([ExtendedKeyUsageOID.CLIENT_AUTH] * client)]
    start, end = _validity(days)
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        subject.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if names:  # a client certificate names no host (an empty SAN is invalid)
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = (
        builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert=cert.public_bytes(serialization.Encoding.PEM), key=_key_pem(key))


def rsa_key_pair(bits: int = 2048) -> tuple[bytes, bytes]:
    """A PEM RSA private key and its PEM public key (the API server's service-account
    token signing keys)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public


def not_after(cert: bytes) -> datetime.datetime:
    """When a PEM certificate ends."""
    return x509.load_pem_x509_certificate(cert).not_valid_after_utc


def hosts_of(cert: bytes) -> set[str]:
    """The DNS names and IP addresses a PEM certificate is valid for."""
    found = x509.load_pem_x509_certificate(cert)
    try:
        names = found.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in names.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in names.get_values_for_type(x509.IPAddress)
    }
