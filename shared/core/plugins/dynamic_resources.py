"""DynamicResources: a pod's ResourceClaims against the node.

- An allocated claim's node selector must take the node; a claim not ready waits
  (shared/core/claims.py).
- The claims not allocated yet (``Claims.allocate``) are allocated on the node by
  shared/core/dra (``prepare`` once per pod, ``allocate`` per node) over the pools the
  node sees and what is in use: the allocator's :class:`ClaimSource`
  (services/device_allocator/dra.py) plus what the pods placed before in the same
  attempt took (:class:`Claimed`). A pod placed takes the allocation found for its node
  (kube-scheduler's Reserve, ``Prepared.reserves``), recorded in the gang's Statement, so
  a later member sees it and a discarded gang gives it back: members spread over nodes
  when one node's devices cannot serve them all, and a gang with ``minMember`` below its
  size is placed without a member whose claims fit nowhere.

Without a source (``Hosts.dra`` None: the core's own tests and benchmarks) claims to
allocate are not checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from shared.core.dra import Allocation, InUse, Pool, allocate, prepare, read
from shared.core.dra import Prepared as DraPrepared
from shared.core.dra.cel import SelectorError
from shared.core.dra.extended import IN_MEMORY
from shared.core.framework import FilterPlugin
from shared.core.hosts import Claims
from shared.core.model import NodeName, PodUID
from shared.core.plugins.volume_binding import waits
from shared.core.status import UNRESOLVABLE, Code, Reason, Status, fail

if TYPE_CHECKING:
    from shared.core.nodefit import HostNode, Hosts, Prepared

NAME = "DynamicResources"
CLAIM_NODE = fail(Reason(kind="claim-node", code=UNRESOLVABLE, plugin=NAME))
NO_POOLS = fail(Reason(kind="claim-allocate", detail="cannot allocate all claims", plugin=NAME))


class ClaimSource(Protocol):
    """What the allocator knows of DRA: each node's pools and the allocations in use
    (observed and assumed), and the search's step budget per node."""

    max_steps: int

    def pools(self, node: str) -> list[Pool]:
        """The pools ``node`` sees (its slices', and those of every node)."""
        ...

    def in_use(self) -> InUse:
        """What allocated claims hold, the allocator's assumed ones included."""
        ...

    def held_by(self, uid: PodUID) -> InUse | None:
        """What the claims reserved for ``uid`` alone hold (None: none): given back
        when it is evicted (kube-controller-manager deallocates a claim once no pod is
        left in its ``reservedFor``); a claim shared with another pod is not counted."""
        ...


Taken = tuple[NodeName, tuple[Allocation, ...]]
"""A placed pod's node and the allocations of its claims there."""


class Claimed:
    """DRA as a placement attempt sees it: the source, and the allocations the pods
    placed in this attempt took (``taken``), until the allocator assumes them
    (committed) or their statement gives them back (discarded).

    A pod's states here::

        (none) --placed (Reserve)--> taken --statement discarded (Unreserve)--> (none)
        taken --the allocator assumes it, begin()--> (none; in the source's in_use)
    """

    def __init__(self, source: ClaimSource) -> None:
        self.source = source
        self.taken: dict[PodUID, Taken] = {}
        self.freed: dict[PodUID, InUse] = {}
        """What the claims of pods a preemption plan evicts hold (``leave``)."""
        self._combined: tuple[InUse, InUse] | None = None
        """The source's in_use and it with ``taken`` and less ``freed``, while none
        changes."""
        self._prepared: dict[int, tuple[Claims, DraPrepared | Status]] = {}
        """Each pod's claims prepared (selectors compiled) once per attempt, by the
        identity of its ``Claims`` (kept, so the identity is not reused)."""

    def begin(self) -> None:
        """A new attempt: nothing taken, freed or prepared."""
        self.taken.clear()
        self.freed.clear()
        self._prepared.clear()
        self._combined = None

    def in_use(self) -> InUse:
        """What the source holds plus what this attempt's pods took, less what the
        claims of the pods it evicts hold."""
        base = self.source.in_use()
        if not self.taken and not self.freed:
            return base
        combined = self._combined
        if combined is None or combined[0] is not base:
            more = (a for _, allocations in self.taken.values() for a in allocations)
            now = base.plus(more)
            for held in self.freed.values():
                now = now.less(held)
            combined = self._combined = (base, now)
        return combined[1]

    def leave(self, uid: PodUID) -> Undo | None:
        """``uid`` is evicted in a plan (shared/core/preemption.py): the claims reserved
        for it alone count as free; the answer counts them held again."""
        held = self.source.held_by(uid)
        if held is None or uid in self.freed:
            return None
        self.freed[uid] = held
        self._combined = None

        def undo() -> None:
            self.freed.pop(uid, None)
            self._combined = None

        return undo

    def stay(self, uid: PodUID) -> Undo | None:
        """``uid`` is put back in a plan: its claims count as held again; the answer
        frees them once more."""
        held = self.freed.pop(uid, None)
        if held is None:
            return None
        self._combined = None

        def undo() -> None:
            self.freed[uid] = held
            self._combined = None

        return undo

    def take(self, uid: PodUID, node: NodeName, allocations: tuple[Allocation, ...]) -> Undo:
        """``uid`` placed on ``node`` holds ``allocations``; the answer undoes it."""
        before = self.taken.get(uid)
        self.taken[uid] = (node, allocations)
        self._combined = None

        def undo() -> None:
            if before is None:
                self.taken.pop(uid, None)
            else:
                self.taken[uid] = before
            self._combined = None

        return undo

    def prepared(self, claims: Claims) -> DraPrepared | Status:
        """The pod's claims to allocate with their classes resolved and selectors
        compiled, or why no node can take them (unresolvable)."""
        found = self._prepared.get(id(claims))
        if found is None:
            found = self._prepared[id(claims)] = (claims, _prepare(claims))
        return found[1]


