"""Gangs of gangs: a PodGroup's ``spec.subGroupPolicy`` (Volcano v1.14), read, matched,
shaped for the gang-coordinator and laid out for the allocator.

Each policy chooses pods of its PodGroup (``labelSelector``; none written: every pod)
and splits them into subgroups: the pods with equal values of its ``matchLabelKeys``
form one. A pod lacking one of those labels, or with an empty value, is in none of the
policy's subgroups, and a policy without keys forms none, as Volcano's scheduler reads
it. A pod belongs to the first policy that takes it; a pod no policy takes is a loose
member of the gang and counts toward ``minMember`` as before.

A subgroup is all-or-nothing: ``subGroupSize`` of its pods (its minAvailable, default 1)
are placed together or none is; its further pods are placed once it is whole, if they
fit. The gang goes once at least ``minSubGroups`` (default 0) whole subgroups of every
policy can go and ``minMember`` holds overall; more whole subgroups are placed if they
fit, never a partial one.

Who does what: the watcher and the webhook read the policies with
:func:`read_policies` (one reading, and errors that name the field); the coordinator
asks :func:`shape` whether a gang's subgroups let it go now, and :meth:`Shaped.admit`
which of them its queue takes (shared/core/gangs.py); :class:`SubGroups` travels in
``GangReady`` and ``Placer.place_gang`` places by it (shared/core/placement.py). A gang
whose PodGroup has no policy takes none of these paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from shared.core.hosts import EVERYTHING, NOTHING, Selector, label_selector
from shared.core.model import NonNegInt, PodRef, PodUID, PosInt
from shared.core.queues import Resources, add
from shared.core.vcjob import JobError, whole_field

FIELD = "spec.subGroupPolicy"
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class SubGroupPolicy(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One entry of a PodGroup's ``spec.subGroupPolicy``, as the watcher read it."""

    name: str
    size: PosInt = 1
    """``subGroupSize``: pods per subgroup, placed together (nil: 1)."""
    min_subgroups: NonNegInt = 0
    """``minSubGroups``: whole subgroups the gang needs to start (nil: 0)."""
    selector: Selector = EVERYTHING
    """``labelSelector``: the pods it chooses (none written: every pod of the group)."""
    match_label_keys: tuple[str, ...] = ()
    """``matchLabelKeys``: pods with equal values of these labels form one subgroup."""

    def subgroup(self, labels: Mapping[str, str]) -> str | None:
        """The subgroup a pod with ``labels`` is in under this policy (``name/value...``),
        or None when the policy does not take it."""
        if not self.match_label_keys or not self.selector.matches(labels):
            return None
        values = [labels.get(key) or "" for key in self.match_label_keys]
        if not all(values):
            return None
        return "/".join((self.name, *values))


def subgroup_of(
    policies: Sequence[SubGroupPolicy], labels: Mapping[str, str]
) -> tuple[SubGroupPolicy, str] | None:
    """The first policy that takes a pod with ``labels``, and its subgroup there."""
    for policy in policies:
        found = policy.subgroup(labels)
        if found is not None:
            return policy, found
    return None


# --- reading -------------------------------------------------------------------------


def read_policies(raw: Any) -> tuple[tuple[SubGroupPolicy, ...], list[JobError]]:
    """``spec.subGroupPolicy`` as written, and every rule it breaks, each naming its field
    (the webhook refuses the PodGroup with them; the watcher passes them on, and its
    pods are told). Never raises: a broken entry is read as best it can be (a size
    below 1 as 1, a malformed selector as choosing no pod)."""
    errors: list[JobError] = []

    def err(where: str, message: str) -> None:
        errors.append(JobError(where, message))

    if raw is None:
        return (), errors
    if not isinstance(raw, list):
        err(FIELD, "must be a list")
        return (), errors
    policies: list[SubGroupPolicy] = []
    names: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"{FIELD}[{i}]"
        if not isinstance(entry, dict):
            err(where, "must be an object")
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            err(f"{where}.name", "required")
            name = str(name or i)
        elif name in names:
            err(f"{where}.name", f'"{name}" names another policy too')
        elif "/" in name:  # a subgroup is named "<policy>/<label values>"
            err(f"{where}.name", f'"{name}": a policy name has no "/"')
        names.add(name)
        size = whole_field(entry.get("subGroupSize"), f"{where}.subGroupSize", 1, err)
        least = whole_field(entry.get("minSubGroups"), f"{where}.minSubGroups", 0, err)
        selector = read_selector(entry.get("labelSelector"), f"{where}.labelSelector", err)
        keys = entry.get("matchLabelKeys")
        if keys is not None and not (
            isinstance(keys, list) and all(isinstance(k, str) and k for k in keys)
        ):
            err(f"{where}.matchLabelKeys", "must be a list of label keys")
            keys = None
        policies.append(
            SubGroupPolicy(
                name=name,
                size=size or 1,
                min_subgroups=least or 0,
                selector=selector,
                match_label_keys=tuple(keys or ()),
            )
        )
    return tuple(policies), errors


