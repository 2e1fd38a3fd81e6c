"""DRA in the allocator: a pod's unallocated ResourceClaims allocated where it is placed.

The watcher sends the cluster's ResourceSlices and the allocations of ResourceClaims
(``dra.object``); a pending pod carries its claims not allocated yet and the
DeviceClasses they name (``Claims.allocate``, shared/core/claims.py). :class:`Dra` is
the core's :class:`~shared.core.plugins.dynamic_resources.ClaimSource`: each node's pools
(indexed per node, :class:`Slices`) and what is in use. The core's gang search decides
the claims (the DynamicResources filter, shared/core/plugins/dynamic_resources.py): a
member is allocated per node beside what is in use and what the members placed before
it in the same attempt took, and a placed member takes its allocation inside the gang's
Statement (given back if the gang is not placed). So members spread over nodes when one
node cannot serve them all, and a gang with ``minMember`` below its size is placed
without a member whose claims fit nowhere. Once the gang is placed, :meth:`Dra.assume`
holds what its members took. A member's claims allocated already but not reserved for
it (``Claims.reserve``) ride along as ``reserve_only``: the binder only adds the pod to
their ``reservedFor``.

One claim's states here (the ledger's own for grants: services/device_allocator/service.py)::

    unallocated --taken by the gang search (Claimed.take), the gang placed: assume-->
        assumed (this pod's, until the binder's write is seen)
        assumed --the watcher sends it allocated--> observed (read.in_use)
        assumed --release (bind failed or timed out, pod deleted)--> gone
        observed --deallocated or deleted--> gone

What is in use is the observed allocations (anyone's: Tessera's binder or another
scheduler) and the assumed ones not observed yet, summed by ``read.in_use``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared import events as ev
from shared.core.dra import InUse, Pool, extended, read
from shared.core.dra.model import Tally
from shared.core.ledger import PodGrant
from shared.core.model import NodeName, PodUID
from shared.core.nodefit import Hosts
from shared.core.plugins.dynamic_resources import NAME, Claimed

log = logging.getLogger(__name__)

PLUGIN = NAME
MAX_STEPS = 5_000
"""The search steps ``allocate`` may take on one node. A claim that fits is found in a
few steps per device requested (8 devices matched on one attribute among 24: 0.2 ms);
only a claim that does not fit makes the search backtrack through combinations (9 such
devices among 24: unbounded, seconds). A step costs about 13 µs here (measured
2026-11-26 on this machine, 2 shared cores: 5,000 steps 65 ms, 20,000 240 ms), so 5,000
keeps one pathological claim from holding the allocator's single ledger loop for more
than tens of milliseconds per node, while claims of up to a dozen devices are decided
far within it. Spent, the node is refused with the core's error (``timed out trying to
allocate devices``), where kube-scheduler's filter timeout stops the attempt."""


def _readable(kind: str, obj: Mapping[str, Any]) -> bool:
    """The core reads it without raising (shared/core/dra/read.py)."""
    try:
        if kind == "slice":
            node = str((obj.get("spec") or {}).get("nodeName") or "")
            read.node_pools([obj], node)
        else:
            read.in_use([obj])
    except (ValueError, TypeError, KeyError, AttributeError):
        return False
    return True


def _extended_owner(obj: Mapping[str, Any]) -> PodUID | None:
    """The pod a claim made for extended resources belongs to (None: not one)."""
    meta = obj.get("metadata") or {}
    if (meta.get("annotations") or {}).get(extended.ANNOTATION) != "true":
        return None
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "Pod":
            return PodUID(str(ref.get("uid", "")))
    return None


PoolKey = tuple[str, str]


def _key(claim: ev.ClaimAllocation) -> str:
    """The claim's key among the observed (``namespace/name``)."""
    return f"{claim.namespace}/{claim.name}"


