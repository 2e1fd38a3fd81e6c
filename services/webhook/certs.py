"""The webhook's certificate, kept by the webhook itself (no cert-manager needed).

One Secret holds a CA (ten years) and a serving certificate signed by it for the
webhook's Service names. The CA goes into the webhook configurations' ``caBundle`` and
stays; the serving certificate is replaced when it comes within ``webhook.renewDays``
of its end (or no longer names the webhook's hosts), so the API server trusts the old
and the new one alike while replicas reload. Two replicas racing to make or renew it
settle on whichever wrote the Secret first (its ``resourceVersion``).
"""

from __future__ import annotations

import base64
import datetime
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kubernetes_asyncio.client import ApiException

from shared import kube, pki
from shared.config import WebhookConfig

log = logging.getLogger(__name__)

CA_DAYS = 3650


@dataclass(frozen=True)
class Bundle:
    """What the webhook serves with, and the version of the Secret it came from."""

    ca: pki.KeyPair
    serving: pki.KeyPair
    version: str


def hosts(cfg: WebhookConfig) -> list[str]:
    """Every name the API server may call the webhook by."""
    names = [
        f"{cfg.service}.{cfg.namespace}.svc",
        f"{cfg.service}.{cfg.namespace}.svc.cluster.local",
    ]
    host = urlsplit(cfg.url).hostname if cfg.url else None
    return [*names, host] if host else names


def due(serving: pki.KeyPair, cfg: WebhookConfig, now: datetime.datetime) -> bool:
    """Must this serving certificate be replaced now?"""
    left = pki.not_after(serving.cert) - now
    return left < datetime.timedelta(days=cfg.renew_days) or pki.hosts_of(serving.cert) != set(
        hosts(cfg)
    )


def _path(cfg: WebhookConfig, name: str = "") -> str:
    base = f"/api/v1/namespaces/{cfg.namespace}/secrets"
    return f"{base}/{name}" if name else base


def _bundle(secret: dict[str, Any]) -> Bundle | None:
    data = secret.get("data") or {}
    try:
        files = {k: base64.b64decode(data[k]) for k in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
    except (KeyError, ValueError):
        return None
    return Bundle(
        ca=pki.KeyPair(cert=files["ca.crt"], key=files["ca.key"]),
        serving=pki.KeyPair(cert=files["tls.crt"], key=files["tls.key"]),
        version=str(secret.get("metadata", {}).get("resourceVersion", "")),
    )


def _secret(cfg: WebhookConfig, ca: pki.KeyPair, serving: pki.KeyPair) -> dict[str, Any]:
    files = {"ca.crt": ca.cert, "ca.key": ca.key, "tls.crt": serving.cert, "tls.key": serving.key}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": cfg.secret, "namespace": cfg.namespace},
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in files.items()},
    }


async def _read(api: kube.Client, cfg: WebhookConfig) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await kube.request(api, "GET", _path(cfg, cfg.secret))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


async def ensure(api: kube.Client, cfg: WebhookConfig) -> Bundle:
    """The current certificate, made or renewed first if needed."""
    now = datetime.datetime.now(datetime.UTC)
    for _ in range(5):  # another replica may write between our read and our write
        secret = await _read(api, cfg)
        current = _bundle(secret) if secret is not None else None
        if current is not None and not due(current.serving, cfg, now):
            return current
        ca = current.ca if current is not None else pki.new_ca("tessera-webhook-ca", days=CA_DAYS)
        serving = pki.issue(
            ca, f"{cfg.service}.{cfg.namespace}.svc", hosts=hosts(cfg), days=cfg.certificate_days
        )
        body = _secret(cfg, ca, serving)
        try:
            if secret is None:
                written = await kube.request(api, "POST", _path(cfg), body)
                log.info("made the webhook's CA and certificate (Secret %s)", cfg.secret)
            else:
                body["metadata"]["resourceVersion"] = secret["metadata"]["resourceVersion"]
                written = await kube.request(api, "PUT", _path(cfg, cfg.secret), body)
                log.info("renewed the webhook's certificate (Secret %s)", cfg.secret)
        except ApiException as exc:
            if exc.status == 409:  # another replica wrote first: take its certificate
                continue
            raise
        made = _bundle(written)
        assert made is not None
        return made
    raise RuntimeError(f"could not settle the Secret {cfg.secret}: it keeps changing")
