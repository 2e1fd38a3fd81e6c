"""What a cluster needs besides the manifests: its Secrets, and the bus's nats.conf.

``tessera secrets`` prints the three Secrets a Tessera namespace needs, made fresh:
``tessera-grant-key`` (the key that signs grants), ``tessera-bus`` (one NATS password
per user of shared/busauth.py) and ``tessera-nats-tls`` (a CA and the NATS server's
certificate for its Service names). ``tessera nats-conf`` renders
deploy/kustomize/base/nats.conf from shared/busauth.py (``--check``: fail when stale).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

import yaml

from shared import busauth, pki
from shared.config import NatsConfig

NATS_TLS_DIR = "/etc/nats/tls"
NATS_CONF_HEADER = """\
# The NATS server of a Tessera namespace. Generated from shared/busauth.py by
#   tessera nats-conf --out deploy/kustomize/base/nats.conf
# (tests/unit/test_busauth.py fails when it is stale): do not edit by hand.
# Passwords come from the Secret tessera-bus through the environment; the certificate
# from the Secret tessera-nats-tls (`tessera secrets` makes both).
server_name: $POD_NAME
port: 4222
http_port: 8222
jetstream {
  store_dir: /data
}
"""
NATS_SERVERS = 3
"""The StatefulSet's replicas: a JetStream cluster that keeps every stream 3 times."""
ROUTES_SERVICE = "nats-cluster"
"""The headless Service that names each NATS pod (``nats-0.nats-cluster``)."""


def _cluster_block() -> str:
    """Routes between the three servers, over TLS with the same certificate (each
    server checks the others' against the CA)."""
    routes = "\n".join(
        f"    nats-route://nats-{i}.{ROUTES_SERVICE}:6222" for i in range(NATS_SERVERS)
    )
    return (
        "cluster {\n  name: tessera\n  port: 6222\n"
        f"  routes: [\n{routes}\n  ]\n"
        f'  tls {{\n    cert_file: "{NATS_TLS_DIR}/tls.crt"\n'
        f'    key_file: "{NATS_TLS_DIR}/tls.key"\n'
        f'    ca_file: "{NATS_TLS_DIR}/ca.crt"\n    timeout: 5\n  }}\n}}\n'
    )


def nats_conf() -> str:
    """deploy/kustomize/base/nats.conf."""
    defaults = NatsConfig()
    return (
        NATS_CONF_HEADER
        + _cluster_block()
        + busauth.server_tls(f"{NATS_TLS_DIR}/tls.crt", f"{NATS_TLS_DIR}/tls.key")
        + busauth.server_authorization(
            stream=defaults.stream, inventory_bucket=defaults.inventory_bucket
        )
    )


def nats_hosts(namespace: str) -> list[str]:
    """Every name a client may use for the NATS Service, and the servers for each other
    (``nats-0.nats-cluster``...)."""
    names = []
    for service, prefix in (("nats", ""), (ROUTES_SERVICE, "*.")):
        for suffix in ("", f".{namespace}", f".{namespace}.svc", f".{namespace}.svc.cluster.local"):
            names.append(f"{prefix}{service}{suffix}")
    return names


def _secret(name: str, namespace: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(data.items())},
    }


def cluster_secrets(namespace: str, *, days: int = 825) -> list[dict[str, Any]]:
    """The Secrets of a Tessera namespace, with fresh keys and passwords."""
    ca = pki.new_ca(f"tessera-bus-ca.{namespace}", days=days * 4)
    server = pki.issue(
        ca, f"nats.{namespace}.svc", hosts=nats_hosts(namespace), days=days, client=True
    )
    return [
        _secret("tessera-grant-key", namespace, {"grant.key": secrets.token_hex(32).encode()}),
        _secret(
            "tessera-bus",
            namespace,
            {user: busauth.new_password().encode() for user in busauth.USERS},
        ),
        _secret(
            "tessera-nats-tls",
            namespace,
            {"ca.crt": ca.cert, "tls.crt": server.cert, "tls.key": server.key},
        ),
    ]


def secrets_yaml(namespace: str) -> str:
    """``tessera secrets``: the Secrets as one YAML stream for ``kubectl apply -f -``."""
    return yaml.safe_dump_all(cluster_secrets(namespace), sort_keys=False)
