"""What a new allocator leader rebuilds its ledger from, and the reservations it keeps.

Durable truth is in Kubernetes (the grant annotations of bound pods) and in the
``tessera-reservations`` KV bucket: a placement decided but not yet confirmed bound is
written there before its decision is published, and dropped once the pod is bound (it
then holds the grant itself) or released. So a restarted allocator rebuilds exactly:
node inventories (KV) + bound pods' grants + open reservations.

Every grant a rebuild or a load makes goes through a ``Statement`` (shared/core/ledger.py):
a load's all at once, a rebuild's one run between two yields to the event loop (no
handler runs while one is open), so an error midway leaves no half-made step behind.

Writes are group-committed: the reservations and drops that handlers ask for while a
write is on its way go out together as the next write, one KV entry per batch of
reservations (a burst of 32 decisions is one put, not 32). Each caller still returns
only once its own change is stored. A batch's entry is rewritten without the pods
dropped from it, and deleted with its last one; an entry of one reservation keyed by
its pod (an older release's) is read the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection, Coroutine
from typing import Any

import msgspec
import nats.js.errors
from nats.js.kv import KeyValue

from shared import events as ev
from shared import kube
from shared.aio import GroupCommit
from shared.bus import through_failover
from shared.core import annotations as ann
from shared.core.hosts import PodSpec, pod_spec
from shared.core.ledger import Ledger, PodGrant, Statement
from shared.core.model import GangKey, NodeName, PodUID
from shared.core.request import GROUP_NAME

log = logging.getLogger(__name__)


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """A decided placement not yet confirmed bound (the KV record)."""

    grant: PodGrant
    attempt: int
    at: float
    claims: tuple[ev.ClaimAllocation, ...] = ()
    """The ResourceClaims allocated with it (services/device_allocator/dra.py): held again
    after a restart until the binder's write of them is seen."""


_decoder = msgspec.json.Decoder(Reservation)


UNSIGNED = (
    "its tessera.io/grant annotation was not written by Tessera (no valid "
    "tessera.io/grant-signature): Tessera reserves no device for it"
)


YIELD_EVERY = 256
"""Pods recorded between two yields to the event loop: the next page of the list (read
ahead, ``kube.list_pages``) is read from its socket meanwhile, so the API server goes on
writing it; a page recorded without a yield stalled it for the page's whole time."""
_encode = msgspec.json.Encoder().encode
SHAPES = 65536
"""The most pod shapes a rebuild keeps read (see ``Shapes``)."""

Shapes = dict[bytes, PodSpec]
"""Node-fit specs by what ``pod_spec`` reads of a pod but its node: a rebuild reads
each shape once (the pods of one ReplicaSet share theirs)."""


def _spec(
    pod: dict[str, Any], node: str, managed: Collection[str], shapes: Shapes | None
) -> PodSpec:
    """``pod_spec(pod)``, read once per shape when given ``shapes``."""
    if shapes is None:
        return pod_spec(pod, managed)
    meta, spec = pod["metadata"], pod.get("spec") or {}
    shape = _encode(
        (
            meta.get("namespace"),
            meta.get("labels"),
            meta.get("deletionTimestamp"),
            {k: v for k, v in spec.items() if k != "nodeName"},
        )
    )
    host = shapes.get(shape)
    if host is None:
        if len(shapes) >= SHAPES:
            shapes.clear()
        host = shapes[shape] = pod_spec(pod, managed)
    return host if host.node_name == node else msgspec.structs.replace(host, node_name=node)


def bound_grant(
    pod: dict[str, Any],
    managed: Collection[str] = (),
    key: bytes | None = None,
    shapes: Shapes | None = None,
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
        spec=_spec(pod, node, managed, shapes),
    )
    return grant, forged


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """The KV record of reservations written together (``batch-<id>``)."""

    reservations: tuple[Reservation, ...]


_batch_decoder = msgspec.json.Decoder(Batch)

BATCH_PREFIX = "batch-"


def _read(value: bytes) -> tuple[Reservation, ...]:
    """The reservations of one KV entry: a batch, or one reservation (older releases)."""
    try:
        return _batch_decoder.decode(value).reservations
    except msgspec.DecodeError:
        return (_decoder.decode(value),)


