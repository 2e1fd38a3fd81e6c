"""DRA in the allocator: a pod's unallocated ResourceClaims allocated where it is placed.

The watcher sends the cluster's ResourceSlices and the allocations of ResourceClaims
(``dra.object``); a pending pod carries its claims not allocated yet and the
DeviceClasses they name (``Claims.allocate``, shared/core/claims.py). Before the core
places a gang, :meth:`Dra.restrict` decides each member with claims on every node that
sees a pool (shared/core/dra: ``prepare`` once per pod, ``allocate`` per node) and hands
the core the nodes that fit as one more node term, which the DynamicResources filter
applies (shared/core/plugins/dynamic_resources.py); no node fits: the gang is refused
with the reason. Once the core has placed the gang, :meth:`Dra.assume` allocates each
member's claims on its node, members in order, each seeing what the ones before took
(``InUse.plus``): all or nothing. A gang whose members contend for one node's devices
is refused then, not placed elsewhere (the core's gang search does not see DRA). A
member's claims allocated already but not reserved for it (``Claims.reserve``) ride
along as ``reserve_only``: the binder only adds the pod to their ``reservedFor``.

One claim's states here (the ledger's own for grants: services/device_allocator/service.py)::

    unallocated --assume--> assumed (this pod's, until the binder's write is seen)
        assumed --the watcher sends it allocated--> observed (read.in_use)
        assumed --release (bind failed or timed out, pod deleted)--> gone
        observed --deallocated or deleted--> gone

What is in use is the observed allocations (anyone's: Tessera's binder or another
scheduler) and the assumed ones not observed yet, summed by ``read.in_use``.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from shared import events as ev
from shared.core.dra import InUse, Pool, Prepared, allocate, prepare, read
from shared.core.dra.cel import SelectorError
from shared.core.hosts import DraClaim, node_terms
from shared.core.model import NodeName, PodUID
from shared.core.nodefit import Hosts
from shared.core.placement import GangMember
from shared.core.status import Code, Reason, Status

log = logging.getLogger(__name__)

PLUGIN = "DynamicResources"
MAX_STEPS = 5_000
"""The search steps ``allocate`` may take on one node. A claim that fits is found in a
few steps per device requested (8 devices matched on one attribute among 24: 0.2 ms);
only a claim that does not fit makes the search backtrack through combinations (9 such
devices among 24: unbounded, seconds). A step costs about 13 µs here (measured
2026-11-26 on this machine, 2 shared cores: 5,000 steps 65 ms, 20,000 240 ms), so 5,000
keeps one pathological claim from holding the allocator's single ledger loop for more
than tens of milliseconds per node, while claims of up to a dozen devices are decided
far within it. Spent, the attempt stops with the core's error (``timed out trying to
allocate devices``), as kube-scheduler's filter timeout stops it."""


def _status(code: Code, kind: str, detail: str, nodes: int, known: int) -> Status:
    reason = Reason(kind=kind, code=code, detail=detail, nodes=nodes, plugin=PLUGIN)
    return Status(code=code, reasons=(reason,), nodes=known)


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


