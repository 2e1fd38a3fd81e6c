"""The objects Tessera's pending pods claim, read for their node-fit verdict.

A pending pod of ours that names PersistentVolumeClaims (``persistentVolumeClaim`` or
generic ``ephemeral`` volumes) or DRA ResourceClaims (``spec.resourceClaims``) is
announced with ``PodSpec.claims``: what its volumes and claims allow, decided by
shared/core/claims.py. The objects are listed and watched only from the first such pod
(PersistentVolumeClaims, PersistentVolumes and StorageClasses for the first with such a
volume, ResourceClaims for the first with a resource claim) and kept as the few fields
the verdict reads. Until they are listed the pod is held, not announced. A change to an
object a pending pod's verdict read announces the pod again with its new verdict (the
coordinator tries a pod again when its spec changes: services/gang_coordinator).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiException

from shared import events as ev
from shared import kube
from shared.core import claims as core
from shared.core.dra import extended
from shared.core.hosts import Claims
from shared.core.model import PodUID

log = logging.getLogger(__name__)

Announce = Callable[[ev.PodPending], Coroutine[Any, Any, None]]
Publish = Callable[[ev.Event], Coroutine[Any, Any, None]]
Spawn = Callable[..., object]
"""``Runtime.spawn``: ``spawn(coroutine, name, finite=True)``."""


@dataclass
class _Kind:
    """One kind of object: its records by key, and whether it is listed yet."""

    path: str
    record: Callable[[dict[str, Any]], core.Record]
    namespaced: bool = False
    group: str = ""
    """An API group version to find served first (its objects exist only then)."""
    records: dict[str, core.Record] = field(default_factory=dict)
    started: bool = False
    listed: bool = False

    def key(self, obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        name = str(meta["name"])
        return f"{meta.get('namespace', '')}/{name}" if self.namespaced else name


RESOURCE = "/apis/resource.k8s.io/v1"


def _kinds() -> dict[str, _Kind]:
    return {
        "pvc": _Kind("/api/v1/persistentvolumeclaims", core.pvc_record, namespaced=True),
        "pv": _Kind("/api/v1/persistentvolumes", core.pv_record),
        "class": _Kind("/apis/storage.k8s.io/v1/storageclasses", core.class_record),
        "claim": _Kind(
            f"{RESOURCE}/resourceclaims", core.claim_record, namespaced=True, group=RESOURCE
        ),
        "dclass": _Kind(f"{RESOURCE}/deviceclasses", core.device_class, group=RESOURCE),
        "slice": _Kind(f"{RESOURCE}/resourceslices", core.api_object, group=RESOURCE),
    }


def _allocated(obj: dict[str, Any]) -> dict[str, Any] | None:
    """What the allocator reads of a claim: its identity, ``status.allocation`` and the
    UIDs in ``status.reservedFor`` (preemption frees a claim reserved for its victim
    alone: services/device_allocator/dra.py)."""
    status = obj.get("status") or {}
    allocation = status.get("allocation")
    if not allocation:
        return None
    meta = obj["metadata"]
    identity = {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
    if (meta.get("annotations") or {}).get(extended.ANNOTATION) == "true":
        # made for a pod's extended resources: the allocator matches it to its pod
        identity["annotations"] = {extended.ANNOTATION: "true"}
        identity["ownerReferences"] = meta.get("ownerReferences") or []
    consumers = [{"uid": r["uid"]} for r in status.get("reservedFor") or () if r.get("uid")]
    return {"metadata": identity, "status": {"allocation": allocation, "reservedFor": consumers}}


class ClaimReader:
    """Owns the claimed objects the watcher reads and each pending pod's verdict on
    them; announces a pod again (through ``announce``, into ``pending``, the watcher's
    own) when an object its verdict read changes."""

    def __init__(
        self,
        api: kube.Client | None,
        spawn: Spawn,
        pending: dict[PodUID, ev.PodPending],
        announce: Announce,
        publish: Publish,
    ) -> None:
        self.api = api
        self.spawn = spawn
        self.pending = pending
        self.announce = announce
        self.publish = publish
        """Sends the allocator the slices and claim allocations (``dra.object``)."""
        self.forwarded: dict[tuple[str, str], dict[str, Any] | None] = {}
        """What was sent of each slice and claim (its allocation), to send changes only."""
        self.kinds = _kinds()
        self.uses: dict[PodUID, core.Uses] = {}
        """What each pod of ours not bound yet claims (pods without claims: absent)."""
        self.held: dict[PodUID, ev.PodPending] = {}
        """Pods whose objects are not listed yet: announced once they are."""
        self.reads: dict[PodUID, frozenset[core.Key]] = {}
        self.readers: dict[core.Key, set[PodUID]] = {}
        """Which pods' verdicts read each object."""
        self.mapping: dict[str, str] | None = None
        """Extended resource names the DeviceClasses map (None: to be computed again)."""

    def attach(self, pending: ev.PodPending, obj: dict[str, Any]) -> ev.PodPending | None:
        """``pending`` with its claims' verdict in its spec; itself if the pod claims
        nothing; None while the objects it claims are not listed yet (it is announced
        once they are)."""
        uid = pending.pod.uid
        uses = core.pod_uses(obj)
        if uses is None:
            self.forget(uid)
            return pending
        self.uses[uid] = uses
        for kind in uses.kinds:
            self._start(kind)
        if not all(self.kinds[k].listed for k in uses.kinds):
            self.held[uid] = pending
            return None
        self.held.pop(uid, None)
        return self._verdict(uid, pending)

    def forget(self, uid: PodUID) -> None:
        """The pod is bound or gone: its verdict no longer matters."""
        self.uses.pop(uid, None)
        self.held.pop(uid, None)
        self._index(uid, frozenset())

    def _verdict(self, uid: PodUID, pending: ev.PodPending) -> ev.PodPending:
        uses = self.uses[uid]
        plain = pending.spec.requests if pending.spec is not None else ()
        found: Claims | None
        found, reads = core.claims_of(uses, self._lookup, self._mapping(), plain)
        self._index(uid, reads)
        if not uses.volumes and not uses.claims and found == Claims():
            found = None  # extended resources no DeviceClass maps: nothing claimed
        if pending.spec is None or pending.spec.claims == found:
            return pending
        spec = msgspec.structs.replace(pending.spec, claims=found)
        return msgspec.structs.replace(pending, spec=spec)

    def _mapping(self) -> dict[str, str]:
        """Extended resource name → DeviceClass, from every DeviceClass listed."""
        if self.mapping is None:
            records = self.kinds["dclass"].records.values()
            self.mapping = extended.class_mapping(
                r.obj for r in records if isinstance(r, core.ApiObject)
            )
        return self.mapping

    def _lookup(self, key: core.Key) -> core.Record | None:
        return self.kinds[key[0]].records.get(key[1])

    def _index(self, uid: PodUID, reads: frozenset[core.Key]) -> None:
        was = self.reads.pop(uid, frozenset())
        for key in was - reads:
            readers = self.readers[key]
            readers.discard(uid)
            if not readers:
                del self.readers[key]
        for key in reads - was:
            self.readers.setdefault(key, set()).add(uid)
        if reads:
            self.reads[uid] = reads

    # --- the objects ----------------------------------------------------------------

    def _start(self, name: str) -> None:
        kind = self.kinds[name]
        if kind.started:
            return
        kind.started = True
        if self.api is None:  # no API server to read: none of these objects exists
            kind.listed = True
            return
        # finite: it ends when the API group is not served; its failure still stops us
        self.spawn(self._watch(name, kind), f"watch-{name}s", finite=True)
        log.info("watching %s: a pending pod claims them", kind.path)

    async def _watch(self, name: str, kind: _Kind) -> None:
        assert self.api is not None
        if kind.group:
            try:
                await kube.request(self.api, "GET", kind.group)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                log.warning("%s is not served: no claim of a pod exists", kind.group)
                await self.on_relist(name, [])
                return
        await kube.list_watch(
            self.api,
            kind.path,
            lambda kind_, obj: self.on_event(name, kind_, obj),
            on_relist=lambda items: self.on_relist(name, items),
        )

    async def on_event(self, name: str, kind: str, obj: dict[str, Any]) -> None:
        """One object changed: the pods whose verdict read it are judged again."""
        objects = self.kinds[name]
        try:
            key = objects.key(obj)
            record = None if kind == "DELETED" else objects.record(obj)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("%s object cannot be read (%r); skipped until it changes", name, exc)
            return
        await self._forward(name, key, None if kind == "DELETED" else obj)
        if objects.records.get(key) == record:
            return
        if record is None:
            del objects.records[key]
        else:
            objects.records[key] = record
        readers = set(self.readers.get((name, key), ()))
        if name == "dclass":
            self.mapping = None
            readers |= self.readers.get(core.EVERY_CLASS, set())
        await self._again(readers)

    async def on_relist(self, name: str, items: list[dict[str, Any]]) -> None:
        """Every object of a kind (first, or after the watch lost track): every pod
        that claims any is judged again, and those held for this list announced."""
        objects = self.kinds[name]
        if name in ("slice", "claim"):
            keys = set()
            for obj in items:
                try:
                    keys.add(key := objects.key(obj))
                except (KeyError, TypeError):
                    continue  # logged below, as every unreadable object is
                await self._forward(name, key, obj)
            for kind, key in [k for k in self.forwarded if k[0] == name and k[1] not in keys]:
                await self._forward(kind, key, None)
        objects.records.clear()
        for obj in items:
            try:
                objects.records[objects.key(obj)] = objects.record(obj)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.warning("%s object cannot be read (%r); skipped until it changes", name, exc)
        objects.listed = True
        if name == "dclass":
            self.mapping = None
        await self._again([uid for uid, uses in self.uses.items() if name in uses.kinds])

    async def _forward(self, name: str, key: str, obj: dict[str, Any] | None) -> None:
        """A slice or a claim's allocation to the allocator, when it changed."""
        if name == "slice":
            sent = None if obj is None else core.api_object(obj).obj
        elif name == "claim":
            sent = None if obj is None else _allocated(obj)
        else:
            return
        if (name, key) not in self.forwarded and sent is None:
            return
        if self.forwarded.get((name, key)) == sent and (name, key) in self.forwarded:
            return
        if sent is None:
            self.forwarded.pop((name, key), None)
        else:
            self.forwarded[(name, key)] = sent
        await self.publish(ev.DraObject(kind=name, key=key, obj=sent))  # type: ignore[arg-type]

    async def _again(self, uids: Iterable[PodUID]) -> None:
        for uid in list(uids):
            held = self.held.get(uid)
            if held is not None:
                uses = self.uses[uid]
                if all(self.kinds[k].listed for k in uses.kinds):
                    del self.held[uid]
                    await self._announce(self._verdict(uid, held))
                continue
            pending = self.pending.get(uid)
            if pending is None or uid not in self.uses:
                continue  # bound or gone meanwhile
            fresh = self._verdict(uid, pending)
            if fresh is not pending:
                await self._announce(fresh)

    async def _announce(self, pending: ev.PodPending) -> None:
        fresh = msgspec.structs.replace(pending, event_id=ev.new_id(), emitted_at=time.time())
        self.pending[pending.pod.uid] = fresh
        await self.announce(fresh)
