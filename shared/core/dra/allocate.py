"""Whether a pod's unallocated ResourceClaims can be allocated on one node, and how.

:func:`~shared.core.dra.prepare.prepare` does, once per pod, what does not depend on the
node: it resolves each request's DeviceClass and compiles the selectors. :func:`allocate`
then decides one node from that node's pools and the cluster's
:class:`~shared.core.dra.model.InUse`, as the structured allocator of the release
tools/go.mod pins decides (its variant for the default feature gates of 1.36:
consumable capacity, prioritized lists, admin access, device taints, partitionable
devices and binding conditions on), and returns the allocations to write or the reason
kube-scheduler's DynamicResources filter gives.

The search is that allocator's: claims in order, requests in order, a request's
devices one after another; for each, the node's devices in pool order (driver, then
pool name; pools whose devices carry binding conditions last), slice name, then slice
order, skipping devices held by others, not selected, or without room; the first
choice that lets every later request be served wins, and a choice is undone when a
later request cannot be served (backtracking). A ``firstAvailable`` request tries its
subrequests in order, each with the whole rest of the search. ``All`` takes every
matching device (none matching: the node does not fit). Constraints are checked as
devices are added, with the allocator's bookkeeping (see :class:`Tracker`).
Selector results are remembered per device and request for the node: a selector is
evaluated only on devices the search reaches, so a selector that fails on some device
stops the attempt exactly where the allocator's would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import NamedTuple

from shared.core.dra import capacity as cap
from shared.core.dra.cel import SelectorError, selects
from shared.core.dra.counters import Counters
from shared.core.dra.devices import Dev, Req, Tracker, tainted
from shared.core.dra.model import (
    ALLOCATION_RESULTS_MAX,
    Allocation,
    DeviceKey,
    InUse,
    Outcome,
    Pool,
    Request,
)
from shared.core.dra.prepare import Prepared
from shared.core.dra.written import SelectorTermsError, allocation

CANNOT_ALLOCATE = "cannot allocate all claims"
"""DynamicResources' Filter text when the allocator finds no allocation on the node."""


class _FailedError(Exception):
    """An error that stops the scheduling attempt (the allocator's returned error)."""


class _TimedOutError(Exception):
    """The search took more steps than the caller allows."""


class _MaxSizeError(Exception):
    """A claim would get more than ALLOCATION_RESULTS_MAX devices on this path."""


def _add(into: dict[str, Fraction], amounts: Mapping[str, Fraction], sign: int) -> None:
    for name, amount in amounts.items():
        into[name] = into.get(name, Fraction(0)) + sign * amount


