"""Fair share across queues, as Volcano's proportion plugin computes it.

Resources are vectors over canonical dimensions (``nvidia.memory`` in MiB,
``nvidia.cores`` in percent, ``nvidia.count`` in devices, and the same per vendor), so
a queue's capability written with HAMi's names and a pod written with Volcano's name the
same thing.

``deserved``: weighted water-filling of the cluster total. Every round gives each queue
still wanting more a share of what is left in proportion to its weight; a queue's
deserved never exceeds its demand (allocated + pending) nor its capability, and is never
below its guarantee. A queue may start a gang while allocated + in flight + the gang stays
within its deserved share, so a queue over its share waits while others are served, and
an idle cluster still gives one queue everything (the others want nothing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.core.claimed import is_claimed, name_error
from shared.core.model import ContainerGrant, ContainerRequest, DeviceInfo, PodRequest
from shared.core.quantity import parse_quantity
from shared.core.request import ResourceTable, Role
from shared.core.spec import names

if TYPE_CHECKING:
    from shared.core.subgroups import SubGroupPolicy

Resources = dict[str, float]
EPS = 1e-6


def add(a: Mapping[str, float], b: Mapping[str, float], sign: float = 1.0) -> Resources:
    """``a + sign * b`` as a new vector (``accumulate`` adds in place)."""
    out = dict(a)
    accumulate(out, b, sign)
    return out


def accumulate(total: Resources, more: Mapping[str, float], sign: float = 1.0) -> None:
    """``total += sign * more``, in place (``add`` makes a new vector)."""
    for k, v in more.items():
        total[k] = total.get(k, 0.0) + sign * v


def within(need: Mapping[str, float], limit: Mapping[str, float], *, absent: float = 0.0) -> bool:
    """Every dimension of ``need`` fits in ``limit``; a dimension ``limit`` does not name
    counts as ``absent`` (0 for a share, ``math.inf`` for a capability)."""
    return all(v <= limit.get(k, absent) + EPS for k, v in need.items() if v > EPS)


def grant_vector(grants: Iterable[ContainerGrant]) -> Resources:
    """What a placed pod holds, from its grant (exact, where a request is an estimate)."""
    out: Resources = {}
    for c in grants:
        if c.reuses:  # within the app containers' devices: not held twice
            continue
        for d in c.devices:
            for key, value in (
                ("count", 1),
                ("memory", d.memory_mib),
                ("cores", 100 if d.exclusive else d.cores),
            ):
                out[f"{d.vendor}.{key}"] = out.get(f"{d.vendor}.{key}", 0.0) + value
    return out


def cluster_capacity(
    devices: Iterable[DeviceInfo], split: Mapping[str, int]
) -> tuple[Resources, dict[str, int]]:
    """The cluster's devices as queues share them, and the largest card per vendor.

    A card counts as its vGPU slots (``split``: the vendor's ``deviceSplitCount``, as a
    device plugin advertises it), its memory and its cores.
    """
    total: Resources = {}
    largest: dict[str, int] = {}
    for d in devices:
        for key, amount in (
            ("count", split.get(d.vendor, 1)),
            ("memory", d.memory_mib),
            ("cores", d.cores),
        ):
            total[f"{d.vendor}.{key}"] = total.get(f"{d.vendor}.{key}", 0.0) + amount
        largest[d.vendor] = max(largest.get(d.vendor, 0), d.memory_mib)
    return total, largest


def request_vector(request: PodRequest, card_memory: Mapping[str, int]) -> Resources:
    """What a pod takes: count, memory and cores per vendor (percentages resolved against
    the vendor's typical card, ``card_memory``), counted as Kubernetes counts a pod's
    requests: the larger of the app containers with every sidecar, and each init
    container with the sidecars started before it."""
    running: Resources = {}  # sidecars started so far
    out: Resources = {}
    steps: list[Resources] = []
    for c in request.containers:
        vector = _container_vector(c, card_memory)
        if c.init and not c.sidecar:
            steps.append(_plus(vector, running))
            continue
        if c.sidecar:
            running = _plus(running, vector)
        out = _plus(out, vector)
    for step in steps:
        for key, value in step.items():
            out[key] = max(out.get(key, 0.0), value)
    return out


def _plus(a: Resources, b: Resources) -> Resources:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0.0) + value
    return out


def _container_vector(c: ContainerRequest, card_memory: Mapping[str, int]) -> Resources:
    out: Resources = {}
    for r in c.devices:
        memory = r.memory_mib
        if memory is None:
            memory = card_memory.get(r.vendor, 0) * (r.memory_percent or 100) // 100
        cores = 100 if r.exclusive else r.cores
        for key, value in (
            ("count", r.count),
            ("memory", r.count * memory),
            ("cores", r.count * cores),
        ):
            if value:
                out[f"{r.vendor}.{key}"] = out.get(f"{r.vendor}.{key}", 0.0) + value
    return out


_ROLE_DIMENSION = {
    Role.COUNT: "count",
    Role.WHOLE: "count",
    Role.NPU_COUNT: "count",
    Role.MEMORY: "memory",
    Role.SHARE_MEMORY: "memory",
    Role.NPU_MEMORY: "memory",
    Role.CORES: "cores",
    Role.NPU_CORES: "cores",
}


def resource_vector(table: ResourceTable, resources: Mapping[str, object]) -> Resources:
    """A Queue's capability or guarantee, written with any configured resource names,
    and claimed devices' names (``deviceclass/<DeviceClass>``,
    ``<capacity>.deviceclass/<DeviceClass>``: shared/core/claimed.py) as they are."""
    out: Resources = {}
    for name, raw in resources.items():
        if is_claimed(name):
            if name_error(name) is None:  # else the webhook refuses it, naming the field
                with contextlib.suppress(ValueError):
                    out[name] = out.get(name, 0.0) + float(parse_quantity(raw))
            continue
        res = table.by_name.get(name)
        dim = _ROLE_DIMENSION.get(res.role) if res is not None else None
        if res is None or dim is None:
            continue  # cpu, memory and other host resources are not Tessera's to share
        try:
            value = float(parse_quantity(raw))
        except ValueError:
            continue
        key = f"{res.vendor}.{dim}"
        out[key] = out.get(key, 0.0) + value
    return out


def resource_list(table: ResourceTable, vector: Mapping[str, float]) -> dict[str, float]:
    """A vector under the resource names users write (each vendor's first configured
    name for its count, memory and cores): ``resource_vector`` the other way, for a
    Queue's status and metrics."""
    out: dict[str, float] = {}
    for key, value in vector.items():
        if is_claimed(key):  # claimed devices: written as they are named
            out[key] = value
            continue
        vendor, _, dim = key.partition(".")
        spec = table.vendors.get(vendor)  # type: ignore[call-overload]
        field_name = {
            "count": "resource_count_name",
            "memory": "resource_memory_name",
            "cores": "resource_core_name",
        }.get(dim)
        given = names(getattr(spec, field_name)) if spec is not None and field_name else ()
        out[given[0] if given else key] = value
    return out


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A Volcano PodGroup: how many members must go together, and its queue."""

    min_member: int = 1
    min_task_member: Mapping[str, int] = field(default_factory=dict)
    queue: str = "default"
    subgroups: tuple[SubGroupPolicy, ...] = ()
    """``spec.subGroupPolicy`` (shared/core/subgroups.py); none: a plain gang."""
    invalid: str = ""
    """Why its ``subGroupPolicy`` is refused: its pods wait, told this."""
    min_resources: Resources = field(default_factory=dict)
    """``spec.minResources`` as a vector: what its queue must have room for before it
    goes, whatever its pods ask (Volcano's enqueue check)."""


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A Volcano Queue, its resource lists already as vectors (``resource_vector``)."""

    name: str
    weight: float = 1.0
    capability: Resources | None = None
    guarantee: Resources = field(default_factory=dict)
    reclaimable: bool = True
    priority: int = 0
    state: str = "Open"
    parent: str = ""
    """The ``capacity`` plugin's tree: empty for a child of the root queue."""
    deserved: Resources | None = None
    """The ``capacity`` plugin's deserved share as written (None: not written)."""
    preempt_min_runtime_s: float | None = None
    """KAI's ``preemptMinRuntime``: how long its pods run before a gang of their own
    queue may preempt them (None: an ancestor's, else ``scheduler.preemptMinRuntimeS``)."""
    reclaim_min_runtime_s: float | None = None
    """KAI's ``reclaimMinRuntime``: the same before another queue reclaims them."""


@dataclass
class QueueShare:
    """A queue as the water-filling sees it: weight, demand, capability, guarantee."""

    name: str
    weight: float = 1.0
    demand: Resources = field(default_factory=dict)
    """Allocated + pending."""
    capability: Resources | None = None
    guarantee: Resources = field(default_factory=dict)


def capped(vector: Mapping[str, float], limit: Mapping[str, float] | None) -> Resources:
    """``vector`` within ``limit`` (a dimension ``limit`` does not name is not capped)."""
    cap = limit or {}
    return {d: min(v, cap.get(d, v)) for d, v in vector.items()}


def weigh(weights: Mapping[str, float], usage: Mapping[str, float], k: float) -> dict[str, float]:
    """The weights of queues dividing a surplus in one dimension, moved by their normalized
    ``usage`` in it (shared/core/usage.py): ``max(0, nW + k·(nW - nU))`` scaled back to the sum
    of ``weights``. Unchanged with ``k`` 0; if every queue would weigh 0, unchanged too
    (the surplus is still divided)."""
    total = sum(max(w, 0.0) for w in weights.values())
    if k <= 0 or total <= 0:
        return dict(weights)
    moved = {
        name: max(0.0, w / total + k * (w / total - usage.get(name, 0.0)))
        for name, w in ((n, max(w, 0.0)) for n, w in weights.items())
    }
    scale = sum(moved.values())
    if scale <= EPS:
        return dict(weights)
    return {name: v * total / scale for name, v in moved.items()}


def deserved(
    total: Mapping[str, float],
    queues: Iterable[QueueShare],
    usage: Mapping[str, Resources] | None = None,
    k: float = 0.0,
) -> dict[str, Resources]:
    """Each queue's deserved share of ``total`` (see the module docstring). With ``usage``
    (each queue's normalized past use) and ``k`` > 0, each round's weights are moved by
    it, dimension by dimension (``weigh``); guarantees are not."""
    shares = list(queues)
    result: dict[str, Resources] = {q.name: {} for q in shares}
    caps = {q.name: capped(q.demand, q.capability) for q in shares}
    remaining = dict(total)
    active = [q for q in shares if any(v > EPS for v in caps[q.name].values())]
    for _ in range(64):
        if not active:
            break
        base = {q.name: max(q.weight, 0.0) for q in active}
        weights = sum(base.values()) or 1.0
        moved: dict[str, dict[str, float]] = {}
        if usage and k > 0:  # the surplus divided by weights moved by past use
            for dim in remaining:
                past = {n: usage.get(n, {}).get(dim, 0.0) for n in base}
                moved[dim] = weigh(base, past, k)
        progressed = False
        for q in list(active):
            mine = result[q.name]
            for dim, left in remaining.items():
                want = caps[q.name].get(dim, 0.0) - mine.get(dim, 0.0)
                if want <= EPS or left <= EPS:
                    continue
                weight = moved[dim][q.name] if moved else base[q.name]
                give = min(want, left * weight / weights)
                if give > EPS:
                    mine[dim] = mine.get(dim, 0.0) + give
                    progressed = True
        used: Resources = {}
        for mine in result.values():
            used = add(used, mine)
        remaining = {k: max(0.0, v - used.get(k, 0.0)) for k, v in total.items()}
        active = [
            q
            for q in active
            if any(
                caps[q.name].get(d, 0.0) - result[q.name].get(d, 0.0) > EPS
                and remaining.get(d, 0.0) > EPS
                for d in caps[q.name]
            )
        ]
        if not progressed:
            break
    for q in shares:
        for dim, floor in q.guarantee.items():
            if result[q.name].get(dim, 0.0) < floor:
                result[q.name][dim] = floor
    return result
