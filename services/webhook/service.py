"""The admission webhook: an aiohttp server over TLS that the API server calls when a pod
is created.

- ``/mutate``: a pod that asks for a device Tessera manages and names no scheduler (or
  ``default-scheduler``) gets the first of ``scheduler.names`` (HAMi's webhook does the
  same for its scheduler), unless ``webhook.setSchedulerName`` is off. Each container of
  a pod of ``scheduler.names`` that asks a vendor's memory, memory percentage or cores
  but none of its count names gets the count name (``defaultGPUNum``) in its limits and
  requests, as HAMi's webhook does: the kubelet calls the node agent's ``Allocate``
  only for a registered name the container asks for (the watcher refuses the pod
  otherwise, shared/core/request.py).
- ``/validate``: a pod of one of ``scheduler.names`` whose device request can never be
  placed is refused with the message the watcher would put in its Event; any pod that
  carries a grant annotation at creation (Tessera's ``tessera.io/grant`` and its
  companions, or HAMi's and Volcano's assignment keys) is refused: only the binder
  writes them, through the Binding. A Volcano Job (``batch.volcano.sh/v1alpha1``) whose
  ``schedulerName`` (default ``volcano``) is one of ``scheduler.names`` is refused at
  creation when Volcano's admission would refuse it (shared/core/vcjob.py, and its queue
  missing while others exist, not Open, ``root`` or not a leaf), and at an update that
  changes more than Volcano lets change or breaks a rule the Job kept.
- ``/healthz`` and ``/readyz`` (ready once it serves with a certificate the API server
  trusts).

It keeps its own certificate (certs.py) and writes its Mutating- and
ValidatingWebhookConfiguration (``webhook.configuration``) with that CA, its failure
policy and the namespaces it serves: never ``kube-system``, never its own namespace,
never one labelled ``tessera.io/webhook: disabled``. A request it cannot make sense of
is let through with a warning and a log line: the watcher still checks every pod.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes_asyncio.client import ApiException

from services.webhook import certs
from shared import kube
from shared.config import Config, request_parser
from shared.core import annotations as ann
from shared.core import vcjob
from shared.core.model import PodRequest
from shared.core.request import rejection
from shared.health import API_CHECK_TTL_S, Cached, Health
from shared.runtime import process_main

log = logging.getLogger(__name__)

NAME = "webhook"
QUEUES = "/apis/scheduling.volcano.sh/v1beta1/queues"
OPT_OUT = "tessera.io/webhook"
"""Label a namespace ``tessera.io/webhook: disabled`` to leave it out."""
DEFAULT_SCHEDULER = "default-scheduler"
GRANT_KEYS = frozenset(
    {ann.GRANT, ann.SIGNATURE, ann.NODE, ann.BIND_TIME}
    | {key for keys in ann.COMPAT_KEYS.values() for key in keys.values()}
)
"""Annotations only the scheduler writes (at bind time): a pod may not bring its own."""


def forged_annotations(pod: dict[str, Any]) -> list[str]:
    """The scheduler-only annotations a new pod carries."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return sorted(k for k in annotations if k in GRANT_KEYS)


class Webhook:
    """The two admission decisions, on plain dicts (no I/O)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.parser = request_parser(cfg)

    def mutate(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The JSON patch for a new pod (empty: nothing to change)."""
        patch: list[dict[str, Any]] = []
        scheduler = (pod.get("spec") or {}).get("schedulerName")
        if (
            self.cfg.webhook.set_scheduler_name
            and scheduler in (None, "", DEFAULT_SCHEDULER)
            and self.parser.wants_devices(pod)
        ):
            scheduler = self.cfg.scheduler.names[0]
            patch.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler})
        if scheduler in self.cfg.scheduler.names:
            patch.extend(self.add_counts(pod))
        return patch

    def add_counts(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The JSON patch giving each container that asks memory or cores without a
        device count the count (``RequestParser.missing_counts``). Limits and requests
        alike: the API server wants an extended resource's request equal to its limit."""
        spec = pod.get("spec") or {}
        added: dict[tuple[str, int], dict[str, str]] = {}
        for missing in self.parser.missing_counts(pod):
            where = (missing.key, missing.index)
            added.setdefault(where, {})[missing.count_name] = str(missing.count)
            log.info(
                "pod %s: container %s names no device count; adding %s: %d",
                (pod.get("metadata") or {}).get("name", "?"),
                missing.container,
                missing.count_name,
                missing.count,
            )
        patch: list[dict[str, Any]] = []
        for (key, index), counts in added.items():
            base = f"/spec/{key}/{index}/resources"
            resources = spec[key][index].get("resources")
            if not isinstance(resources, dict):
                patch.append({"op": "add", "path": base, "value": {}})
                resources = {}
            for part in ("limits", "requests"):
                if not isinstance(resources.get(part), dict):
                    patch.append({"op": "add", "path": f"{base}/{part}", "value": dict(counts)})
                    continue
                for name, value in counts.items():
                    pointer = name.replace("~", "~0").replace("/", "~1")
                    patch.append({"op": "add", "path": f"{base}/{part}/{pointer}", "value": value})
        return patch

    def validate(self, pod: dict[str, Any]) -> str | None:
        """Why a new pod is refused, or None."""
        forged = forged_annotations(pod)
        if forged:
            return (
                f"annotation {', '.join(forged)} is written by the scheduler when it binds "
                "a pod; a pod may not carry it at creation"
            )
        if (pod.get("spec") or {}).get("schedulerName") not in self.cfg.scheduler.names:
            return None
        parsed = self.parser.parse(pod)
        if isinstance(parsed, PodRequest):
            return None
        return rejection(parsed)

    def validate_job(
        self,
        job: dict[str, Any],
        old: dict[str, Any] | None = None,
        queues: dict[str, dict[str, Any]] | None = None,
    ) -> str | None:
        """Why a Volcano Job (created, or updated from ``old``) is refused, or None.
        ``queues``: every Queue by name (None: not read; the queue is not checked)."""
        spec = job.get("spec") or {}
        if (spec.get("schedulerName") or vcjob.DEFAULT_SCHEDULER) not in self.cfg.scheduler.names:
            return None  # another controller's Job (Volcano's, beside it)
        name = (job.get("metadata") or {}).get("name") or ""
        errors = vcjob.check(name, spec)
        if old is not None:
            # An update may not change what Volcano keeps, nor break a rule the Job kept
            # (one made invalid while the webhook was down may still be fixed).
            kept = {e.field for e in vcjob.check(name, old.get("spec") or {})}
            errors = vcjob.check_update(old.get("spec") or {}, spec) + [
                e for e in errors if e.field not in kept
            ]
        elif queues is not None:
            errors += queue_errors(spec.get("queue") or vcjob.DEFAULT_QUEUE, queues)
        return vcjob.refusal(errors) if errors else None

    def review(
        self,
        body: dict[str, Any],
        mutating: bool,
        queues: dict[str, dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The AdmissionReview answer to one AdmissionReview request (``queues``: see
        :meth:`validate_job`)."""
        request = body.get("request") or {}
        response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
        pod = request.get("object")
        operation = request.get("operation")
        if is_job(request) and isinstance(pod, dict) and not mutating:
            old = request.get("oldObject") if operation == "UPDATE" else None
            try:
                refused = self.validate_job(pod, old if isinstance(old, dict) else None, queues)
            except Exception as exc:  # never block Jobs on the webhook's own bug
                log.exception("could not review a Job in %s", request.get("namespace"))
                response["warnings"] = [f"tessera webhook could not check this Job: {exc}"]
                refused = None
            if refused is not None:
                response["allowed"] = False
                response["status"] = {"code": 403, "reason": "Forbidden", "message": refused}
                log.info("refused a Job in %s: %s", request.get("namespace"), refused)
        elif operation == "CREATE" and isinstance(pod, dict) and not is_job(request):
            try:
                if mutating:
                    patch = self.mutate(pod)
                    if patch:
                        response["patchType"] = "JSONPatch"
                        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
                else:
                    refused = self.validate(pod)
                    if refused is not None:
                        response["allowed"] = False
                        response["status"] = {
                            "code": 403,
                            "reason": "Forbidden",
                            "message": refused,
                        }
                        log.info("refused a pod in %s: %s", request.get("namespace"), refused)
            except Exception as exc:  # never block pods on the webhook's own bug
                log.exception("could not review a pod in %s", request.get("namespace"))
                response["allowed"] = True
                response["warnings"] = [f"tessera webhook could not check this pod: {exc}"]
        return {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }


def is_job(request: dict[str, Any]) -> bool:
    """Is the AdmissionReview request about a Volcano Job?"""
    kind = request.get("kind") or {}
    return bool(kind.get("group") == "batch.volcano.sh" and kind.get("kind") == "Job")


def queue_errors(name: str, queues: dict[str, dict[str, Any]]) -> list[vcjob.JobError]:
    """Volcano's queue checks at a Job's creation: the queue exists (here: once any
    Queue does, as Tessera's scheduler reads queues), is Open, is not ``root`` and has
    no child queues."""
    where = "spec.queue"
    if name == "root":
        return [vcjob.JobError(where, "a Job may not be submitted to the root queue")]
    queue = queues.get(name)
    if queue is None:
        if not queues:
            return []
        return [vcjob.JobError(where, f'queue "{name}" does not exist; create it or name another')]
    state = (queue.get("status") or {}).get("state") or (queue.get("spec") or {}).get("state")
    if (state or "Open") != "Open":
        return [vcjob.JobError(where, f'queue "{name}" is {state}: only an Open queue takes Jobs')]
    children = sum(1 for q in queues.values() if (q.get("spec") or {}).get("parent") == name)
    if children:
        return [
            vcjob.JobError(
                where, f'queue "{name}" has {children} child queues: submit to a leaf queue'
            )
        ]
    return []


JOB_RULE = {
    "apiGroups": ["batch.volcano.sh"],
    "apiVersions": ["v1alpha1"],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["jobs"],
    "scope": "Namespaced",
}
"""The Volcano Jobs the validating webhook checks (not their status subresource)."""


def configurations(cfg: Config, ca: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The Mutating- and ValidatingWebhookConfiguration (API path, object)."""
    w = cfg.webhook
    selector = json.loads(json.dumps(w.namespace_selector or {}))
    expressions = list(selector.get("matchExpressions") or [])
    expressions += [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": sorted({"kube-system", w.namespace}),
        },
        {"key": OPT_OUT, "operator": "NotIn", "values": ["disabled"]},
    ]
    selector["matchExpressions"] = expressions
    out = []
    for kind, path, suffix in (
        ("MutatingWebhookConfiguration", "mutatingwebhookconfigurations", "mutate"),
        ("ValidatingWebhookConfiguration", "validatingwebhookconfigurations", "validate"),
    ):
        client: dict[str, Any] = {"caBundle": base64.b64encode(ca).decode()}
        if w.url:
            client["url"] = f"{w.url.rstrip('/')}/{suffix}"
        else:
            client["service"] = {
                "namespace": w.namespace,
                "name": w.service,
                "path": f"/{suffix}",
                "port": 443,
            }
        hook: dict[str, Any] = {
            "name": f"{suffix}.pods.tessera.io",
            "clientConfig": client,
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            "failurePolicy": w.failure_policy,
            "namespaceSelector": selector,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }
        hooks = [hook]
        if kind.startswith("Mutating"):
            hook["reinvocationPolicy"] = "Never"
        else:
            hooks.append({**hook, "name": "validate.jobs.tessera.io", "rules": [JOB_RULE]})
        obj = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": w.configuration},
            "webhooks": hooks,
        }
        out.append((f"/apis/admissionregistration.k8s.io/v1/{path}/{w.configuration}", obj))
    return out


async def apply_configurations(api: kube.Client, cfg: Config, ca: bytes) -> None:
    """Write both configurations (server-side apply: created or brought up to date)."""
    for path, obj in configurations(cfg, ca):
        await kube.request(
            api,
            "PATCH",
            path,
            obj,
            query={"fieldManager": "tessera-webhook", "force": "true"},
            content_type="application/apply-patch+yaml",
        )


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
        if not mutating and is_job(asked) and asked.get("operation") == "CREATE":
            queues = await self._queues()
        return web.json_response(self.webhook.review(body, mutating, queues))

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