class _Search:
    """One node's allocation attempt (the allocator's per-node state)."""

    def __init__(
        self, prep: Prepared, node: str, pools: Sequence[Pool], in_use: InUse, budget: float
    ) -> None:
        self.prep, self.node, self.in_use = prep, node, in_use
        self.steps, self.budget = 0, budget
        self.pools = sorted(
            pools,
            key=lambda p: (
                any(d.binding_conditions for s in p.slices for d in s.devices),
                p.driver,
                p.name,
            ),
        )
        self.order = [
            (pool, [(s, s.devices) for s in sorted(pool.slices, key=lambda s: s.name)])
            for pool in self.pools
        ]
        self.seen: dict[tuple[DeviceKey, int, int, int], bool] = {}
        self.needs: dict[tuple[int, DeviceKey], dict[str, Fraction] | None] = {}
        self.reqs: dict[tuple[int, int, int], Req] = {}
        self.chosen: dict[tuple[int, int], int] = {}
        self.holding: dict[DeviceKey, set[int]] = {}
        self.taking: dict[DeviceKey, dict[str, Fraction]] = {}
        self.results: list[list[tuple[Req, Dev, Mapping[str, Fraction] | None]]] = []
        self.constraints: list[list[Tracker]] = []
        self.devices = self._index()
        self.counters = Counters([pool for pool, _ in self.order], in_use)
        self.shares: dict[DeviceKey, int] = {}
        self.by_pool: dict[int, list[tuple[int, int, int, Dev]]] = {}
        for entry in self.devices:
            self.by_pool.setdefault(entry[0], []).append(entry)

    # --- selection ------------------------------------------------------------------

    def _selectors(self, where: str, texts: Sequence[str], dev: Dev) -> bool:
        for i, text in enumerate(texts):
            try:
                if not selects(text, dev.key[0], dev.device):
                    return False
            except SelectorError as e:
                raise _FailedError(f"{where}: selector #{i}: {e}") from None
        return True

    def _selectable(self, at: tuple[int, int, int], req: Req, dev: Dev) -> bool:
        memo = (dev.key, *at)
        if (known := self.seen.get(memo)) is not None:
            return known
        claim = self.prep.claims[at[0]]
        ok = self._selectors(f"class {req.cls.name}", req.cls.selectors, dev)
        ok = ok and self._selectors(
            f"claim {claim.namespace}/{claim.name}", req.request.selectors, dev
        )
        if ok and dev.slice.per_device and dev.device.name not in dev.slice.here:
            ok = False  # another node's device, checked after the selectors as upstream
        self.seen[memo] = ok
        return ok

    def _room(self, req: Req, dev: Dev) -> bool:
        capacity = dev.device.capacity
        if not capacity:
            return not req.request.capacity
        memo = (id(req.request), dev.key)
        if memo in self.needs:
            need = self.needs[memo]
        else:
            need = self.needs[memo] = cap.demand(req.request.capacity, capacity)
        return need is not None and cap.room(
            need, capacity, self.in_use.consumed.get(dev.key), self.taking.get(dev.key)
        )

    def _in_use(self, key: DeviceKey) -> bool:
        return key in self.in_use.devices or bool(self.holding.get(key))

    def _index(self) -> list[tuple[int, int, int, Dev]]:
        """Every device of the complete pools, in search order, with its place."""
        found = []
        for p, (pool, slices) in enumerate(self.order):
            if pool.incomplete or pool.invalid:
                continue
            for s, (slice_, devices) in enumerate(slices):
                for d, device in enumerate(devices):
                    dev = Dev((pool.driver, pool.name, device.name), device, slice_, p)
                    found.append((p, s, d, dev))
        return found

    # --- the requests -----------------------------------------------------------------

    def validate(self, at: tuple[int, int, int], request: Request, parent: str) -> Req:
        claim = self.prep.claims[at[0]]
        cls = self.prep.classes.get(request.device_class)
        if cls is None:
            raise _FailedError(
                f"claim {claim.namespace}/{claim.name}, request {request.name}: could not "
                f"retrieve device class {request.device_class}"
            )
        req = Req(request, parent, cls, request.count, None)
        if not request.all:
            return req
        everything = []
        for p, (pool, _) in enumerate(self.order):
            # Pool by pool, as the allocator: a selector failing on an earlier pool's
            # device is reported before a later pool being incomplete.
            if pool.incomplete:
                raise _FailedError(
                    f"claim {claim.namespace}/{claim.name}, request {request.name}: asks for "
                    f"all devices, but resource pool {pool.driver}/{pool.name} is currently "
                    "being updated"
                )
            if pool.invalid:
                raise _FailedError(
                    f"claim {claim.namespace}/{claim.name}, request {request.name}: asks for "
                    f"all devices, but resource pool {pool.driver}/{pool.name} is currently "
                    "invalid"
                )
            for *_, dev in self.by_pool.get(p, ()):
                if self._selectable(at, req, dev) and self._room(req, dev):
                    everything.append(dev)
        return req._replace(wanted=len(everything), everything=tuple(everything))

    def setup(self) -> None:
        for c, claim in enumerate(self.prep.claims):
            least = 0
            for r, request in enumerate(claim.requests):
                if request.exactly is not None:
                    req = self.reqs[c, r, 0] = self.validate((c, r, 0), request.exactly, "")
                    least += req.wanted
                    continue
                fewest = None
                for s, sub in enumerate(request.first_available):
                    req = self.reqs[c, r, s] = self.validate((c, r, s), sub, request.name)
                    fewest = req.wanted if fewest is None else min(fewest, req.wanted)
                least += fewest or 0
            if least > ALLOCATION_RESULTS_MAX:
                raise _FailedError(
                    f"claim {claim.namespace}/{claim.name}: number of requested devices "
                    f"{least} exceeds the claim limit of {ALLOCATION_RESULTS_MAX}"
                )
            self.results.append([])
            self.constraints.append([Tracker(k) for k in claim.constraints])

    def one(self, c: int, r: int, s: int, n: int, sub: bool, start: tuple[int, int, int]) -> bool:
        """The allocator's recursive step: device ``n`` of subrequest ``s`` of request
        ``r`` of claim ``c``, searching from ``start`` (pool, slice, device)."""
        self.steps += 1
        if self.steps > self.budget:
            raise _TimedOutError
        claims = self.prep.claims
        if c >= len(claims):
            return True
        claim = claims[c]
        if r >= len(claim.requests):
            try:
                return self.one(c + 1, 0, 0, 0, False, (0, 0, 0))
            except _MaxSizeError:
                return False
        req = self.reqs[c, r, s]
        if not sub and req.parent:
            exceeded = True
            for s2 in range(len(claim.requests[r].first_available)):
                try:
                    done = self.one(c, r, s2, n, True, (0, 0, 0))
                except _MaxSizeError:
                    continue
                exceeded = False
                if done:
                    self.chosen[c, r] = s2
                    return True
            if exceeded:
                raise _MaxSizeError
            return False
        if req.everything is not None and not req.everything:
            return False
        if n >= req.wanted:
            return self.one(c, r + 1, 0, 0, False, (0, 0, 0))
        if len(self.results[c]) + req.wanted - n > ALLOCATION_RESULTS_MAX:
            raise _MaxSizeError
        at = (c, r, s)
        if req.everything is not None:
            dev = req.everything[n]
            undo = self.take(at, req, dev, must=True)
            if undo is None:
                return False
            if self.one(c, r, s, n + 1, sub, (0, 0, 0)):
                return True
            undo()
            return False
        admin = req.request.admin_access
        for p, si, d, dev in self.devices:
            if (p, si, d) < start:
                continue
            if admin and c in self.holding.get(dev.key, ()):
                continue
            if not admin and self._in_use(dev.key):
                continue
            if not self._selectable(at, req, dev) or not self._room(req, dev):
                continue
            undo = self.take(at, req, dev, must=False)
            if undo is None:
                continue
            if self.one(c, r, s, n + 1, sub, (p, si, d + 1)):
                return True
            undo()
        return False

    def take(self, at: tuple[int, int, int], req: Req, dev: Dev, must: bool) -> _Undo | None:
        """Adds ``dev`` to the claim for ``req``; None if it cannot be."""
        c = at[0]
        request, key, device = req.request, dev.key, dev.device
        if not device.shared and request.admin_access and c in self.holding.get(key, ()):
            return None
        if not request.admin_access and self._in_use(key):
            return None
        # A shared device with a share already drew on its pool's counters.
        drawn = device.shared and (
            dev.key in self.in_use.consumed or bool(self.shares.get(dev.key))
        )
        reserved = bool(device.counters) and not drawn
        if reserved and not self.counters.reserve(dev.pool, device):
            return None
        if tainted(device, request):
            if reserved:
                self.counters.release(dev.pool, device)
            return None
        base, sub = (req.parent, request.name) if req.parent else (request.name, "")
        added: list[Tracker] = []
        for constraint in self.constraints[c]:
            if not constraint.add(base, sub, dev):
                for k in reversed(added):
                    k.remove(base, sub)
                if reserved:
                    self.counters.release(dev.pool, device)
                if must:
                    claim = self.prep.claims[c]
                    raise _FailedError(
                        f"claim {claim.namespace}/{claim.name}, request {request.name}: "
                        f"cannot add device {'/'.join(key)} because a claim constraint would "
                        "not be satisfied"
                    )
                return None
            added.append(constraint)
        if not self._room(req, dev):
            for k in reversed(added):
                k.remove(base, sub)
            if reserved:
                self.counters.release(dev.pool, device)
            return None
        amounts = cap.consumption(request.capacity, device.capacity) if device.shared else None
        if device.shared:
            _add(self.taking.setdefault(key, {}), amounts or {}, +1)
            self.shares[key] = self.shares.get(key, 0) + 1
        else:
            self.holding.setdefault(key, set()).add(c)
        self.results[c].append((req, dev, amounts))
        return _Undo(self, c, base, sub, dev, added, amounts, reserved)