PoolKey = tuple[str, str]


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
        self._in_use: InUse | None = None
        self._prepared: dict[PodUID, tuple[Prepared, tuple[DraClaim, ...]]] = {}
        """The members of the gang being placed: their claims, prepared."""
        self._reserving: dict[PodUID, tuple[DraClaim, ...]] = {}
        """The members' claims allocated already (``Claims.reserve``), to reserve for them."""

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
            self.observed.pop(key, None)
        else:
            self.observed[key] = dict(obj)
            self._forget_assumed(key)
        self._in_use = None

    def read_all(self, slices: Iterable[dict[str, Any]], claims: Iterable[dict[str, Any]]) -> None:
        """Every slice and claim as listed at start."""
        for obj in slices:
            self.seen("slice", str(obj["metadata"]["name"]), obj)
        for obj in claims:
            meta = obj["metadata"]
            self.seen("claim", f"{meta.get('namespace', '')}/{meta['name']}", obj)

    def _forget_assumed(self, key: str) -> None:
        for uid, claims in list(self.assumed.items()):
            kept = tuple(c for c in claims if f"{c.namespace}/{c.name}" != key)
            if len(kept) != len(claims):
                self.assumed[uid] = kept

    def in_use(self) -> InUse:
        """What the observed and assumed allocations hold."""
        if self._in_use is None:
            objs: list[Mapping[str, Any]] = list(self.observed.values())
            for claims in self.assumed.values():  # those not seen allocated yet
                objs.extend(
                    {"status": {"allocation": c.allocation}}
                    for c in claims
                    if f"{c.namespace}/{c.name}" not in self.observed
                )
            self._in_use = read.in_use(objs)
        return self._in_use

    def pools(self, node: str) -> list[Pool]:
        """The pools ``node`` sees (cached until a slice changes)."""
        found = self._pools.get(node)
        if found is None:
            host = self.hosts.nodes.get(NodeName(node))
            labels = host.labels if host is not None else {}
            found = self._pools[node] = read.node_pools(self.slices.of(node), node, labels)
        return found

    def _candidates(self) -> list[str]:
        """The nodes a slice may reach: named ones, or every node for a selector."""
        if self.slices.everywhere:
            return sorted(str(n) for n in self.hosts.nodes)
        return sorted(n for n in self.slices.named if NodeName(n) in self.hosts.nodes)

    # --- placing ------------------------------------------------------------------------

    def _prepare(self, member: GangMember) -> Prepared | Status:
        claims = member.spec.claims if member.spec is not None else None
        assert claims is not None
        known = len(self.hosts.nodes)
        try:
            records = [
                read.claim_record(
                    {
                        "metadata": {"namespace": c.namespace, "name": c.name},
                        "spec": {"devices": c.devices},
                    }
                )
                for c in claims.allocate
            ]
            classes = {name: read.class_record(obj) for name, obj in claims.classes.items()}
            prep = prepare(records, classes)
        except (SelectorError, ValueError, TypeError) as exc:
            text = f"claim of pod {member.pod}: {exc}"
            return _status(Code.UNRESOLVABLE, "claim-allocate", text, 0, known)
        if not isinstance(prep, Prepared):
            return _status(Code.UNRESOLVABLE, "claim-class", prep.reason, 0, known)
        return prep

    def begin(self) -> None:
        """A gang is about to be placed: what was prepared for an earlier one goes."""
        self._prepared.clear()
        self._reserving.clear()

    def restrict(self, member: GangMember) -> GangMember | Status:
        """``member`` limited to the nodes where its claims can be allocated now, or why
        none fits; unchanged without claims to allocate."""
        claims = member.spec.claims if member.spec is not None else None
        if claims is not None and claims.reserve:
            self._reserving[member.pod.uid] = claims.reserve
        if claims is None or not claims.allocate:
            return member
        prep = self._prepare(member)
        if isinstance(prep, Status):
            return prep
        self._prepared[member.pod.uid] = (prep, claims.allocate)
        fit: list[str] = []
        why: dict[str, int] = {}
        in_use = self.in_use()
        for node in self._candidates():
            out = allocate(prep, node, self.pools(node), in_use, max_steps=self.max_steps)
            if out.fits:
                fit.append(node)
                continue
            if out.error:  # a broken selector, the step budget spent: the attempt stops
                text = f"claim of pod {member.pod} on node {node}: {out.reason}"
                return _status(Code.UNSCHEDULABLE, "claim-allocate", text, 0, len(self.hosts.nodes))
            text = out.reason + (f" ({'; '.join(out.hints)})" if out.hints else "")
            why[text] = why.get(text, 0) + 1
        known = len(self.hosts.nodes)
        if not fit:
            rest = known - sum(why.values())
            if rest > 0:
                why["cannot allocate all claims"] = why.get("cannot allocate all claims", 0) + rest
            reasons = tuple(
                Reason(kind="claim-allocate", detail=t, nodes=n, plugin=PLUGIN)
                for t, n in sorted(why.items())
            )
            return Status(code=Code.UNSCHEDULABLE, reasons=reasons, nodes=known)
        # one term per node: a metadata.name field term takes exactly one value (a term
        # naming two is invalid, matching no node, as kube-scheduler reads it)
        terms = [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}
            for name in fit
        ]
        here = node_terms({"nodeSelectorTerms": terms})
        assert member.spec is not None
        limited = msgspec.structs.replace(claims, devices=(*claims.devices, here))
        spec = msgspec.structs.replace(member.spec, claims=limited)
        return dataclasses.replace(member, spec=spec)

    def assume(self, placed: Sequence[tuple[PodUID, str]]) -> Status | None:
        """Allocate the claims of each placed pod (uid, node) on its node, in order, and
        hold them; None when all fit, else why (nothing is held then)."""
        in_use = self.in_use()
        made: dict[PodUID, tuple[ev.ClaimAllocation, ...]] = {}
        for uid, node in placed:
            reserving = tuple(
                ev.ClaimAllocation(
                    namespace=c.namespace,
                    name=c.name,
                    uid=c.uid,
                    allocation=c.allocation or {},
                    reserve_only=True,
                )
                for c in self._reserving.pop(uid, ())
            )
            if reserving:
                made[uid] = reserving
            found = self._prepared.pop(uid, None)
            if found is None:
                continue
            prep, claims = found
            out = allocate(prep, node, self.pools(node), in_use, max_steps=self.max_steps)
            if out.allocations is None:
                self.begin()
                text = f"{out.reason} on {node} beside the gang's other pods"
                return _status(Code.UNSCHEDULABLE, "claim-allocate", text, 1, len(self.hosts.nodes))
            in_use = in_use.plus(out.allocations)
            made[uid] = reserving + tuple(
                ev.ClaimAllocation(
                    namespace=claim.namespace,
                    name=claim.name,
                    uid=claim.uid,
                    allocation=read.allocation_json(a, lambda: str(uuid.uuid4())),
                )
                for claim, a in zip(claims, out.allocations, strict=True)
            )
        self.begin()
        self.assumed.update(made)
        self._in_use = None
        return None

    def restore(self, claims: Mapping[PodUID, tuple[ev.ClaimAllocation, ...]]) -> None:
        """What open reservations held at start (services/device_allocator/reservations.py),
        less the claims already seen allocated."""
        for uid, held in claims.items():
            kept = tuple(c for c in held if f"{c.namespace}/{c.name}" not in self.observed)
            if kept:
                self.assumed[uid] = kept
        self._in_use = None

    def release(self, uid: PodUID) -> None:
        """The pod's assumed claims are given back (its bind failed, timed out, or it is
        gone); claims already seen allocated are given back when the watcher sees them
        deallocated or deleted."""
        self._prepared.pop(uid, None)
        if self.assumed.pop(uid, None):
            self._in_use = None

    def decided(self, uid: PodUID) -> tuple[ev.ClaimAllocation, ...]:
        """What ``uid``'s decision carries for its claims."""
        return self.assumed.get(uid, ())
