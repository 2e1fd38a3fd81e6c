"""The admission webhook: an aiohttp server over TLS that the API server calls when a pod
is created (or a Volcano Job created or updated).

- ``/mutate``: the scheduler name and the device counts a new pod lacks (mutation.py).
- ``/validate``: a refusal for a pod whose device request can never be placed or that
  brings a grant annotation, and for a Volcano Job Volcano's admission would refuse
  (validation.py).
- ``/healthz`` and ``/readyz`` (ready once it serves with a certificate the API server
  trusts).

This module owns the AdmissionReview answer (:class:`Webhook`) and the server. It keeps
its own certificate (certs.py) and writes its Mutating- and
ValidatingWebhookConfiguration (``webhook.configuration``) with that CA
(configuration.py). A request it cannot make sense of is let through with a warning and
a log line: the watcher still checks every pod.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes_asyncio.client import ApiException

from services.webhook import certs
from services.webhook.configuration import apply_configurations
from services.webhook.mutation import Mutation
from services.webhook.validation import (
    Validation,
    hypernode_refusal,
    is_hypernode,
    is_job,
    is_podgroup,
    is_queue,
    podgroup_refusal,
    queue_refusal,
)
from shared import kube
from shared.config import Config, request_parser
from shared.health import API_CHECK_TTL_S, Cached, Health
from shared.runtime import process_main

log = logging.getLogger(__name__)

NAME = "webhook"
QUEUES = "/apis/scheduling.volcano.sh/v1beta1/queues"
HYPERNODES = "/apis/topology.volcano.sh/v1alpha1/hypernodes"


class Webhook(Mutation, Validation):
    """The admission decisions, on plain dicts (no I/O): :meth:`mutate` (mutation.py),
    :meth:`validate` and :meth:`validate_job` (validation.py), and the AdmissionReview
    answer that chooses between them."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.parser = request_parser(cfg)

    def review(
        self,
        body: dict[str, Any],
        mutating: bool,
        queues: dict[str, dict[str, Any]] | None = None,
        hypernodes: dict[str, dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The AdmissionReview answer to one AdmissionReview request (``queues``: see
        :meth:`validate_job`; ``hypernodes``: every HyperNode by name, None when unread)."""
        request = body.get("request") or {}
        response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
        pod = request.get("object")
        operation = request.get("operation")
        where = f"in {request.get('namespace')}"
        if isinstance(pod, dict) and is_podgroup(request):
            if not mutating:
                old = request.get("oldObject") if operation == "UPDATE" else None
                was = old if isinstance(old, dict) else None
                _checked(
                    response, "PodGroup", where, lambda: podgroup_refusal(pod, was, hypernodes)
                )
        elif isinstance(pod, dict) and is_hypernode(request):
            if not mutating:
                _checked(response, "HyperNode", "", lambda: hypernode_refusal(pod, hypernodes))
        elif isinstance(pod, dict) and is_queue(request):
            if not mutating:
                capacity = self.cfg.scheduler.queue_plugin == "capacity"
                _checked(response, "Queue", "", lambda: queue_refusal(pod, queues, capacity))
        elif isinstance(pod, dict) and is_job(request):
            if not mutating:
                old = request.get("oldObject") if operation == "UPDATE" else None
                earlier = old if isinstance(old, dict) else None
                _checked(response, "Job", where, lambda: self.validate_job(pod, earlier, queues))
        elif isinstance(pod, dict) and operation == "CREATE" and not mutating:
            _checked(response, "pod", where, lambda: self.validate(pod))
        elif isinstance(pod, dict) and operation == "CREATE":
            try:
                patch = self.mutate(pod)
            except Exception as exc:  # never block pods on the webhook's own bug
                log.exception("could not review a pod %s", where)
                response["warnings"] = [f"tessera webhook could not check this pod: {exc}"]
                patch = []
            if patch:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }


def _checked(
    response: dict[str, Any], what: str, where: str, refusal: Callable[[], str | None]
) -> None:
    """Fill ``response`` from ``refusal()``: refused with its message, or allowed; allowed
    with a warning when the check itself fails (the webhook's own bug never blocks a
    user's object)."""
    try:
        refused = refusal()
    except Exception as exc:
        log.exception("could not review a %s %s", what, where)
        response["warnings"] = [f"tessera webhook could not check this {what}: {exc}"]
        return
    if refused is not None:
        response["allowed"] = False
        response["status"] = {"code": 403, "reason": "Forbidden", "message": refused}
        log.info("refused a %s %s: %s", what, where, refused)


class Server:
    """The HTTPS server, its certificate kept current."""

    def __init__(self, cfg: Config, api: kube.Client) -> None:
        self.cfg = cfg
        self.api = api
        self.webhook = Webhook(cfg)
        self.ready = False
        self.folder = Path(tempfile.mkdtemp(prefix="tessera-webhook-"))
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.bundle: certs.Bundle | None = None
        self.health = Health(alive=lambda: None)
        self.health.add("certificate", self._certificate)
        self.health.add("kube-apiserver", Cached(self._reachable, API_CHECK_TTL_S))

    def app(self) -> web.Application:
        """The aiohttp app: ``/mutate``, ``/validate`` (AdmissionReviews up to 8 MiB) and the health
        routes."""
        app = web.Application(client_max_size=8 << 20)
        app.router.add_post("/mutate", self._mutate)
        app.router.add_post("/validate", self._validate)
        self.health.install(app)
        return app

    async def _review(self, request: web.Request, mutating: bool) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return web.json_response({"error": "not an AdmissionReview"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "not an AdmissionReview"}, status=400)
        queues = None
        asked = body.get("request") or {}
        if not mutating and (
            (is_job(asked) and asked.get("operation") == "CREATE") or is_queue(asked)
        ):
            queues = await self._queues()
        hypernodes = None
        if not mutating and (is_podgroup(asked) or is_hypernode(asked)):
            hypernodes = await self._hypernodes()
        return web.json_response(self.webhook.review(body, mutating, queues, hypernodes))

    async def _hypernodes(self) -> dict[str, dict[str, Any]] | None:
        """Every HyperNode by name; None (tier names and cycles go unchecked: the
        allocator tells them) when they cannot be read now."""
        try:
            items, _ = await kube.list_all(self.api, HYPERNODES)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("cannot read HyperNodes: API error %s", exc.status)
                return None
            return {}
        except kube.UNREACHABLE as exc:
            log.warning("cannot read HyperNodes: %s", exc)
            return None
        return {str(h["metadata"]["name"]): h for h in items}

    async def _queues(self) -> dict[str, dict[str, Any]] | None:
        """Every Volcano Queue by name; None (the queue goes unchecked, as the
        scheduler checks it again) when they cannot be read now."""
        try:
            items, _ = await kube.list_all(self.api, QUEUES)
        except ApiException as exc:
            if exc.status != 404:  # 404: no Queue CRD, so no queues
                log.warning("cannot read Volcano queues: API error %s", exc.status)
                return None
            return {}
        except kube.UNREACHABLE as exc:
            log.warning("cannot read Volcano queues: %s", exc)
            return None
        return {str(q["metadata"]["name"]): q for q in items}

    async def _mutate(self, request: web.Request) -> web.Response:
        return await self._review(request, mutating=True)

    async def _validate(self, request: web.Request) -> web.Response:
        return await self._review(request, mutating=False)

    async def _certificate(self) -> str | None:
        return None if self.ready else "no serving certificate yet"

    async def _reachable(self) -> str | None:
        return await kube.unreachable(self.api)

    async def refresh(self) -> None:
        """Take the current certificate (renewing it when due) and serve with it; write
        the configurations when the CA is new to this replica."""
        bundle = await certs.ensure(self.api, self.cfg.webhook)
        if self.bundle is not None and bundle.version == self.bundle.version:
            return
        cert, key = self.folder / "tls.crt", self.folder / "tls.key"
        cert.write_bytes(bundle.serving.cert)
        key.touch(mode=0o600)
        key.write_bytes(bundle.serving.key)
        self.tls.load_cert_chain(cert, key)  # new handshakes use it at once
        if self.bundle is None or self.bundle.ca.cert != bundle.ca.cert:
            await apply_configurations(self.api, self.cfg, bundle.ca.cert)
        self.bundle = bundle
        self.ready = True

    async def keep_fresh(self) -> None:
        """Refresh the certificate every ``webhook.checkIntervalS``; a failed refresh is logged and
        the old certificate kept serving."""
        while True:
            await asyncio.sleep(self.cfg.webhook.check_interval_s)
            try:
                await self.refresh()
            except Exception:
                log.exception("could not refresh the webhook's certificate; serving the old one")


async def run(cfg: Config, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set."""
    api = await kube.connect(cfg.kubernetes, NAME)
    server = Server(cfg, api)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    try:
        await server.refresh()
        site = web.TCPSite(runner, "0.0.0.0", cfg.webhook.port, ssl_context=server.tls)
        await site.start()
        log.info(
            "webhook serving on :%d (configuration %s)", cfg.webhook.port, cfg.webhook.configuration
        )
        fresh = asyncio.create_task(server.keep_fresh(), name="webhook:certificate")
        try:
            await stop.wait()
        finally:
            fresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fresh
    finally:
        await runner.cleanup()
        await api.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m services.webhook [--config FILE]``."""
    process_main(NAME, lambda cfg, stop, _args: run(cfg, stop), argv)
