"""The API server, as every service talks to it: connecting, binding, telling the user.

kubernetes-asyncio loads the credentials (a kubeconfig, an exec plugin, the pod's
service account with its rotating token); the calls themselves go through ``Client``,
shared/http1.py's pool of keep-alive connections, with JSON in and out and no generated
models. The generated client's request path cost the binder about 3.7 ms of CPU per bind
at 1,000 nodes (py-spy): model sanitising, and, with ``trust_env``, a thread-pool hop per
request to look up proxies and ``.netrc``; aiohttp's own client 0.47 ms per request,
http1's 0.20 ms on uvloop (bench/apiclient.py, bench/RESULTS.md). Hot reads (every
pod, every node) are paged (``list_pages``: each page decoded while the next is read)
and decoded with msgspec into only what is read (``PlacedPod``, ``BoundPod``,
``NodeObject``): at 140,000 pods, a restart's lists (bench/restart.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import gc
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, Generic, Literal, TypedDict, TypeVar

import msgspec
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client import ApiException

from shared.aio import Acting, raise_if_cancelling
from shared.config import KubernetesConfig
from shared.core.model import NodeName, PodRef, PodUID
from shared.http1 import Pool, ProtocolError

REPORTING_COMPONENT = "tessera"
UNREACHABLE: tuple[type[Exception], ...] = (TimeoutError, OSError)
"""An API server out of reach: a request timed out, the connection was refused or
broke, or the answer was cut short (the client's ``ProtocolError`` is an ``OSError``)."""

log = logging.getLogger(__name__)
T = TypeVar("T")


class Client:
    """One API server: its address, credentials and a pool of connections."""

    def __init__(
        self, configuration: client.Configuration, pool: int, agent: str = "tessera"
    ) -> None:
        self.configuration = configuration
        self.agent = agent
        """``User-Agent``: who asks, in the API server's audit log and metrics."""
        self.host = str(configuration.host).rstrip("/")
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
        if not configuration.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        self.pool = Pool(self.host, context, limit=pool, proxy=configuration.proxy or None)
        self.fence: Acting | None = None
        """A leader's ``Lease.acting`` (shared/bus.py): its writes wait while it is down."""

    async def headers(self, content_type: str | None = None) -> dict[str, str]:
        """Accept, User-Agent, Content-Type and the bearer token (re-read when it rotates)."""
        out = {"Accept": "application/json", "User-Agent": self.agent}
        if content_type is not None:
            out["Content-Type"] = content_type
        bearer = (await self.configuration.auth_settings()).get("BearerToken")
        if bearer and bearer.get("value"):
            out["Authorization"] = bearer["value"]
        return out

    async def close(self) -> None:
        """Close the client's connections."""
        await self.pool.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


async def connect(cfg: KubernetesConfig, service: str = "") -> Client:
    """A client from ``cfg.kubeconfig`` (``{service}`` in it replaced by ``service``),
    else ``$KUBECONFIG``, else in-cluster (the pod's own ServiceAccount)."""
    configuration = client.Configuration()
    path = (cfg.kubeconfig or os.environ.get("KUBECONFIG", "")).replace("{service}", service)
    if path:
        await config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # One connection pool sized for the binder's concurrency.
    return Client(
        configuration,
        pool=max(cfg.burst // 4, 16),
        agent=f"tessera-{service}" if service else "tessera",
    )


async def unreachable(api: Client) -> str | None:
    """None when the API server answers ``/version`` (open to every account), else why
    not (a readiness check)."""
    try:
        await request(api, "GET", "/version")
    except ApiException as exc:
        return f"the API server answered {exc.status} {exc.reason}"
    except (OSError, TimeoutError) as exc:
        return f"the API server is unreachable: {exc!r}"
    return None


def pod_ref(obj: Mapping[str, Any]) -> PodRef:
    """The reference to a pod object as the API server returns it."""
    meta = obj["metadata"]
    return PodRef(namespace=meta.get("namespace", ""), name=meta["name"], uid=PodUID(meta["uid"]))


async def bind(
    api: Client,
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
    api: Client,
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


def event_body(
    involved: Mapping[str, str],
    *,
    reason: str,
    message: str,
    kind: Literal["Normal", "Warning"],
    source: str,
    reporter: str,
    instance: str,
) -> dict[str, Any]:
    """A Kubernetes Event about ``involved`` (its ``apiVersion``, ``kind``, ``name``,
    ``namespace`` and ``uid``), from ``source`` (``source.component``) as ``reporter``
    (``reportingComponent``) running as ``instance``; the message cut at 1,024
    characters."""
    now = _now().isoformat()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": involved["namespace"]},
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message[:1024],
        "type": kind,
        "source": {"component": source},
        "reportingComponent": reporter,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def post_event(
    api: Client,
    pod: PodRef,
    *,
    reason: str,
    message: str,
    kind: Literal["Normal", "Warning"] = "Normal",
    component: str = "tessera",
) -> None:
    """Record a Kubernetes Event on the pod (``kubectl describe pod`` shows it)."""
    involved = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod.name,
        "namespace": pod.namespace,
        "uid": pod.uid,
    }
    body = event_body(
        involved,
        reason=reason,
        message=message,
        kind=kind,
        source=component,
        reporter=f"{REPORTING_COMPONENT}/{component}",
        instance=os.environ.get("HOSTNAME", component),
    )
    await request(api, "POST", f"/api/v1/namespaces/{pod.namespace}/events", body)


async def set_pod_condition(api: Client, pod: PodRef, condition: Condition, message: str) -> None:
    """Set one condition in the pod's status (strategic merge keyed by condition type)."""
    patch: dict[str, Any] = {
        "status": {
            "conditions": [
                {
                    "type": condition.type,
                    "status": condition.status,
                    "reason": condition.reason,
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


async def patch_status(api: Client, path: str, status: dict[str, Any]) -> bool:
    """Merge ``status`` into an object's status subresource at ``path`` (``.../status``);
    False (logged) when that cannot be done now, the API server unreachable included,
    and quietly when the object is gone. Status writers run for the service's life: one
    that raised on a restarting API server took its service down."""
    try:
        await request(
            api, "PATCH", path, {"status": status}, content_type="application/merge-patch+json"
        )
    except ApiException as exc:
        if exc.status != 404:
            log.warning("cannot update %s: API error %s", path, exc.status)
        return False
    except UNREACHABLE as exc:
        log.warning("cannot update %s: API server unreachable (%s)", path, exc)
        return False
    return True


class ApiStatus(msgspec.Struct, frozen=True):
    """Why the API server refused a request, as its ``Status`` body says: the HTTP
    ``code``, the ``reason`` (``Conflict``, ``NotFound``, ``Forbidden``...) and the
    ``message`` written for people."""

    code: int = 0
    reason: str = ""
    message: str = ""


_status_decoder = msgspec.json.Decoder(ApiStatus)


def refusal(exc: ApiException) -> ApiStatus:
    """The ``Status`` of a refused request (``request`` keeps the body); where the body
    is not one (a proxy's page, an answer cut short), the HTTP code and phrase."""
    code, phrase = int(exc.status or 0), str(exc.reason or "")
    body = exc.body
    if isinstance(body, str):
        body = body.encode()
    try:
        said = _status_decoder.decode(body) if isinstance(body, bytes) and body else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        said = None
    if said is None:
        return ApiStatus(code=code, reason=phrase, message=phrase)
    return ApiStatus(
        code=said.code or code, reason=said.reason or phrase, message=said.message or phrase
    )


class Condition(msgspec.Struct, frozen=True):
    """A pod condition to set beside an Event: type, status, reason (the message is the
    Event's)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str


async def tell(
    api: Client,
    pod: PodRef,
    *,
    reason: str,
    message: str,
    kind: Literal["Normal", "Warning"],
    component: str,
    condition: Condition | None = None,
) -> None:
    """What people read about a pod: an Event (``kubectl describe``) and, if given, a
    condition with the same message. A pod gone meanwhile needs no message; another API
    error, or an API server out of reach, is logged, never raised (telling must not stop
    scheduling)."""
    try:
        await post_event(api, pod, reason=reason, message=message, kind=kind, component=component)
        if condition is not None:
            await set_pod_condition(api, pod, condition, message)
    except ApiException as exc:
        if exc.status != 404:
            log.warning("cannot tell %s (%s): API error %s", pod, reason, exc.status)
    except UNREACHABLE as exc:
        log.warning("cannot tell %s (%s): API server unreachable: %s", pod, reason, exc)


async def request(
    api: Client,
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
    return msgspec.json.decode(raw) if raw else None


# --- list + watch ------------------------------------------------------------------------


class WatchEvent(msgspec.Struct):
    """One line of a watch stream; ``object`` stays a plain dict (decoded by msgspec)."""

    type: str
    object: dict[str, Any]


class _ObjectList(msgspec.Struct):
    items: list[dict[str, Any]]
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


_watch_decoder = msgspec.json.Decoder(WatchEvent)
_encoder = msgspec.json.Encoder()
REQUEST_TIMEOUT_S = 60.0
"""A write or a list page; the API server's own limit is 60 s."""
_list_decoder = msgspec.json.Decoder(_ObjectList)

EventHandler = Callable[[str, dict[str, Any]], Awaitable[None]]
RelistHandler = Callable[[list[dict[str, Any]]], Awaitable[None]]


class GoneError(Exception):
    """The watch's resourceVersion is too old (HTTP 410): list again."""


async def list_all(
    api: Client, path: str, query: Mapping[str, str] | None = None, page: int = 500
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


# --- paged lists: each page decoded, into only what is read, while the next is read -----


class ListMeta(msgspec.Struct):
    """A list's own metadata: its resourceVersion and where the next page starts."""

    resourceVersion: str = ""  # noqa: N815 (the API's names)
    next: str = msgspec.field(default="", name="continue")


class _Head(msgspec.Struct):
    """A page read for its metadata only (its items are skipped, not built)."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)


class Page(msgspec.Struct, Generic[T]):
    """One page of a list: its items, decoded as ``T``, and where the next page starts."""

    items: list[T]
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)


_head_decoder = msgspec.json.Decoder(_Head)


@functools.cache
def _page_decoder(item: Any) -> msgspec.json.Decoder[Page[Any]]:
    return msgspec.json.Decoder(Page[item])


class ObjectMeta(TypedDict, total=False):
    """What the services read of an object's metadata (not ``managedFields``, a third
    of a pod's JSON)."""

    name: str
    namespace: str
    uid: str
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[dict[str, Any]]


class PlacedContainer(TypedDict, total=False):
    """What node fit reads of a container (shared/core/hosts.py ``pod_spec``)."""

    name: str
    resources: dict[str, Any]
    ports: list[dict[str, Any]]
    restartPolicy: str


class PlacedSpec(TypedDict, total=False):
    """What is read of the spec of a pod on a node: its node, its scheduler, and what
    node fit counts there (``pod_spec``)."""

    nodeName: str
    schedulerName: str
    containers: list[PlacedContainer]
    initContainers: list[PlacedContainer]
    resources: dict[str, Any]
    overhead: dict[str, Any]
    affinity: dict[str, Any]
    nodeSelector: dict[str, str]
    tolerations: list[dict[str, Any]]
    topologySpreadConstraints: list[dict[str, Any]]
    hostNetwork: bool


class PlacedStatus(TypedDict, total=False):
    """A pod's phase, and its conditions by type and status (a disruption budget counts
    the Ready ones)."""

    phase: str
    conditions: list[dict[str, Any]]


class PlacedPod(TypedDict, total=False):
    """A pod on a node as the watcher reads it (``read_pod``): decoded into these plain
    dicts, the rest of the object (``managedFields``, the containers' commands,
    environment and mounts, the volumes, the container statuses) is skipped, not
    built: 7 times faster than decoding all of it (6 KB pods, bench/RESULTS.md). A pod
    not on a node is read whole (its request, claims and gates are parsed from it)."""

    metadata: ObjectMeta
    spec: PlacedSpec
    status: PlacedStatus


class BoundMeta(TypedDict, total=False):
    """What the allocator's rebuild reads of a bound pod's metadata."""

    name: str
    namespace: str
    uid: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]


class BoundPod(TypedDict, total=False):
    """A pod on a node as the allocator's rebuild reads it (its grant annotations and
    ``pod_spec``): less than :class:`PlacedPod` (no status, no owners), 12 times faster
    than decoding all of it."""

    metadata: BoundMeta
    spec: PlacedSpec


class NodeStatus(TypedDict, total=False):
    """What is read of a Node's status: its resources and the images it holds."""

    allocatable: dict[str, Any]
    capacity: dict[str, Any]
    images: list[dict[str, Any]]


class NodeObject(TypedDict, total=False):
    """What is read of a Node (shared/core/hosts.py ``node_spec``, its cordons): not its
    conditions, addresses or ``managedFields``."""

    metadata: ObjectMeta
    spec: dict[str, Any]
    status: NodeStatus


_placed_decoder = msgspec.json.Decoder(PlacedPod)


def read_pod(raw: msgspec.Raw | bytes) -> dict[str, Any]:
    """One pod of a list read as ``msgspec.Raw``: as a :class:`PlacedPod` when it is on a
    node, else whole; whole too when it does not fit that shape (never expected of the
    API server: a field of another type than its schema's)."""
    try:
        placed = _placed_decoder.decode(raw)
    except msgspec.ValidationError:
        return msgspec.json.decode(raw)  # type: ignore[no-any-return]
    if placed.get("spec", {}).get("nodeName"):
        return placed  # type: ignore[return-value]
    return msgspec.json.decode(raw)  # type: ignore[no-any-return]


LIST_PAGE = 5000
"""Objects per page of ``list_pages``. The API server answers each page of a list
(1.36, from its watch cache) in some 20 ms beside writing its objects: 140,000 pods
(856 MB) took it 14-17 s in pages of 500, 9-12 s in pages of 2,000 to 5,000, 9-11 s
whole (2 cores, bench/RESULTS.md)."""


@dataclasses.dataclass
class ListStats:
    """What a paged list took: pages, objects, bytes, the time spent waiting for a page
    that had not arrived yet, and the time spent decoding (overlapped with reading the
    next page)."""

    pages: int = 0
    objects: int = 0
    size: int = 0
    wait_s: float = 0.0
    decode_s: float = 0.0
    resource_version: str = ""
    started: float = dataclasses.field(default_factory=time.monotonic)

    def took_s(self) -> float:
        """Seconds since the list started."""
        return time.monotonic() - self.started

    def __str__(self) -> str:
        return (
            f"{self.objects} objects, {self.size / 1e6:.0f} MB in {self.pages} pages; "
            f"waiting on the API server {self.wait_s:.2f} s, decoding {self.decode_s:.2f} s"
        )


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """A large read (the allocator's rebuild, the watcher's list of every pod): Python's
    cyclic garbage collector is paused while what it builds piles up, then what was
    built is frozen out of its way (``gc.freeze``: long-lived state no later collection
    walks again). At 140,000 pods the collector walked every object built so far about
    twenty times: four fifths of the allocator's rebuild (bench/RESULTS.md). JSON
    decodes to objects without cycles, freed as ever when dropped."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


async def list_pages(
    api: Client,
    path: str,
    item: Any,
    query: Mapping[str, str] | None = None,
    *,
    page: int = LIST_PAGE,
    stats: ListStats | None = None,
) -> AsyncIterator[list[Any]]:
    """Every object at ``path``, a page at a time, each decoded as a list of ``item``
    (a msgspec-decodable type: a TypedDict naming only what is read, ``msgspec.Raw`` to
    decode each object later, ``dict[str, Any]`` for all of it; a page whose objects do
    not fit ``item``, never expected of the API server, is read whole).
    The next page is asked for before this one is decoded and handed over, so the API
    server writes it meanwhile. ``stats`` (read it once the iteration ends) gets the
    list's resourceVersion, to watch from."""
    stats = stats if stats is not None else ListStats()
    decoder = _page_decoder(item)
    params = dict(query or {})
    params["limit"] = str(page)
    fetch: asyncio.Future[bytes] | None = asyncio.ensure_future(
        _raw(api, "GET", path, dict(params))
    )
    try:
        while fetch is not None:
            waited = time.monotonic()
            raw = await fetch
            began = time.monotonic()
            head = _head_decoder.decode(raw).metadata
            fetch = None
            if head.next:
                params["continue"] = head.next
                fetch = asyncio.ensure_future(_raw(api, "GET", path, dict(params)))
                await asyncio.sleep(0)  # the request written before this page is decoded
            try:
                items = decoder.decode(raw).items
            except msgspec.ValidationError as exc:  # never expected of the API server
                log.warning("a page of %s read whole: %s", path, exc)
                items = _page_decoder(dict[str, Any]).decode(raw).items
            stats.wait_s += began - waited
            stats.decode_s += time.monotonic() - began
            stats.pages += 1
            stats.objects += len(items)
            stats.size += len(raw)
            stats.resource_version = head.resourceVersion
            del raw
            yield items
    finally:
        if fetch is not None:  # the caller stopped early: the page asked for is not read
            fetch.cancel()


async def _raw(
    api: Client,
    method: str,
    path: str,
    query: Mapping[str, str],
    body: Any = None,
    content_type: str = "application/json",
) -> bytes:
    """The one place a (non-watch) API call is made and its status checked; a write
    waits while the client's fence is down."""
    if api.fence is not None and method != "GET":
        await api.fence.wait()
    response = await api.pool.request(
        method,
        api.pool.target(path, query),
        await api.headers(content_type if body is not None else None),
        None if body is None else _encoder.encode(body),
        timeout_s=REQUEST_TIMEOUT_S,
    )
    if response.status == 410:
        raise GoneError(path)
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = response.body
        raise error
    return response.body


MAX_EVENT_BYTES = 64 * 2**20
"""The longest watch event read (the API server stores objects up to about 1.5 MiB and
accepts requests up to 3 MiB; a watch event is one object with a little framing)."""
ROUTINE_WAITS = 3
"""How many 429 answers in a row a watch logs at INFO before it warns (see ``list_watch``)."""


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The non-empty lines of a watch stream, however long (aiohttp's own line reader
    stopped at 512 KiB: one pod with a large env var stopped every watch)."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.strip():
                yield line
        if len(buffer) > MAX_EVENT_BYTES:
            raise ProtocolError(f"a watch event over {MAX_EVENT_BYTES} bytes")
    if buffer.strip():
        yield bytes(buffer)


async def list_watch(
    api: Client,
    path: str,
    on_event: EventHandler,
    *,
    on_relist: RelistHandler | None = None,
    relist: Callable[[], Awaitable[str]] | None = None,
    query: Mapping[str, str] | None = None,
    timeout_s: int = 300,
    max_backoff_s: float = 30.0,
    since: str = "",
    until: asyncio.Event | None = None,
) -> None:
    """List then watch ``path`` forever, like an informer.

    ``on_relist`` gets the full list first (and after every relist, so the caller can
    drop objects that vanished while it was not watching); ``on_event`` gets each ADDED,
    MODIFIED or DELETED object. Or ``relist`` lists by itself (a page at a time:
    ``list_pages``) and returns the list's resourceVersion. The watch resumes from the
    last resourceVersion seen (bookmarks included); a 410 Gone relists; errors reconnect
    with exponential backoff. Handler exceptions propagate: the caller's task dies and
    its service restarts. ``since``: watch from this resourceVersion first (the caller
    has read what came before), listing only on a 410. ``until``: return once it is set,
    between two events (or as a watch of ``timeout_s`` ends).
    """
    if (on_relist is None) == (relist is None):
        raise TypeError("list_watch takes one of on_relist and relist")
    backoff = 0.2
    waits = 0  # 429 answers in a row
    version = since
    while until is None or not until.is_set():
        try:
            if relist is not None and not version:
                version = await relist()
            elif on_relist is not None and not version:
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
            async with api.pool.stream(
                "GET", api.pool.target(path, params), await api.headers(), timeout_s + 30
            ) as response:
                if response.status == 410:
                    raise GoneError(path)
                if response.status != 200:
                    raise ApiException(status=response.status, reason=response.reason)
                waits = 0
                async for line in _lines(response.chunks()):
                    try:
                        event = _watch_decoder.decode(line)
                    except msgspec.DecodeError as exc:  # a broken line: this one is lost
                        log.error("watch of %s: unreadable event skipped: %s", path, exc)
                        continue
                    obj = event.object
                    if event.type == "ERROR":
                        if obj.get("code") == 410:
                            raise GoneError(path)
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    if event.type != "BOOKMARK":
                        await on_event(event.type, obj)
                    # only once handled: a watch that breaks meanwhile resumes before it
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if until is not None and until.is_set():
                        break

            backoff = 0.2
        except GoneError:
            log.info("watch of %s expired (410 Gone); listing again", path)
            version = ""
        except (TimeoutError, ApiException, OSError) as exc:
            raise_if_cancelling()
            # 429: the API server asks to come back later (a resource's watch cache still
            # filling, e.g. a CRD just made; its priority and fairness limits): a few in a
            # row are routine on a healthy cluster, a run of them is not.
            waits = waits + 1 if isinstance(exc, ApiException) and exc.status == 429 else 0
            log.log(
                logging.INFO if 0 < waits <= ROUTINE_WAITS else logging.WARNING,
                "watch of %s failed (%s); retrying in %.1fs",
                path,
                exc,
                backoff,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff_s)
