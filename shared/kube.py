"""kubernetes-asyncio helpers every service shares: connecting, binding, telling the user.

Hot paths (watching every pod, listing every node) read raw JSON and decode it with
msgspec into small Structs (see the watcher); the generated models are kept for the
rare writes here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import aiohttp
import msgspec
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiClient, ApiException

from shared.aio import raise_if_cancelling
from shared.config import KubernetesConfig
from shared.core.model import NodeName, PodRef

REPORTING_COMPONENT = "tessera"

log = logging.getLogger(__name__)


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


def now_rfc3339() -> str:
    """The time as Kubernetes writes it (seconds, Z)."""
    return _now().strftime("%Y-%m-%dT%H:%M:%SZ")


async def delete_pod(
    api: ApiClient,
    namespace: str,
    name: str,
    *,
    uid: str | None = None,
    grace_s: int | None = None,
) -> bool:
    """Delete a pod (only this ``uid``, never a namesake, when given) with its own grace
    period or ``grace_s``; False if it was already gone or is a namesake."""
    options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if uid is not None:
        options["preconditions"] = {"uid": uid}
    if grace_s is not None:
        options["gracePeriodSeconds"] = grace_s
    try:
        await request(api, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", options)
    except ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


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
                    "lastTransitionTime": now_rfc3339(),
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
    raw = await _raw(api, method, path, query or {}, body, content_type)
    return json.loads(raw) if raw else None


# --- list + watch ------------------------------------------------------------------------


class WatchEvent(msgspec.Struct):
    """One line of a watch stream; ``object`` stays a plain dict (decoded by msgspec)."""

    type: str
    object: dict[str, Any]


class _ObjectList(msgspec.Struct):
    items: list[dict[str, Any]]
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


_watch_decoder = msgspec.json.Decoder(WatchEvent)
_list_decoder = msgspec.json.Decoder(_ObjectList)

EventHandler = Callable[[str, dict[str, Any]], Awaitable[None]]
RelistHandler = Callable[[list[dict[str, Any]]], Awaitable[None]]


class GoneError(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


async def list_all(
    api: ApiClient, path: str, query: Mapping[str, str] | None = None, page: int = 500
) -> tuple[list[dict[str, Any]], str]:
    """Every object at ``path`` (paged) and the list's resourceVersion."""
    items: list[dict[str, Any]] = []
    params = dict(query or {})
    params["limit"] = str(page)
    while True:
        raw = await _raw(api, "GET", path, params)
        decoded = _list_decoder.decode(raw)
        items.extend(decoded.items)
        cont = decoded.metadata.get("continue")
        if not cont:
            return items, str(decoded.metadata.get("resourceVersion", ""))
        params["continue"] = cont


async def _raw(
    api: ApiClient,
    method: str,
    path: str,
    query: Mapping[str, str],
    body: Any = None,
    content_type: str = "application/json",
) -> bytes:
    """The one place an API call is made and its status checked (the client does not
    check it when the response is not preloaded)."""
    response = await api.call_api(
        path,
        method,
        query_params=list(query.items()),
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
    )
    raw: bytes = await response.read()
    response.release()
    if response.status == 410:
        raise GoneError(path)
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = raw
        raise error
    return raw


async def list_watch(
    api: ApiClient,
    path: str,
    on_event: EventHandler,
    *,
    on_relist: RelistHandler,
    query: Mapping[str, str] | None = None,
    timeout_s: int = 300,
    max_backoff_s: float = 30.0,
) -> None:
    """List then watch ``path`` forever, like an informer.

    ``on_relist`` gets the full list first (and after every relist, so the caller can
    drop objects that vanished while it was not watching); ``on_event`` gets each ADDED,
    MODIFIED or DELETED object. The watch resumes from the last resourceVersion seen
    (bookmarks included); a 410 Gone relists; errors reconnect with exponential backoff.
    Handler exceptions propagate: the caller's task dies and its service restarts.
    """
    backoff = 0.2
    version = ""
    while True:
        try:
            if not version:
                items, version = await list_all(api, path, query)
                await on_relist(items)
            params = dict(query or {})
            params.update(
                {
                    "watch": "1",
                    "allowWatchBookmarks": "true",
                    "resourceVersion": version,
                    "timeoutSeconds": str(timeout_s),
                }
            )
            response = await api.call_api(
                path,
                "GET",
                query_params=list(params.items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=timeout_s + 30,
            )
            try:
                if response.status == 410:
                    raise GoneError(path)
                if response.status != 200:
                    raise ApiException(status=response.status, reason=response.reason)
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = _watch_decoder.decode(line)
                    obj = event.object
                    if event.type == "ERROR":
                        if obj.get("code") == 410:
                            raise GoneError(path)
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event.type != "BOOKMARK":
                        await on_event(event.type, obj)
            finally:
                response.release()
            backoff = 0.2
        except GoneError:
            log.info("watch of %s expired (410 Gone); listing again", path)
            version = ""
        except (TimeoutError, ApiException, aiohttp.ClientError, OSError) as exc:
            raise_if_cancelling()
            log.warning("watch of %s failed (%s); retrying in %.1fs", path, exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff_s)