ENTRY_BYTES = 256 * 1024
"""An entry's size at most (NATS refuses a message over 1 MiB by default; a reservation
of 8 devices is about 1.7 KB, so 32 gangs of 32 such pods would be too big for one)."""


def _parts(fresh: dict[PodUID, Reservation]) -> list[dict[PodUID, Reservation]]:
    """``fresh`` in entries of at most :data:`ENTRY_BYTES`."""
    parts: list[dict[PodUID, Reservation]] = []
    empty = len(msgspec.json.encode(Batch(reservations=())))
    size = ENTRY_BYTES
    for uid, r in fresh.items():
        one = len(msgspec.json.encode(r)) + 1  # and its comma
        if size + one > ENTRY_BYTES:
            parts.append({})
            size = empty
        parts[-1][uid] = r
        size += one
    return parts


class Reservations:
    """The open reservations: in memory and, group-committed, in the KV bucket."""

    def __init__(self, kv: KeyValue | None = None) -> None:
        self.kv = kv
        """The bucket (``None`` until the allocator opens it at start)."""
        self.open: dict[PodUID, Reservation] = {}
        self.entries: dict[str, dict[PodUID, Reservation]] = {}
        """What each KV entry holds, as last written."""
        self._entry_of: dict[PodUID, str] = {}
        self._commit = GroupCommit(self._store, "reservations:write")
        self.writes = 0
        """KV operations so far (a batch put, a rewrite or a delete: one each)."""

    async def put(
        self, grant: PodGrant, attempt: int, claims: tuple[ev.ClaimAllocation, ...] = ()
    ) -> None:
        """Reserve ``grant`` (with the claims allocated for it); returns once it is stored."""
        r = Reservation(grant=grant, attempt=attempt, at=time.time(), claims=claims)
        self.open[grant.pod.uid] = r
        await self._commit([r])

    async def forget(self, uid: PodUID) -> None:
        """Drop ``uid``'s reservation; returns once that is stored."""
        if self.open.pop(uid, None) is None and uid not in self._entry_of:
            return
        await self._commit([uid])

    async def _store(self, asked: list[Reservation | PodUID]) -> None:
        """One KV write per entry touched: the new batch, and each older entry that
        lost pods (rewritten with those left, or deleted with its last one). What was
        asked is weighed against ``open`` now: a reservation dropped (or made again)
        since it was asked for is not written."""
        fresh = {
            r.grant.pod.uid: r
            for r in asked
            if isinstance(r, Reservation) and self.open.get(r.grant.pod.uid) is r
        }
        drops = {uid for uid in asked if isinstance(uid, str)}
        touched: set[str] = set()
        for uid in drops | fresh.keys():  # a reservation replaced is dropped from its entry
            key = self._entry_of.pop(uid, None)
            if key is not None:
                self.entries[key].pop(uid, None)
                touched.add(key)
        writes: list[Coroutine[Any, Any, Any]] = []
        for part in _parts(fresh):
            key = f"{BATCH_PREFIX}{uuid.uuid4().hex}"
            self.entries[key] = part
            self._entry_of.update(dict.fromkeys(part, key))
            writes.append(self._put_entry(key))
        for key in touched:
            writes.append(self._put_entry(key) if self.entries[key] else self._delete(key))
        self.writes += len(writes)
        await asyncio.gather(*writes)

    @property
    def bucket(self) -> KeyValue:
        """The KV bucket, once opened."""
        assert self.kv is not None, "the allocator opens the bucket at start"
        return self.kv

    async def _put_entry(self, key: str) -> None:
        batch = Batch(reservations=tuple(self.entries[key].values()))
        data = msgspec.json.encode(batch)
        kv = self.bucket
        await through_failover(f"reservation {key}", lambda: kv.put(key, data))

    async def _delete(self, key: str) -> None:
        del self.entries[key]
        kv = self.bucket
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await through_failover(f"reservation {key}", lambda: kv.delete(key))

    async def load(self, ledger: Ledger, mine: Callable[[NodeName], bool]) -> int:
        """Grant every stored reservation on a node of ``mine`` whose pod is not bound
        yet; a pod in two entries (reserved again before the first was rewritten) keeps
        its latest. Each entry is rewritten with only what is still open (a record of a
        pod bound since must not come back once that pod is gone), or deleted when
        nothing is. Another shard's records (a node that moved between shards) are kept
        as they are; an entry with only those is left alone. The grants are made in one
        statement: all of them or, on an error, none."""
        kv = self.bucket
        try:
            keys = await kv.keys()
        except nats.js.errors.NoKeysError:
            keys = []
        latest: dict[PodUID, tuple[str, Reservation]] = {}
        foreign: dict[str, dict[PodUID, Reservation]] = {}
        stored_mine: dict[str, int] = {}
        done: list[str] = []
        for key in keys:
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue
            if not entry.value:
                continue
            try:
                stored = _read(entry.value)
            except msgspec.DecodeError as exc:
                log.warning("reservation %s cannot be read (%s): dropped", key, exc)
                done.append(key)
                continue
            found = [r for r in stored if mine(r.grant.node)]
            if not found:
                continue  # another shard's
            self.entries[key] = {}
            stored_mine[key] = len(found)
            foreign[key] = {r.grant.pod.uid: r for r in stored if not mine(r.grant.node)}
            for r in found:
                held = latest.get(r.grant.pod.uid)
                if held is None or (held[1].attempt, held[1].at) < (r.attempt, r.at):
                    latest[r.grant.pod.uid] = (key, r)
        unbound = {uid: (key, r) for uid, (key, r) in latest.items() if uid not in ledger.pods}
        with Statement(ledger) as st:  # the others were bound meanwhile: the pod holds it
            for _, r in unbound.values():
                st.grant(r.grant)
            st.commit()
        for uid, (key, r) in unbound.items():
            self.open[uid] = r
            self.entries[key][uid] = r
            self._entry_of[uid] = key
        rewrite: list[str] = []
        for key, kept in list(self.entries.items()):
            if not kept and not foreign[key]:
                del self.entries[key]
                done.append(key)
                continue
            self.entries[key] = {**foreign[key], **kept}
            if len(kept) < stored_mine[key]:
                rewrite.append(key)
        for key in rewrite:
            await self._put_entry(key)
        for key in done:
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                await kv.delete(key)
        return len(self.open)