Undo = Callable[[], None]


def _refused(kind: str, detail: str) -> Status:
    reason = Reason(kind=kind, code=UNRESOLVABLE, detail=detail, nodes=0, plugin=NAME)
    return Status(code=Code.UNRESOLVABLE, reasons=(reason,))


def _prepare(claims: Claims) -> DraPrepared | Status:
    try:
        records = [
            read.claim_record(
                {
                    # the claim made for extended resources has no name until the
                    # binder creates it
                    "metadata": {"namespace": c.namespace, "name": c.name or IN_MEMORY},
                    "spec": {"devices": c.devices},
                }
            )
            for c in claims.allocate
        ]
        classes = {name: read.class_record(obj) for name, obj in claims.classes.items()}
        prep = prepare(records, classes)
    except (SelectorError, ValueError, TypeError) as exc:
        return _refused("claim-allocate", f"claim: {exc}")
    if not isinstance(prep, DraPrepared):
        return _refused("claim-class", prep.reason)
    return prep


@dataclass(slots=True)
class PodClaims:
    """One pod's cycle state for its claims to allocate: prepared once, and the
    allocations found per node (its Reserve takes the chosen node's)."""

    prepared: DraPrepared
    found: dict[NodeName, tuple[Allocation, ...]]


class DynamicResources(FilterPlugin):
    """Refuses a node that an allocated claim's node selector does not take, or where
    the claims to allocate cannot be allocated beside what is in use."""

    name = NAME
    reads = "claims"
    labels_only = True

    def pre_filter(self, hosts: Hosts, prep: Prepared) -> Status | bool:
        """A ResourceClaim not ready makes the pod wait, on every node; claims to
        allocate are prepared (a missing DeviceClass, a selector that does not compile:
        no node can take the pod)."""
        waited = waits(hosts, prep, NAME, lambda claims: claims.devices or claims.allocate)
        claims = prep.pod.claims
        if waited is not True or claims is None or not claims.allocate:
            return waited
        if hosts.dra is None:
            return bool(claims.devices)
        found = hosts.dra.prepared(claims)
        if isinstance(found, Status):
            return Status(code=found.code, reasons=found.reasons, nodes=hosts.known)
        prep.dra = PodClaims(found, {})
        prep.reserves = (*prep.reserves, self.reserve)
        return True

    def filter(self, prep: Prepared, host: HostNode) -> Status | None:
        """Every allocated claim's node selector against the node, then the claims to
        allocate on it."""
        claims = prep.pod.claims
        assert claims is not None  # pre_filter skips a pod without
        name, labels = host.name, host.labels
        for terms in claims.devices:
            if not any(t.matches(name, labels) for t in terms):
                return CLAIM_NODE
        mine = prep.dra
        if mine is None:
            return None
        claimed = prep.hosts.dra
        assert claimed is not None  # pre_filter sets ``dra`` only with a source
        source = claimed.source
        pools = source.pools(name)
        if not pools:
            return NO_POOLS
        out = allocate(mine.prepared, name, pools, claimed.in_use(), max_steps=source.max_steps)
        if out.allocations is not None:
            mine.found[name] = out.allocations
            return None
        # An error (a selector failing on a device, the step budget spent) is said as
        # it is; kube-scheduler stops the attempt there, here the node is refused.
        text = out.reason + (f" ({'; '.join(out.hints)})" if out.hints else "")
        return fail(Reason(kind="claim-allocate", detail=text, plugin=NAME))

    def reserve(self, prep: Prepared, uid: PodUID, node: NodeName) -> Undo | None:
        """The pod placed on ``node`` takes the allocations its filter found there;
        the answer gives them back (Unreserve)."""
        mine, claimed = prep.dra, prep.hosts.dra
        if mine is None or claimed is None or node not in mine.found:
            return None
        return claimed.take(uid, node, mine.found[node])