def read_selector(raw: Any, where: str, err: Callable[[str, str], None]) -> Selector:
    """A ``metav1.LabelSelector`` (none written: every pod); a malformed one is reported
    and chooses no pod."""
    if raw is None:
        return EVERYTHING
    broken = False

    def report(at: str, message: str) -> None:
        nonlocal broken
        broken = True
        err(at, message)

    if not isinstance(raw, dict):
        report(where, "must be an object")
        return NOTHING
    labels = raw.get("matchLabels")
    if labels is not None and not (
        isinstance(labels, dict)
        and all(isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items())
    ):
        report(f"{where}.matchLabels", "must map label keys to values")
    expressions = raw.get("matchExpressions")
    if expressions is not None and not isinstance(expressions, list):
        report(f"{where}.matchExpressions", "must be a list")
        expressions = []
    for j, e in enumerate(expressions or ()):
        at = f"{where}.matchExpressions[{j}]"
        if not isinstance(e, dict) or not isinstance(e.get("key"), str) or not e.get("key"):
            report(at, "needs a key")
            continue
        op, values = e.get("operator"), e.get("values")
        if op not in SELECTOR_OPERATORS:
            report(f"{at}.operator", f"{op!r} is not one of {', '.join(SELECTOR_OPERATORS)}")
        elif values is not None and not (
            isinstance(values, list) and all(isinstance(v, str) for v in values)
        ):
            report(f"{at}.values", "must be a list of strings")
        elif op in ("In", "NotIn") and not values:
            report(f"{at}.values", f"must not be empty for {op}")
        elif op in ("Exists", "DoesNotExist") and values:
            report(f"{at}.values", f"must be empty for {op}")
    return NOTHING if broken else label_selector(raw)


def refusal(errors: Sequence[JobError]) -> str:
    """What a user is told of a PodGroup whose policies break a rule: by the webhook (the
    refusal ``kubectl apply`` prints) and on its pods."""
    return "invalid PodGroup: " + "; ".join(f"{e.field}: {e.message}" for e in errors)


# --- the coordinator: may the gang go, and with what ---------------------------------


class Waiting(Protocol):
    """What :func:`shape` reads of a pod of the gang (shared/core/gangs.py ``Member``)."""

    pod: PodRef
    labels: Mapping[str, str]
    vector: Resources


M = TypeVar("M", bound=Waiting)


@dataclass(frozen=True, slots=True)
class Part(Generic[M]):
    """One subgroup with pods to place now: the first ``need`` of ``pods`` go together
    (0: it is whole already), the rest each if they fit."""

    name: str
    policy: str
    need: int
    pods: tuple[M, ...]


@dataclass(frozen=True, slots=True)
class Shaped(Generic[M]):
    """A gang its subgroups let go now: its subgroups and loose pods to offer, and how
    many subgroups of each policy must still be placed whole."""

    parts: tuple[Part[M], ...]
    loose: tuple[M, ...]
    required: Mapping[str, int]

    @property
    def members(self) -> list[M]:
        """Every pod that may be sent: each subgroup's, then the loose ones."""
        return [*(m for p in self.parts for m in p.pods), *self.loose]

    def admit(self, fits: Callable[[Resources], bool]) -> tuple[list[M], Resources, SubGroups]:
        """What the queue ``fits`` of the gang, whole subgroups only (each subgroup's
        first ``need`` pods as one), then loose pods, then the further pods of the
        subgroups taken, each alone: the pods, what they need together, and their
        layout. The caller checks ``minMember`` and :meth:`SubGroups.short`."""
        taken: list[M] = []
        need: Resources = {}

        def take(unit: Iterable[M]) -> bool:
            nonlocal need
            more = need
            pods = list(unit)
            for m in pods:
                more = add(more, m.vector)
            if not fits(more):
                return False
            taken.extend(pods)
            need = more
            return True

        whole = []  # the subgroups taken (or whole already): only theirs go further
        for p in self.parts:
            if p.need == 0 or take(p.pods[: p.need]):
                whole.append(p)
        for m in self.loose:
            take((m,))
        laid = []
        for p in whole:
            more = [m for m in p.pods[p.need :] if take((m,))]
            pods = (*p.pods[: p.need], *more)
            laid.append(SubGroup(name=p.name, policy=p.policy, need=p.need, pods=_uids(pods)))
        return taken, need, SubGroups(subgroups=tuple(laid), required=dict(self.required))