async def rebuild(
    ledger: Ledger,
    api: kube.Client,
    managed: Collection[str],
    key: bytes | None,
    mine: Callable[[NodeName], bool],
    node: str = "",
    shapes: Shapes | None = None,
) -> tuple[int, list[PodGrant]]:
    """Record every pod on a node of ``mine`` (any scheduler's: devices from its grant,
    requests and labels for node fit), or only on ``node``; their count, and the pods
    whose grant was forged. Read a page at a time, each page recorded while the API
    server writes the next, each pod decoded only as far as it is read
    (``kube.list_pages``, ``kube.BoundPod``); each run of ``YIELD_EVERY`` pods is granted
    in one statement (the module docstring)."""
    on = f"spec.nodeName={node}" if node else "spec.nodeName!="
    query = {"fieldSelector": f"{on},status.phase!=Succeeded,status.phase!=Failed"}
    stats = kube.ListStats()
    bound = 0
    forged = []
    granted_s = 0.0
    async for page in kube.list_pages(api, "/api/v1/pods", kube.BoundPod, query, stats=stats):
        for first in range(0, len(page), YIELD_EVERY):
            if first:
                await asyncio.sleep(0)  # the next page is read meanwhile (see YIELD_EVERY)
            began = time.monotonic()
            with Statement(ledger) as st:
                for pod in page[first : first + YIELD_EVERY]:
                    found = bound_grant(pod, managed, key, shapes)
                    if found is not None and mine(found[0].node):
                        grant, refused = found
                        st.grant(grant)
                        bound += 1
                        if refused:
                            forged.append(grant)
                st.commit()
            granted_s += time.monotonic() - began
    if not node:
        log.info("startup phase pod-list: %.2f s (%s)", stats.took_s(), stats)
        log.info(
            "startup phase ledger: %.2f s (%d bound pods granted, between pages)",
            granted_s,
            bound,
        )
    return bound, forged