class Slices:
    """The cluster's ResourceSlices, indexed so that a node reads only its own pools'
    (one scan of every slice per node made the first pod after a slice change cost 1 s
    at 1,000 nodes here) and a slice change forgets only its nodes' pools."""

    def __init__(self) -> None:
        self.by_name: dict[str, dict[str, Any]] = {}
        self.pools: dict[PoolKey, dict[str, dict[str, Any]]] = {}
        self.named: dict[str, dict[PoolKey, int]] = {}
        """Per node, the pools with slices naming it (``nodeName``): how many."""
        self.everywhere: dict[PoolKey, int] = {}
        """Pools with slices for every node or a selection (``allNodes``, a node selector,
        per-device selection, shared counters): how many."""

    @staticmethod
    def _where(obj: Mapping[str, Any]) -> tuple[PoolKey, str]:
        spec = obj.get("spec") or {}
        pool = spec.get("pool") or {}
        return (str(spec.get("driver", "")), str(pool.get("name", ""))), str(
            spec.get("nodeName") or ""
        )

    def _count(self, obj: Mapping[str, Any], name: str, sign: int) -> str | None:
        key, node = self._where(obj)
        counts = self.named.setdefault(node, {}) if node else self.everywhere
        counts[key] = counts.get(key, 0) + sign
        if not counts[key]:
            del counts[key]
        if node and not counts:
            del self.named[node]
        members = self.pools.setdefault(key, {})
        if sign > 0:
            members[name] = dict(obj)
        else:
            members.pop(name, None)
            if not members:
                del self.pools[key]
        return node or None

    def put(self, name: str, obj: Mapping[str, Any] | None) -> set[str] | None:
        """A slice changed (None: gone): the nodes whose pools changed, None for every."""
        changed: set[str] = set()
        everyone = False
        old = self.by_name.pop(name, None)
        for o, sign in ((old, -1), (obj, 1)):
            if o is None:
                continue
            node = self._count(o, name, sign)
            if node is None:
                everyone = True
            else:
                changed.add(node)
        if obj is not None:
            self.by_name[name] = dict(obj)
        return None if everyone else changed

    def of(self, node: str) -> list[dict[str, Any]]:
        """Every slice of the pools ``node`` may see."""
        keys = set(self.named.get(node, ())) | set(self.everywhere)
        return [obj for key in sorted(keys) for obj in self.pools.get(key, {}).values()]


