"""What a new allocator leader rebuilds its ledger from, and the reservations it keeps.

Durable truth is in Kubernetes (the grant annotations of bound pods) and in the
``tessera-reservations`` KV bucket: a placement decided but not yet confirmed bound is
written there before its decision is published, and deleted once the pod is bound (it
then holds the grant itself) or released. So a restarted allocator rebuilds exactly:
node inventories (KV) + bound pods' grants + open reservations.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import msgspec
import nats.js.errors
from nats.js.kv import KeyValue

from shared import kube
from shared.core import annotations as ann
from shared.core.hosts import pod_spec
from shared.core.ledger import Ledger, PodGrant
from shared.core.model import GangKey, NodeName, PodUID
from shared.core.request import GROUP_NAME

log = logging.getLogger(__name__)


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """A decided placement not yet confirmed bound (the KV record)."""

    grant: PodGrant
    attempt: int
    at: float


_decoder = msgspec.json.Decoder(Reservation)


UNSIGNED = (
    "its tessera.io/grant annotation was not written by Tessera (no valid "
    "tessera.io/grant-signature): Tessera reserves no device for it"
)


def bound_grant(
    pod: dict[str, Any], managed: Collection[str] = (), key: bytes | None = None
) -> tuple[PodGrant, bool] | None:
    """What a pod on a node holds there: its device grant (from its annotations, when
    signed by Tessera; none for another scheduler's pod) and its node-fit spec, and
    whether a grant it carries was refused as forged; None if it is on no node."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return None
    annotations = pod["metadata"].get("annotations") or {}
    grants = ann.read_grants(annotations) or ()
    ref = kube.pod_ref(pod)
    forged = bool(grants) and not ann.signed(
        key, ref.uid, node, grants, annotations.get(ann.SIGNATURE, "")
    )
    group = annotations.get(GROUP_NAME)
    key_of_group = GangKey(namespace=ref.namespace, name=group) if group else None
    grant = PodGrant(
        pod=ref,
        node=NodeName(node),
        containers=() if forged else grants,
        group=key_of_group,
        spec=pod_spec(pod, managed),
    )
    return grant, forged


class Reservations:
    """The open reservations: in memory and in the KV bucket."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.open: dict[PodUID, Reservation] = {}

    async def put(self, grant: PodGrant, attempt: int) -> None:
        r = Reservation(grant=grant, attempt=attempt, at=time.time())
        self.open[grant.pod.uid] = r
        await self.kv.put(grant.pod.uid, msgspec.json.encode(r))

    async def forget(self, uid: PodUID) -> None:
        self.open.pop(uid, None)
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.kv.delete(uid)

    async def load(self, ledger: Ledger, mine: Callable[[NodeName], bool]) -> int:
        """Grant every stored reservation on a node of ``mine`` whose pod is not bound
        yet; forget the rest of those (another shard's are its own)."""
        try:
            keys = await self.kv.keys()
        except nats.js.errors.NoKeysError:
            keys = []
        loaded = 0
        for key in keys:
            try:
                entry = await self.kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue
            if not entry.value:
                continue
            try:
                r = _decoder.decode(entry.value)
            except msgspec.DecodeError as exc:
                log.warning("reservation %s cannot be read (%s): dropped", key, exc)
                await self.forget(PodUID(key))
                continue
            if not mine(r.grant.node):
                continue
            if r.grant.pod.uid in ledger.pods:
                await self.forget(r.grant.pod.uid)  # bound meanwhile
                continue
            ledger.grant(r.grant)
            self.open[r.grant.pod.uid] = r
            loaded += 1
        return loaded


async def rebuild(
    ledger: Ledger,
    api: kube.Client,
    managed: Collection[str],
    key: bytes | None,
    mine: Callable[[NodeName], bool],
    node: str = "",
) -> tuple[int, list[PodGrant]]:
    """Record every pod on a node of ``mine`` (any scheduler's: devices from its grant,
    requests and labels for node fit), or only on ``node``; their count, and the pods
    whose grant was forged."""
    on = f"spec.nodeName={node}" if node else "spec.nodeName!="
    pods, _ = await kube.list_all(
        api,
        "/api/v1/pods",
        {"fieldSelector": f"{on},status.phase!=Succeeded,status.phase!=Failed"},
    )
    bound = 0
    forged = []
    for pod in pods:
        found = bound_grant(pod, managed, key)
        if found is not None and mine(found[0].node):
            grant, refused = found
            ledger.grant(grant)
            bound += 1
            if refused:
                forged.append(grant)
    return bound, forged
