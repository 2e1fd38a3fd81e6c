"""PodDisruptionBudgets as preemption reads them: how many disruptions each allows now,
and which victims it covers.

kube-scheduler's DefaultPreemption reads each PDB's ``status.disruptionsAllowed`` and
``status.disruptedPods``, which kube-controller-manager's disruption controller writes.
A cluster without that controller (the local test cluster without a real node) has no
such status, so Tessera computes it from the spec the way the controller does
(:func:`allowed`), and takes the status instead when it is current
(``status.observedGeneration`` equals ``metadata.generation``):

- *healthy*: pods the selector matches that are Ready, not being deleted and not in
  ``status.disruptedPods`` (evictions the API server granted but the controller has not
  seen yet);
- ``minAvailable`` as a number: that many must stay healthy, counted against every pod
  the selector matches; ``minAvailable`` as a percentage, and ``maxUnavailable`` either
  way, scale the pods that have a controller (the controller sums its controllers'
  replicas; Tessera counts their pods: a workload being scaled is counted as it is now);
  a percentage is rounded up;
- allowed = healthy - desired healthy, never below 0, and 0 when no pod counts (a PDB
  matching only bare pods with ``maxUnavailable`` allows nothing, as the controller
  says).

:class:`Budgets` keeps those counts as pods and PDBs change (the watcher owns one), so a
pod event costs one update per PDB of its namespace. A :class:`Budget` is what travels
on the bus; :meth:`Budget.covers` is kube-scheduler's rule for a victim: a pod with
labels, in the PDB's namespace, that a non-empty selector matches and that is not
already in ``disruptedPods``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.core.hosts import Selector, label_selector
from shared.core.model import PodUID

_PERCENT = re.compile(r"[+-]?[0-9]+%")


class Budget(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A PodDisruptionBudget as preemption reads it: which pods it covers and how many
    of them may be disrupted now."""

    namespace: str
    name: str
    selector: Selector
    allowed: int = 0
    """Disruptions it allows now (``status.disruptionsAllowed``, or computed)."""
    disrupted: tuple[str, ...] = ()
    """``status.disruptedPods``: pods already counted against it."""
    computed: bool = False
    """``allowed`` was computed from the spec (no current status)."""

    @property
    def key(self) -> str:
        """``namespace/name``: how victims and messages name it."""
        return f"{self.namespace}/{self.name}"

    def covers(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        """Does evicting this pod count against the budget? kube-scheduler's rule: a pod
        without labels matches no PDB, an empty or nil selector matches nothing, and a
        pod in ``disruptedPods`` is counted already."""
        return (
            bool(labels)
            and namespace == self.namespace
            and not self.selector.everything
            and self.selector.matches(labels)
            and name not in self.disrupted
        )


class BudgetSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`allowed` reads of one PodDisruptionBudget object."""

    namespace: str
    name: str
    selector: Selector
    """The selector as the disruption controller reads it (``{}``: every pod)."""
    min_available: int | str | None = None
    max_unavailable: int | str | None = None
    status_allowed: int | None = None
    """``status.disruptionsAllowed`` when the status is current, else None."""
    disrupted: tuple[str, ...] = ()


def read_budget(obj: Mapping[str, Any]) -> BudgetSpec:
    """A ``policy/v1`` PodDisruptionBudget; KeyError, TypeError or ValueError when it is
    not shaped as its schema says."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    observed = status.get("observedGeneration")
    current = observed is not None and observed == meta.get("generation")
    return BudgetSpec(
        namespace=str(meta["namespace"]),
        name=str(meta["name"]),
        selector=label_selector(spec.get("selector")),
        min_available=_int_or_percent(spec.get("minAvailable")),
        max_unavailable=_int_or_percent(spec.get("maxUnavailable")),
        status_allowed=int(status.get("disruptionsAllowed") or 0) if current else None,
        disrupted=tuple(sorted(str(n) for n in status.get("disruptedPods") or {})),
    )


def _int_or_percent(value: Any) -> int | str | None:
    if value is None or isinstance(value, int | str):
        return value
    raise TypeError(f"not an int or a percentage: {value!r}")


def scaled(value: int | str, total: int) -> int | None:
    """An int-or-percent against ``total``, a percentage rounded up (as the disruption
    controller scales it); None when it is neither."""
    if isinstance(value, int):
        return value
    if not _PERCENT.fullmatch(value):
        return None
    percent = int(value[:-1])
    return -(-percent * total // 100)


def allowed(spec: BudgetSpec, pods: int, managed: int, healthy: int) -> int:
    """Disruptions the budget allows with ``pods`` matched, ``managed`` of them with a
    controller and ``healthy`` of them healthy (see the module doc); a current status
    wins. A value that cannot be scaled allows nothing (the controller cannot compute
    it either)."""
    if spec.status_allowed is not None:
        return spec.status_allowed
    expected, desired = 0, 0
    if spec.max_unavailable is not None:
        expected = managed
        most = scaled(spec.max_unavailable, expected)
        if most is None:
            return 0
        desired = max(expected - most, 0)
    elif isinstance(spec.min_available, int):
        expected, desired = pods, spec.min_available
    elif spec.min_available is not None:
        expected = managed
        least = scaled(spec.min_available, expected)
        if least is None:
            return 0
        desired = least
    free = healthy - desired
    return free if expected > 0 and free > 0 else 0


@dataclass(frozen=True, slots=True)
class Counted:
    """One pod as a PodDisruptionBudget counts it."""

    name: str
    labels: Mapping[str, str]
    ready: bool = False
    deleting: bool = False
    managed: bool = False
    """It has a controller (an ``ownerReference`` with ``controller: true``)."""


def counted(obj: Mapping[str, Any]) -> Counted:
    """A pod object as the disruption controller counts it: Ready (the ``Ready``
    condition is True), being deleted, controlled."""
    meta = obj["metadata"]
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return Counted(
        name=str(meta["name"]),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        deleting=bool(meta.get("deletionTimestamp")),
        managed=any(o.get("controller") for o in meta.get("ownerReferences") or ()),
    )


Key = tuple[str, str]
"""A budget's namespace and name."""


class Budgets:
    """Every PodDisruptionBudget with the pods it counts, kept as pods and budgets
    change; each change answers the budgets whose :class:`Budget` changed with it."""

    def __init__(self) -> None:
        self.specs: dict[Key, BudgetSpec] = {}
        self.pods: dict[str, dict[PodUID, Counted]] = {}
        """Every pod by namespace (a budget created later counts them at once)."""
        self.tally: dict[Key, list[int]] = {}
        """Per budget: pods matched, those with a controller, those healthy."""
        self.by_namespace: dict[str, set[Key]] = {}
        self.current: dict[Key, Budget] = {}
        """What each budget was last answered as."""

    def set_budget(self, spec: BudgetSpec) -> Budget | None:
        """A budget was created or changed; its new reading if that changed."""
        key = (spec.namespace, spec.name)
        old = self.specs.get(key)
        self.specs[key] = spec
        self.by_namespace.setdefault(spec.namespace, set()).add(key)
        if old is None or (old.selector, old.disrupted) != (spec.selector, spec.disrupted):
            tally = [0, 0, 0]
            for pod in self.pods.get(spec.namespace, {}).values():
                _count(tally, spec, pod, 1)
            self.tally[key] = tally
        return self._read(key)

    def remove_budget(self, namespace: str, name: str) -> bool:
        """A budget was deleted; True if it was known."""
        key = (namespace, name)
        if self.specs.pop(key, None) is None:
            return False
        self.tally.pop(key, None)
        self.current.pop(key, None)
        self.by_namespace.get(namespace, set()).discard(key)
        return True

    def set_pod(self, namespace: str, uid: PodUID, pod: Counted | None) -> list[Budget]:
        """A pod changed (None: it is gone or finished); the budgets it changed."""
        here = self.pods.setdefault(namespace, {})
        old = here.pop(uid, None) if pod is None else here.get(uid)
        if pod is not None:
            here[uid] = pod
        if old == pod:
            return []
        changed = []
        for key in self.by_namespace.get(namespace, ()):
            spec, tally = self.specs[key], self.tally[key]
            if old is not None:
                _count(tally, spec, old, -1)
            if pod is not None:
                _count(tally, spec, pod, 1)
            if (budget := self._read(key)) is not None:
                changed.append(budget)
        return changed

    def keep_only(self, present: Iterable[PodUID]) -> list[Budget]:
        """After a full list of pods: forget those it lacks; the budgets that changed."""
        keep = set(present)
        changed: dict[Key, Budget] = {}
        for namespace, here in self.pods.items():
            for uid in [u for u in here if u not in keep]:
                for budget in self.set_pod(namespace, uid, None):
                    changed[(budget.namespace, budget.name)] = budget
        return list(changed.values())

    def _read(self, key: Key) -> Budget | None:
        spec, (pods, managed, healthy) = self.specs[key], self.tally[key]
        budget = Budget(
            namespace=spec.namespace,
            name=spec.name,
            selector=spec.selector,
            allowed=allowed(spec, pods, managed, healthy),
            disrupted=spec.disrupted,
            computed=spec.status_allowed is None,
        )
        if self.current.get(key) == budget:
            return None
        self.current[key] = budget
        return budget


def _count(tally: list[int], spec: BudgetSpec, pod: Counted, sign: int) -> None:
    if not spec.selector.matches(pod.labels):
        return
    tally[0] += sign
    tally[1] += sign * pod.managed
    healthy = pod.ready and not pod.deleting and pod.name not in spec.disrupted
    tally[2] += sign * healthy