class Dra:
    """The slices and claim allocations the allocator knows, what it assumed, and the
    per-pod decisions of the gang being placed."""

    def __init__(self, hosts: Hosts, max_steps: int = MAX_STEPS) -> None:
        self.hosts = hosts
        self.max_steps = max_steps
        self.slices = Slices()
        self.observed: dict[str, dict[str, Any]] = {}
        """Allocated claims by ``namespace/name`` (metadata and status.allocation)."""
        self.assumed: dict[PodUID, tuple[ev.ClaimAllocation, ...]] = {}
        self._pools: dict[str, list[Pool]] = {}
        self._held = Tally()
        """What the observed claims and the assumed ones not observed yet hold, kept as
        each changes (:meth:`_observe`, :meth:`_assume`)."""
        self._in_use: InUse | None = None
        self._alone: dict[PodUID, list[Mapping[str, Any]]] | None = None
        """Per pod, the claims reserved for it alone (``held_by``), until a claim changes."""
        self.claimed = hosts.dra = Claimed(self)
        """What the core's gang search reads of DRA, and what its placed pods took
        (shared/core/plugins/dynamic_resources.py)."""

    # --- what the watcher sends ---------------------------------------------------------

    def seen(self, kind: str, key: str, obj: Mapping[str, Any] | None) -> None:
        """A slice or a claim's allocation changed (``obj`` None: gone). One that
        cannot be read (a malformed quantity, a field of the wrong type) is dropped,
        logged: it holds or offers nothing until it changes."""
        if obj is not None and not _readable(kind, obj):
            log.warning("%s %s cannot be read: ignored until it changes", kind, key)
            obj = None
        if kind == "slice":
            changed = self.slices.put(key, obj)
            if changed is None:
                self._pools.clear()
            for node in changed or ():
                self._pools.pop(node, None)
        elif obj is None or not ((obj.get("status") or {}).get("allocation")):
            self._observe(key, None)
        else:
            self._observe(key, dict(obj))
            self._forget_assumed(key)
            if (owner := _extended_owner(obj)) in self.assumed:
                self._forget_extended(owner)
        self._in_use = self._alone = None

    def read_all(self, slices: Iterable[dict[str, Any]], claims: Iterable[dict[str, Any]]) -> None:
        """Every slice and claim as listed at start."""
        for obj in slices:
            self.seen("slice", str(obj["metadata"]["name"]), obj)
        for obj in claims:
            meta = obj["metadata"]
            self.seen("claim", f"{meta.get('namespace', '')}/{meta['name']}", obj)

    def _forget_assumed(self, key: str) -> None:
        for uid, claims in list(self.assumed.items()):
            kept = tuple(c for c in claims if _key(c) != key)
            if len(kept) != len(claims):
                self._assume(uid, kept)

    def _forget_extended(self, uid: PodUID) -> None:
        """The claim made for the pod's extended resources is seen: it holds the devices."""
        self._assume(uid, tuple(c for c in self.assumed[uid] if not c.mappings))

    def _count(self, claims: Iterable[ev.ClaimAllocation], sign: int = 1) -> None:
        """Count what those of ``claims`` not observed allocated hold (assumed, they
        count), claim by claim (``sign`` -1: stop counting it)."""
        for c in claims:
            if _key(c) not in self.observed:
                self._held.add(read.in_use([{"status": {"allocation": c.allocation}}]), sign)

    def _observe(self, key: str, obj: dict[str, Any] | None) -> None:
        """``key`` observed allocated as ``obj`` (None: not, or gone), counted so; an
        assumed claim of that key counts only while it is not observed."""
        assumed = [c for claims in self.assumed.values() for c in claims if _key(c) == key]
        self._count(assumed, -1)
        old = self.observed.pop(key, None)
        if old is not None:
            self._held.add(read.in_use([old]), -1)
        if obj is not None:
            self.observed[key] = obj
            self._held.add(read.in_use([obj]))
        self._count(assumed)

    def _assume(self, uid: PodUID, claims: tuple[ev.ClaimAllocation, ...] | None) -> None:
        """``uid``'s assumed claims become ``claims`` (None or empty: none), counted so."""
        old = self.assumed.pop(uid, None)
        if old:
            self._count(old, -1)
        if claims:
            self.assumed[uid] = claims
            self._count(claims)
        self._in_use = self._alone = None

    def in_use(self) -> InUse:
        """What the observed and assumed allocations hold."""
        if self._in_use is None:
            self._in_use = self._held.snapshot()
        return self._in_use

    def held_by(self, uid: PodUID) -> InUse | None:
        """What the claims reserved for ``uid`` alone hold (observed with ``reservedFor``
        naming only it, or assumed for it and not seen yet); None when none."""
        if self._alone is None:
            alone: dict[PodUID, list[Mapping[str, Any]]] = {}
            for obj in self.observed.values():
                consumers: list[Any] = (obj.get("status") or {}).get("reservedFor") or []
                if len(consumers) == 1 and consumers[0].get("uid"):
                    alone.setdefault(PodUID(str(consumers[0]["uid"])), []).append(obj)
            for pod, claims in self.assumed.items():
                alone.setdefault(pod, []).extend(
                    {"status": {"allocation": c.allocation}}
                    for c in claims
                    if not c.reserve_only and _key(c) not in self.observed
                )
            self._alone = alone
        objs = self._alone.get(uid)
        return read.in_use(objs) if objs else None

    def pools(self, node: str) -> list[Pool]:
        """The pools ``node`` sees (cached until a slice changes)."""
        found = self._pools.get(node)
        if found is None:
            host = self.hosts.nodes.get(NodeName(node))
            labels = host.labels if host is not None else {}
            found = self._pools[node] = read.node_pools(self.slices.of(node), node, labels)
        return found

    # --- placing ------------------------------------------------------------------------

    def begin(self) -> None:
        """A gang is about to be placed: what an earlier attempt prepared or took goes."""
        self.claimed.begin()

    def assume(self, placed: Sequence[PodGrant]) -> None:
        """Hold the claims of each placed pod: the allocations the core's gang search
        took for it on its node (``Claimed.taken``), and its claims allocated already,
        to reserve only."""
        taken = self.claimed.taken
        for grant in placed:
            claims = grant.spec.claims if grant.spec is not None else None
            made = tuple(
                ev.ClaimAllocation(
                    namespace=c.namespace,
                    name=c.name,
                    uid=c.uid,
                    allocation=c.allocation or {},
                    reserve_only=True,
                )
                for c in (claims.reserve if claims is not None else ())
            )
            found = taken.get(grant.pod.uid)
            if claims is not None and claims.allocate and found is None:
                # Only a profile without DynamicResources places such a pod.
                log.warning("%s placed without its ResourceClaims allocated", grant.pod)
            if claims is not None and found is not None:
                made += tuple(
                    ev.ClaimAllocation(
                        namespace=claim.namespace,
                        name=claim.name,
                        uid=claim.uid,
                        allocation=read.allocation_json(a, lambda: str(uuid.uuid4())),
                        mappings=claim.mappings,
                        devices=claim.devices if claim.mappings else {},
                    )
                    for claim, a in zip(claims.allocate, found[1], strict=True)
                )
            if made:
                self._assume(grant.pod.uid, made)
        self.claimed.begin()
        self._in_use = self._alone = None

    def restore(self, claims: Mapping[PodUID, tuple[ev.ClaimAllocation, ...]]) -> None:
        """What open reservations held at start (services/device_allocator/reservations.py),
        less the claims already seen allocated."""
        made = {_extended_owner(obj) for obj in self.observed.values()}
        for uid, held in claims.items():
            kept = tuple(
                c for c in held if _key(c) not in self.observed and not (c.mappings and uid in made)
            )
            if kept:
                self._assume(uid, kept)
        self._in_use = self._alone = None

    def release(self, uid: PodUID) -> None:
        """The pod's assumed claims are given back (its bind failed, timed out, or it is
        gone); claims already seen allocated are given back when the watcher sees them
        deallocated or deleted."""
        if uid in self.assumed:
            self._assume(uid, None)

    def decided(self, uid: PodUID) -> tuple[ev.ClaimAllocation, ...]:
        """What ``uid``'s decision carries for its claims."""
        return self.assumed.get(uid, ())
