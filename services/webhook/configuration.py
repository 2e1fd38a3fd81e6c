"""The webhook's Mutating- and ValidatingWebhookConfiguration: what the API server sends
it (pods at creation; Volcano Jobs, Queues, PodGroups and HyperNodes at creation and
update), with its CA, failure policy and the namespaces it serves: never ``kube-system``,
never its own namespace, never one labelled ``tessera.io/webhook: disabled``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from shared import kube
from shared.config import Config

OPT_OUT = "tessera.io/webhook"
"""Label a namespace ``tessera.io/webhook: disabled`` to leave it out."""

JOB_RULE = {
    "apiGroups": ["batch.volcano.sh"],
    "apiVersions": ["v1alpha1"],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["jobs"],
    "scope": "Namespaced",
}
"""The Volcano Jobs the validating webhook checks (not their status subresource)."""

QUEUE_RULE = {
    "apiGroups": ["scheduling.volcano.sh"],
    "apiVersions": ["v1beta1"],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["queues"],
    "scope": "Cluster",
}
"""The Volcano Queues it checks (cluster-scoped: the namespace selector never skips one)."""


PODGROUP_RULE = {
    "apiGroups": ["scheduling.volcano.sh"],
    "apiVersions": ["v1beta1"],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["podgroups"],
    "scope": "Namespaced",
}
"""The Volcano PodGroups it checks (their ``subGroupPolicy``; not their status)."""


HYPERNODE_RULE = {
    "apiGroups": ["topology.volcano.sh"],
    "apiVersions": ["v1alpha1"],
    "operations": ["CREATE", "UPDATE"],
    "resources": ["hypernodes"],
    "scope": "Cluster",
}
"""The Volcano HyperNodes it checks (their members and cycles; not their status)."""


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
            hooks.append({**hook, "name": "validate.queues.tessera.io", "rules": [QUEUE_RULE]})
            hooks.append(
                {**hook, "name": "validate.podgroups.tessera.io", "rules": [PODGROUP_RULE]}
            )
            hooks.append(
                {**hook, "name": "validate.hypernodes.tessera.io", "rules": [HYPERNODE_RULE]}
            )
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