class _Undo(NamedTuple):
    search: _Search
    claim: int
    base: str
    sub: str
    dev: Dev
    added: list[Tracker]
    amounts: Mapping[str, Fraction] | None
    reserved: bool

    def __call__(self) -> None:
        search, key = self.search, self.dev.key
        search.results[self.claim].pop()
        if self.dev.device.shared:
            _add(search.taking[key], self.amounts or {}, -1)
            search.shares[key] -= 1
        else:
            search.holding[key].discard(self.claim)
        for k in reversed(self.added):
            k.remove(self.base, self.sub)
        if self.reserved:
            search.counters.release(self.dev.pool, self.dev.device)


def allocate(
    prep: Prepared,
    node: str,
    pools: Sequence[Pool],
    in_use: InUse,
    max_steps: int | None = None,
) -> Outcome:
    """Decides one node: ``pools`` are the node's view of the drivers' pools (slices
    that target it), ``in_use`` what allocated claims hold. Pure; the same inputs give
    the same outcome.

    The search backtracks and can take exponentially many steps on claims that do not
    fit (as the allocator's: kube-scheduler bounds it with a time limit, its
    ``DRASchedulerFilterTimeout``); ``max_steps`` bounds it by steps, deterministically,
    and a search that runs out is an error that stops the attempt (kube-scheduler's
    ``node <name>: timed out trying to allocate devices``). None: no bound."""
    search = _Search(prep, node, pools, in_use, float("inf") if max_steps is None else max_steps)
    try:
        search.setup()
        done = search.one(0, 0, 0, 0, False, (0, 0, 0))
    except _FailedError as e:
        return Outcome(reason=str(e), error=True)
    except _MaxSizeError:
        return Outcome(reason="allocation max size exceeded", error=True)
    except _TimedOutError:
        return Outcome(reason=f"node {node}: timed out trying to allocate devices", error=True)
    if not done:
        if any(pool.invalid for pool in pools):
            return Outcome(reason="invalid resource pools were encountered")
        return Outcome(reason=CANNOT_ALLOCATE, hints=_hints(search))
    try:
        written = tuple(_written(search, c) for c in range(len(prep.claims)))
    except SelectorTermsError as e:
        return Outcome(reason=str(e), error=True)
    return Outcome(allocations=written)


def _hints(search: _Search) -> tuple[str, ...]:
    """Requests whose capacity request no device they select could ever serve (from the
    selectors' answers the search has already; none is evaluated for this)."""
    hints = []
    for (c, r, s), req in search.reqs.items():
        if not req.request.capacity:
            continue
        why = [
            cap.refusal(req.request.capacity, dev.device.capacity)
            for *_, dev in search.devices
            if search.seen.get((dev.key, c, r, s))
        ]
        if why and all(why):
            claim = search.prep.claims[c]
            hints.append(
                f"claim {claim.namespace}/{claim.name}, request {req.result_name}: no device "
                f"it selects can serve its capacity request ({why[0]})"
            )
    return tuple(hints)


def _written(search: _Search, c: int) -> Allocation:
    """Claim ``c``'s ``status.allocation``, from the search's choices."""
    claim = search.prep.claims[c]
    picked = [search.reqs[c, r, search.chosen.get((c, r), 0)] for r in range(len(claim.requests))]
    return allocation(claim, search.node, search.results[c], picked)
