"""DNS rebinding on loopback for the webhook destination tests: a resolver
that answers one name with chosen addresses in turn, a port free on both
127.0.0.1 and 127.0.0.2, the settings that let 127.0.0.2 through as if it
were public, and a certificate made for chosen names."""

from __future__ import annotations

import socket
import threading
from datetime import UTC, datetime, timedelta
from ipaddress import ip_network
from typing import Any

from metering.webhooks import DeliverySettings

REBIND_HOST = "hooks.rebind.test"


class RebindingResolver:
    """``socket.getaddrinfo`` that answers REBIND_HOST with the given addresses in
    turn (the last one from then on); every other name resolves as usual."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked = 0
        self.real = socket.getaddrinfo
        self.lock = threading.Lock()

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name != REBIND_HOST:
            return self.real(host, port, *args, **kwargs)
        with self.lock:
            answer = self.answers[min(self.asked, len(self.answers) - 1)]
            self.asked += 1
        return self.real(answer, port, *args, **kwargs)


def port_free_on_both() -> int:
    """A port free on 127.0.0.1 and on 127.0.0.2 alike (one the system hands
    out on one address may be another socket's on the other)."""
    for _ in range(100):
        with socket.socket() as internal, socket.socket() as public:
            internal.bind(("127.0.0.1", 0))
            port = int(internal.getsockname()[1])
            try:
                public.bind(("127.0.0.2", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no port free on both loopback addresses")


def settings_for(public_address: str) -> DeliverySettings:
    return DeliverySettings(
        timeout_seconds=2.0,
        schedule_seconds=(0.2,),
        allowed_networks=(ip_network(f"{public_address}/32"),),
    )


def certificate(names: list[str]) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, server certificate, server key), PEM, for ``names``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "metering test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem
