"""Placement policies as parameters: binpack, spread, and fragmentation gradient descent.

Device level (inside one node), HAMi's score decides: after adding the request, a device
scores ``slots_used/slots + cores_used/cores + mem_used/mem``; binpack takes the fullest
device, spread the emptiest.

Node level, binpack and spread are the order in which the ledger's index is walked
(tightest free memory first, or emptiest first; see shared/core/ledger.py), so the first
node that fits is the policy's choice and no node is scored at all.

``fgd`` follows Weng et al., "Beware of Fragmentation" (USENIX ATC '23). A *task type*
(:class:`Shape`) is what a task asks of a node: ``count`` devices each needing
``fraction`` of one, its cpu and memory, and the GPU types it may use. The fragmentation
of a node for one type is the free GPU share that type cannot use there: all of it when
the type does not fit the node at all (its cpu or memory is more than the node has free,
no device is of a type it may use, too few devices have room), otherwise the free share
of the devices too small for it (or of a type it may not use). A node's expected
fragmentation weighs that by each type's popularity in the workload (:class:`Workload`);
the placement that increases it least is chosen, at node and at device level. A task
asking for no GPU weighs nothing: every free GPU is a fragment to it on any node, so it
adds the same to every choice and changes none; it is placed by FGD all the same, and
its cpu and memory count through the types it can keep off a node.

One step past the paper: a type uses only as many devices as the node's free cpu and
memory can hold tasks of it (:func:`usable`, ``tasks``). The paper asks whether one task
fits the host; then a node with eight idle cards and the cores for two tasks counts all
eight as usable, and a pod that eats those cores looks free until the last task's worth
is gone. Counting the tasks makes every core a pod takes from a node whose cards need
them show up as fragmentation, so pods that need no GPU, or much cpu per GPU, go where
cpu is plentiful. On the openb trace this measure (``bench/packing.py``) leaves 0.5 point
more of the GPUs allocated on the default and gpushare40 variants (bench/RESULTS.md).

:meth:`Workload.fragmentation` computes it as ``free - sum_(s,n) P_(s,n) * U_s(n)`` over
the GPU shapes ``s`` (count, fraction) and task counts ``n`` (0 to the node's devices):
``U_s(n)`` is the free share ``n`` tasks of shape ``s`` can use on the devices (0 when
it does not fit them), ``P_(s,n)`` the popularity of the types of that shape whose GPU
type fits the node and of which its free cpu and memory hold ``n`` tasks. Each factor is
memoised by what it depends on (the free shares; the GPU type, the device count and
where the free cpu and memory fall among the types' needs), so a node is weighed in a
few dictionary reads and one dot product, not a loop over every type.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from shared.core.model import DeviceRequest, Policy

EPS = 1e-9
MEMO_LIMIT = 1 << 16
"""Entries a memo holds before it starts again (a long-running allocator sees ever new
free cpu and memory figures; the memos must not grow without bound)."""
REFRESH_SHARE = 0.05
"""A learned workload is re-weighed once the observations since the last weighing reach
this share of all of them (or a new type appears): the distribution then moves by at
most about 5 % between weighings, and the memos (and the placer's kept results) survive
thousands of placements."""


class Shape(NamedTuple):
    """A task type: ``devices`` devices each needing ``fraction`` (1.0 = whole) of one,
    ``cpu_milli`` and ``memory`` (bytes) of the node, and the GPU types it may use
    (``use_types``: any of these substrings of the lower-cased model; ``nouse_types``:
    none of them; as the ``nvidia.com/use-gputype`` annotations match)."""

    devices: int
    fraction: float
    cpu_milli: int = 0
    memory: int = 0
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()

    def allows(self, model: str) -> bool:
        """May this type use a device of ``model`` (lower case, as ``gpu_type`` says)?"""
        return allows(model, self.use_types, self.nouse_types)

    @property
    def gpu(self) -> tuple[int, float]:
        """The GPU part alone: (devices, fraction)."""
        return (self.devices, self.fraction)


def allows(model: str, use_types: Sequence[str], nouse_types: Sequence[str]) -> bool:
    """May a task with these GPU-type lists use a device of ``model`` (lower case)?"""
    if use_types and not any(t in model for t in use_types):
        return False
    return not (nouse_types and any(t in model for t in nouse_types))


@dataclass
class Workload:
    """The distribution of task types (weights need not sum to 1): given, or learned
    from the pods placed (``observe``)."""

    weights: dict[Shape, float] = field(default_factory=dict)
    _tables: Tables | None = field(default=None, repr=False, compare=False)
    _pending: float = field(default=0.0, repr=False, compare=False)
    """Weight observed since the tables were built (see REFRESH_SHARE)."""

    @classmethod
    def of(cls, shapes: Iterable[tuple[Shape, float]]) -> Workload:
        """A workload of these task types and weights (a type given twice adds up)."""
        w = cls()
        for shape, weight in shapes:
            w.weights[shape] = w.weights.get(shape, 0.0) + weight
        return w

    def observe(self, shape: Shape, weight: float = 1.0) -> None:
        """One more task of this type. Task types asking for no GPU are not kept: they
        change no choice (see the module docstring)."""
        if shape.devices <= 0 or shape.fraction <= 0:
            return
        held = self.weights.get(shape)
        self.weights[shape] = weight if held is None else held + weight
        tables = self._tables
        if tables is None:
            return
        self._pending += weight
        if held is None or self._pending >= REFRESH_SHARE * tables.total:
            self._tables = None

    def tables(self) -> Tables:
        """The weighed distribution and its memos (rebuilt when stale)."""
        tables = self._tables
        if tables is None:
            tables = self._tables = Tables(self.normalised(), sum(self.weights.values()))
            self._pending = 0.0
        return tables

    def normalised(self) -> list[tuple[Shape, float]]:
        """The task types with their popularity (summing to 1); one whole card when none
        is known yet."""
        kept = [(s, w) for s, w in self.weights.items() if s.devices > 0 and s.fraction > 0]
        total = sum(w for _, w in kept)
        if total <= 0:
            return [(Shape(1, 1.0), 1.0)]
        return [(s, w / total) for s, w in kept]

    def fragmentation(
        self,
        free: Iterable[float],
        model: str | Sequence[str] = "",
        cpu_milli: int | None = None,
        memory: int | None = None,
    ) -> float:
        """Expected fragmentation (in GPUs) of a node whose devices have ``free`` shares
        (0..1), of GPU type ``model`` (one for all devices, or one per device), with
        ``cpu_milli`` and ``memory`` (bytes) free (None: not a limit)."""
        tables = self.tables()
        if not isinstance(model, str):
            models = tuple(model)
            if len(set(models)) > 1:
                return fragmentation(
                    list(free), tables.shapes, models=models, cpu_milli=cpu_milli, memory=memory
                )
            model = models[0] if models else ""
        return tables.fragmentation(free, model, cpu_milli, memory)

    def at(self, model: str, cpu_milli: int | None, memory: int | None) -> Workload:
        """This workload seen from one node's host: ``fragmentation(free)`` weighs the
        free shares with that node's GPU type and free cpu and memory (for a choice of
        devices inside the node, where the host side is the same whatever the choice)."""
        return _AtHost(self, model, cpu_milli, memory)


class _AtHost(Workload):
    """A view of a workload fixed on one node's host side (see ``Workload.at``)."""

    def __init__(self, base: Workload, model: str, cpu_milli: int | None, memory: int | None):
        super().__init__(base.weights)
        self.base = base
        self.host = (model, cpu_milli, memory)

    def tables(self) -> Tables:
        return self.base.tables()

    def fragmentation(
        self,
        free: Iterable[float],
        model: str | Sequence[str] = "",
        cpu_milli: int | None = None,
        memory: int | None = None,
    ) -> float:
        at_model, at_cpu, at_memory = self.host
        return self.base.fragmentation(free, model or at_model, at_cpu, at_memory)


class Tables:
    """One weighing of a workload: its GPU shapes, its types by shape, and the memos of
    ``U_s`` (by free shares) and ``P_s`` (by GPU type, free cpu, free memory)."""

    __slots__ = (
        "by_model",
        "gpu",
        "host_memo",
        "limits",
        "shapes",
        "total",
        "types",
        "usable_memo",
    )

    def __init__(self, shapes: list[tuple[Shape, float]], total: float) -> None:
        self.shapes = shapes
        self.total = total
        """The weight observed when weighed (see ``Workload.observe``)."""
        gpu = sorted({s.gpu for s, _ in shapes})
        self.gpu = gpu
        index = {g: i for i, g in enumerate(gpu)}
        self.types = [(index[s.gpu], s, w) for s, w in shapes]
        self.by_model: dict[str, list[tuple[int, int, int, float]]] = {}
        self.limits: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        self.usable_memo: dict[tuple[float, ...], tuple[float, ...]] = {}
        self.host_memo: dict[tuple[str, int, int, int], tuple[float, ...]] = {}

    def usable(self, key: tuple[float, ...]) -> tuple[float, ...]:
        """``U_s(n)`` on devices with these (sorted) free shares: for each GPU shape, for
        ``n`` from 0 to the number of devices."""
        known = self.usable_memo.get(key)
        if known is None:
            if len(self.usable_memo) >= MEMO_LIMIT:
                self.usable_memo.clear()
            known = self.usable_memo[key] = tuple(
                u for c, d in self.gpu for u in usable_by_tasks(key, c, d)
            )
        return known

    def weights(
        self, model: str, cpu: int | None, memory: int | None, devices: int
    ) -> tuple[float, ...]:
        """``P_(s,n)`` on a node of ``model`` with this cpu and memory free and this many
        devices, laid out as :meth:`usable` lays out ``U_s(n)``. It changes only where
        cpu or memory passes some type's cpu or memory times 1 to ``devices``, so it is
        memoised by where they fall among those figures (:meth:`limits_of`), not by the
        figures themselves: a window of nodes with all their different free cores then
        shares a few entries."""
        key = (model, devices, *self.host_key(model, devices, cpu, memory))
        known = self.host_memo.get(key)
        if known is None:
            types = self.by_model.get(model)
            if types is None:
                types = self.by_model[model] = [
                    (i, s.cpu_milli, s.memory, w) for i, s, w in self.types if s.allows(model)
                ]
            row = devices + 1
            p = [0.0] * (len(self.gpu) * row)
            for i, c, m, w in types:
                n = tasks_held(devices, cpu, memory, c, m)
                if n:
                    p[i * row + n] += w
            if len(self.host_memo) >= MEMO_LIMIT:
                self.host_memo.clear()
            known = self.host_memo[key] = tuple(p)
        return known

    def host_key(
        self, model: str, devices: int, cpu: int | None, memory: int | None
    ) -> tuple[int, int]:
        """Where this free cpu and memory fall among :meth:`limits_of`'s figures: two
        hosts of ``model`` with ``devices`` devices and the same key hold as many tasks
        of every type, so the host side of their fragmentation is the same."""
        cpu_limits, memory_limits = self.limits_of(model, devices)
        return (
            -1 if cpu is None else bisect_right(cpu_limits, cpu),
            -1 if memory is None else bisect_right(memory_limits, memory),
        )

    def limits_of(self, model: str, devices: int) -> tuple[list[int], list[int]]:
        """The cpu and the memory figures at which a node of ``model`` with this many
        devices holds one task fewer of some type that may use it: each type's cpu and
        memory times 1 to ``devices``, sorted."""
        limits = self.limits.get((model, devices))
        if limits is None:
            allowed = [s for s, _ in self.shapes if s.allows(model)]
            limits = self.limits[(model, devices)] = (
                sorted({s.cpu_milli * k for s in allowed for k in range(1, devices + 1)}),
                sorted({s.memory * k for s in allowed for k in range(1, devices + 1)}),
            )
        return limits

    def crosses(
        self,
        model: str,
        devices: int,
        cpu: int | None,
        cpu_after: int | None,
        memory: int | None,
        memory_after: int | None,
    ) -> bool:
        """Would a node of ``model`` with this many devices hold fewer tasks of some type
        that may use it once its free cpu and memory go from ``cpu``/``memory`` to the
        ``_after`` figures? If not, the host side of the fragmentation cannot change (a
        search in the two lists of :meth:`limits_of`)."""
        limits = self.limits_of(model, devices)
        for values, before, after in (
            (limits[0], cpu, cpu_after),
            (limits[1], memory, memory_after),
        ):
            if (
                before is not None
                and after is not None
                and bisect_right(values, before) > bisect_right(values, after)
            ):
                return True
        return False

    def fragmentation(
        self, free: Iterable[float], model: str, cpu: int | None, memory: int | None
    ) -> float:
        """Expected fragmentation of a node of ``model`` with these free device shares and this cpu
        and memory free (None: no limit): the free share the workload's types cannot use there,
        weighed by popularity."""
        key = tuple(sorted(free))
        total = sum(key)
        if total <= EPS:
            return 0.0
        weights = self.weights(model, cpu, memory, len(key))
        used = float(sum(map(operator.mul, weights, self.usable(key))))
        return max(0.0, total - used)


def usable(free: Sequence[float], count: int, fraction: float, tasks: int | None = None) -> float:
    """The free share tasks of ``count`` devices x ``fraction`` can use on devices with
    ``free`` shares: that of the devices with room for one, or 0 when fewer than
    ``count`` have (a whole-card task can use idle cards only). ``tasks``: how many of
    them the host can hold (None: no limit); they use at most ``tasks x count`` idle
    cards, or the ``tasks`` roomiest devices for a share of one."""
    steps = usable_by_tasks(free, count, fraction)
    return steps[len(free) if tasks is None else min(tasks, len(free))]


def usable_by_tasks(free: Sequence[float], count: int, fraction: float) -> list[float]:
    """``usable`` for ``tasks`` = 0, 1, ... ``len(free)`` (more tasks than devices use no
    more than that many)."""
    if fraction >= 1.0 - EPS:
        whole = sum(1 for f in free if f >= 1.0 - EPS)
        if whole < count:
            return [0.0] * (len(free) + 1)
        return [float(min(whole, n * count)) for n in range(len(free) + 1)]
    room = sorted((f for f in free if f >= fraction - EPS), reverse=True)
    if len(room) < count:
        return [0.0] * (len(free) + 1)
    out = [0.0]
    for n in range(1, len(free) + 1):
        out.append(out[-1] + (room[n - 1] if n <= len(room) else 0.0))
    return out


def tasks_held(
    devices: int, cpu: int | None, memory: int | None, cpu_each: int, memory_each: int
) -> int:
    """How many tasks asking ``cpu_each`` and ``memory_each`` a host with ``cpu`` and
    ``memory`` free holds (None: not a limit), at most ``devices`` (no more can use a
    device of their own)."""
    n = devices
    if cpu is not None:
        if cpu_each > cpu:
            return 0
        if cpu_each > 0:
            n = min(n, cpu // cpu_each)
    if memory is not None:
        if memory_each > memory:
            return 0
        if memory_each > 0:
            n = min(n, memory // memory_each)
    return n


def fragmentation(
    free: Sequence[float],
    shapes: Sequence[tuple[Shape, float]],
    *,
    models: Sequence[str] | None = None,
    cpu_milli: int | None = None,
    memory: int | None = None,
) -> float:
    """Expected fragmentation of one node whose devices have ``free`` shares (0..1), of
    GPU types ``models`` (one per device; None: any type may use any device), with
    ``cpu_milli`` and ``memory`` free (None: not a limit), under ``shapes`` (popularity
    summing to 1): the definition, one type at a time, each using what as many of its
    tasks as the host holds can use (``Workload`` computes the same from memoised
    factors)."""
    total_free = sum(free)
    if total_free <= EPS:
        return 0.0
    result = 0.0
    for shape, weight in shapes:
        tasks = tasks_held(len(free), cpu_milli, memory, shape.cpu_milli, shape.memory)
        if not tasks:
            result += weight * total_free  # the task does not fit the host at all
            continue
        allowed = free
        if models is not None:
            allowed = [f for f, m in zip(free, models, strict=True) if shape.allows(m)]
        used = usable(allowed, shape.devices, shape.fraction, tasks)
        result += weight * (total_free - used)
    return result


def shape_fraction(memory_fraction: float, core_fraction: float, exclusive: bool) -> float:
    """The share of one device a request takes, rounded to 1/100 (HAMi's percentages) so
    shapes stay few."""
    if exclusive:
        return 1.0
    raw = max(memory_fraction, core_fraction, 0.0)
    return min(1.0, max(0.01, round(raw * 100) / 100))


def request_share(r: DeviceRequest, card_mib: int) -> float:
    """The share of one card of ``card_mib`` MiB (0: unknown) a device request asks: its
    memory (MiB, else percent) or cores, whichever is more; a whole card if exclusive."""
    if r.memory_mib is not None and card_mib:
        memory = r.memory_mib / card_mib
    else:
        memory = (r.memory_percent or 0) / 100
    return shape_fraction(memory, r.cores / 100, r.exclusive)


def device_score(
    used_slots: int, slots: int, used_cores: int, total_cores: int, used_mem: int, total_mem: int
) -> float:
    """HAMi's device score after placement: higher is fuller."""
    score = used_slots / slots if slots else 0.0
    if total_cores:
        score += used_cores / total_cores
    if total_mem:
        score += used_mem / total_mem
    return score


def prefer_high(policy: Policy) -> bool:
    """True when the policy takes the fullest candidate (binpack), False for the emptiest."""
    return policy == "binpack"
