"""A throw-away private CA for TLS tests: a CA, a server certificate for 127.0.0.1/localhost
and a client certificate for mutual TLS, written as PEM files (made with ``cryptography``).

The certificates carry the extensions Python 3.13's stricter default verification
(``VERIFY_X509_STRICT``) insists on: key usage, basic constraints, subject and authority key
identifiers, and the right extended key usage for a server and for a client.
"""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files of one test PKI."""

    ca: Path  # the CA certificate (what OUTBOX_CA_FILE points at)
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed none of these (for "wrong CA" tests)


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path, key):
    path.write_bytes(_pem_key(key))


def _ca(common_name):
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
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
    return certificate, key


def _leaf(ca_certificate, ca_key, common_name, usage, sans=()):
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def _pem_key(key):
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _server(ca_certificate, ca_key):
    return _leaf(
        ca_certificate,
        ca_key,
        "central.test",
        ExtendedKeyUsageOID.SERVER_AUTH,
        sans=(x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")),
    )


def ca_and_server_pem():
    """A CA certificate, and a server certificate for 127.0.0.1 and localhost it signed, with
    the server's key: ``(ca, certificate, key)`` as PEM bytes, for servers configured in memory."""
    ca_certificate, ca_key = _ca("Outbox Test Private CA")
    server, server_key = _server(ca_certificate, ca_key)
    return (
        ca_certificate.public_bytes(serialization.Encoding.PEM),
        server.public_bytes(serialization.Encoding.PEM),
        _pem_key(server_key),
    )


def make_pki(directory):
    """Write a CA, a server certificate (127.0.0.1, localhost) and a client certificate into
    ``directory``; return their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_certificate, ca_key = _ca("Outbox Test Private CA")
    server, server_key = _server(ca_certificate, ca_key)
    client, client_key = _leaf(ca_certificate, ca_key, "plant-a", ExtendedKeyUsageOID.CLIENT_AUTH)
    other_ca, _ = _ca("Some Other CA")
    pki = Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
        other_ca=directory / "other-ca.pem",
    )
    pki.ca.write_bytes(ca_certificate.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.server_key, server_key)
    pki.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.client_key, client_key)
    pki.other_ca.write_bytes(other_ca.public_bytes(serialization.Encoding.PEM))
    return pki