def _uids(pods: Iterable[Waiting]) -> tuple[PodUID, ...]:
    return tuple(m.pod.uid for m in pods)


def shape(
    policies: Sequence[SubGroupPolicy],
    pending: Sequence[M],
    settled: Iterable[Waiting],
    known: Callable[[], Iterable[Waiting]],
) -> Shaped[M] | str | None:
    """Whether a gang's subgroups let it go now: what to offer (pods of subgroups that
    cannot be whole yet left out), or why not: a message when a policy cannot reach its
    ``minSubGroups`` with every pod of the group that exists (``known()``, asked only
    then), None when it waits for pods in flight or parked. ``pending`` in the order to
    offer them; ``settled``: the group's pods placed or bound."""
    grouped: dict[str, tuple[SubGroupPolicy, list[M]]] = {}
    loose: list[M] = []
    for m in pending:
        found = subgroup_of(policies, m.labels)
        if found is None:
            loose.append(m)
        else:
            grouped.setdefault(found[1], (found[0], []))[1].append(m)
    held = _count(policies, settled)
    whole = _whole(policies, held)
    parts: list[Part[M]] = []
    can = dict(whole)
    for name, (policy, pods) in grouped.items():
        need = max(policy.size - held.get(name, (policy, 0))[1], 0)
        if len(pods) >= need:
            parts.append(Part(name=name, policy=policy.name, need=need, pods=tuple(pods)))
            if need:
                can[policy.name] += 1
    short = [p for p in policies if can[p.name] < p.min_subgroups]
    if short:
        return _why_short(short, _whole(policies, _count(policies, known())))
    parts.sort(key=lambda p: p.need == 0)  # subgroups to complete first, in pod order
    required = {p.name: max(p.min_subgroups - whole[p.name], 0) for p in policies}
    return Shaped(parts=tuple(parts), loose=tuple(loose), required=required)


def _count(
    policies: Sequence[SubGroupPolicy], pods: Iterable[Waiting]
) -> dict[str, tuple[SubGroupPolicy, int]]:
    """How many of ``pods`` each subgroup has, and its policy."""
    counts: dict[str, tuple[SubGroupPolicy, int]] = {}
    for m in pods:
        found = subgroup_of(policies, m.labels)
        if found is not None:
            policy, name = found
            counts[name] = (policy, counts.get(name, (policy, 0))[1] + 1)
    return counts


def _whole(
    policies: Sequence[SubGroupPolicy], counts: Mapping[str, tuple[SubGroupPolicy, int]]
) -> dict[str, int]:
    """Per policy, how many subgroups have at least ``subGroupSize`` pods in ``counts``."""
    whole = {p.name: 0 for p in policies}
    for policy, n in counts.values():
        if n >= policy.size:
            whole[policy.name] += 1
    return whole


def _why_short(short: list[SubGroupPolicy], whole: Mapping[str, int]) -> str | None:
    """Why policies in ``short`` cannot have their ``minSubGroups``, ``whole``: the whole
    subgroups of each with every pod that exists; None when they could (some are in
    flight or parked: they wait)."""
    said = []
    for p in short:
        n = whole[p.name]
        if n >= p.min_subgroups:
            continue
        said.append(
            f'subGroupPolicy "{p.name}": {n} whole subgroup{_s(n)} of {p.size} '
            f"pod{_s(p.size)} exist{'s' if n == 1 else ''}, minSubGroups is {p.min_subgroups}"
        )
    if not said:
        return None
    return "; ".join(said) + ": the PodGroup's pods wait until enough subgroups are whole"


def _s(n: int) -> str:
    return "" if n == 1 else "s"


# --- the allocator: the layout a gang is placed by -----------------------------------


class SubGroup(msgspec.Struct, frozen=True, kw_only=True):
    """One subgroup of a gang sent for placement."""

    name: str
    """``<policy>/<matchLabelKeys values>``."""
    policy: str
    need: NonNegInt
    """How many of ``pods`` (the first) go together: ``subGroupSize`` less its pods
    placed or bound already; 0: it is whole, each of its pods goes if it fits."""
    pods: tuple[PodUID, ...]


class SubGroups(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How a gang's pods form subgroups (``GangReady.subgroups``); a pod in none is loose."""

    subgroups: tuple[SubGroup, ...] = ()
    required: dict[str, NonNegInt] = msgspec.field(default_factory=dict)
    """Per policy, how many of its subgroups must still be placed whole."""

    def short(self) -> str | None:
        """The first policy with fewer subgroups to place whole than it requires."""
        for policy, least in self.required.items():
            whole = sum(1 for s in self.subgroups if s.policy == policy and s.need)
            if whole < least:
                return policy
        return None
