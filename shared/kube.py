"""kubernetes-asyncio helpers every service shares: connecting, binding, telling the user.

Hot paths (watching every pod, listing every node) read raw JSON and decode it with
msgspec into small Structs (see the watcher); the generated models are kept for the
rare writes here.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient, ApiException

from shared.config import KubernetesConfig
from shared.core.model import NodeName, PodRef

REPORTING_COMPONENT = "tessera"


async def connect(cfg: KubernetesConfig) -> ApiClient:
    """An API client from ``cfg.kubeconfig``, else ``$KUBECONFIG``, else in-cluster."""
    configuration = client.Configuration()
    path = cfg.kubeconfig or os.environ.get("KUBECONFIG", "")
    if path:
        await config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # One connection pool sized for the binder's concurrency; the default (4) serialises.
    configuration.connection_pool_maxsize = max(cfg.burst // 4, 16)
    return ApiClient(configuration)


async def bind(
    api: ApiClient,
    pod: PodRef,
    node: NodeName,
    annotations: Mapping[str, str] | None = None,
) -> None:
    """Bind ``pod`` to ``node`` with ONE write: a Binding whose metadata carries annotations.

    The API server copies the Binding's annotations onto the pod in the same update that
    sets ``nodeName``, so a grant and its node land atomically. The call answers with a
    ``Status`` rather than a Binding; the generated client would fail to deserialise it,
    so the response is not decoded (``_preload_content=False``). ``uid`` in the Binding
    makes the write fail if the pod was replaced by another of the same name.
    """
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
            "annotations": dict(annotations or {}),
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await request(api, "POST", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/binding", body)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def post_event(
    api: ApiClient,
    pod: PodRef,
    *,
    reason: str,
    message: str,
    kind: Literal["Normal", "Warning"] = "Normal",
    component: str = "tessera",
) -> None:
    """Record a Kubernetes Event on the pod (``kubectl describe pod`` shows it)."""
    now = _now()
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": component},
        "reportingComponent": f"{REPORTING_COMPONENT}/{component}",
        "reportingInstance": os.environ.get("HOSTNAME", component),
        "firstTimestamp": now.isoformat(),
        "lastTimestamp": now.isoformat(),
        "count": 1,
    }
    await request(api, "POST", f"/api/v1/namespaces/{pod.namespace}/events", body)


async def set_pod_condition(
    api: ApiClient,
    pod: PodRef,
    *,
    type_: str,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
) -> None:
    """Set one condition in the pod's status (strategic merge keyed by condition type)."""
    patch: dict[str, Any] = {
        "status": {
            "conditions": [
                {
                    "type": type_,
                    "status": status,
                    "reason": reason,
                    "message": message[:1024],
                    "lastTransitionTime": _now().strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ]
        }
    }
    await request(
        api,
        "PATCH",
        f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status",
        patch,
        content_type="application/strategic-merge-patch+json",
    )


async def request(
    api: ApiClient,
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"],
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    query: Mapping[str, str] | None = None,
) -> Any:
    """One raw API call: JSON in, decoded JSON out, no generated models.

    Raises ``kubernetes_asyncio.client.ApiException`` on a non-2xx answer (``.status``
    holds the code: 409 conflict, 404 gone...).
    """
    response = await api.call_api(
        path,
        method,
        query_params=list((query or {}).items()),
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
    )
    raw = await response.read()
    response.release()
    if not 200 <= response.status <= 299:
        # Without preloading, the client does not check the status: do it here.
        error = ApiException(status=response.status, reason=response.reason)
        error.body = raw.decode(errors="replace")
        raise error
    return json.loads(raw) if raw else None
