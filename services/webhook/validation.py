"""The webhook's validating decisions (no I/O): why a new pod or a Volcano Job is refused.

A pod of one of ``scheduler.names`` whose device request can never be placed is refused
with the message the watcher would put in its Event; any pod that carries a grant
annotation at creation (Tessera's ``tessera.io/grant`` and its companions, or HAMi's and
Volcano's assignment keys) is refused: only the binder writes them, through the
Binding. A Volcano Job (``batch.volcano.sh/v1alpha1``) whose ``schedulerName`` (default
``volcano``) is one of ``scheduler.names`` is refused at creation when Volcano's
admission would refuse it (shared/core/vcjob.py, and its queue missing while others
exist, not Open, ``root`` or not a leaf), and at an update that changes more than
Volcano lets change or breaks a rule the Job kept. A Volcano Queue is refused at creation
or update when a quantity in its deserved, guarantee or capability is not one or is
negative, when its guarantee or deserved is above its capability, and under
``scheduler.queuePlugin: capacity`` when its parent does not exist or would close a cycle
(shared/core/hierarchy.py: the coordinator would refuse its subtree). A Volcano PodGroup
is refused at creation or update when an entry of its ``subGroupPolicy`` breaks a rule
(a ``subGroupSize`` below 1, a negative ``minSubGroups``, a malformed ``labelSelector``:
shared/core/subgroups.py), naming the field.
"""

from __future__ import annotations

from typing import Any

from shared.config import Config
from shared.core import annotations as ann
from shared.core import network, subgroups, vcjob
from shared.core.claimed import name_error
from shared.core.hierarchy import TreeQueue, build
from shared.core.model import PodRequest
from shared.core.quantity import parse_quantity
from shared.core.request import RequestParser, rejection

GRANT_KEYS = frozenset(
    {ann.GRANT, ann.SIGNATURE, ann.NODE, ann.BIND_TIME}
    | {key for keys in ann.COMPAT_KEYS.values() for key in keys.values()}
)
"""Annotations only the scheduler writes (at bind time): a pod may not bring its own."""


def forged_annotations(pod: dict[str, Any]) -> list[str]:
    """The scheduler-only annotations a new pod carries."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return sorted(k for k in annotations if k in GRANT_KEYS)


def is_job(request: dict[str, Any]) -> bool:
    """Is the AdmissionReview request about a Volcano Job?"""
    kind = request.get("kind") or {}
    return bool(kind.get("group") == "batch.volcano.sh" and kind.get("kind") == "Job")


def is_podgroup(request: dict[str, Any]) -> bool:
    """Is the AdmissionReview request about a Volcano PodGroup?"""
    kind = request.get("kind") or {}
    return bool(kind.get("group") == "scheduling.volcano.sh" and kind.get("kind") == "PodGroup")


def podgroup_refusal(
    podgroup: dict[str, Any],
    old: dict[str, Any] | None = None,
    hypernodes: dict[str, dict[str, Any]] | None = None,
) -> str | None:
    """Why a Volcano PodGroup (created, or updated from ``old``) is refused, or None: a
    ``spec.subGroupPolicy`` entry that breaks a rule (shared/core/subgroups.py), or a
    ``spec.networkTopology`` (or its annotations) that does (shared/core/network.py:
    both tier fields, a mode not hard or soft, a ``highestTierName`` that no HyperNode
    of ``hypernodes`` has, when they could be read and there are some). An update is
    refused only for a rule ``old`` kept (one that got in while the webhook was down
    may still be mended, or its other fields changed)."""
    errors = _policy_errors(podgroup, hypernodes)
    if old is not None:
        kept = {e.field for e in _policy_errors(old, hypernodes)}
        errors = [e for e in errors if e.field not in kept]
    return subgroups.refusal(errors) if errors else None


def _policy_errors(
    podgroup: dict[str, Any], hypernodes: dict[str, dict[str, Any]] | None = None
) -> list[vcjob.JobError]:
    spec = podgroup.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    errors = subgroups.read_policies(spec.get("subGroupPolicy"))[1]
    annotations = (podgroup.get("metadata") or {}).get("annotations") or {}
    topology, wrong = network.read_topology(spec.get("networkTopology"), annotations)
    errors += wrong
    if topology is not None and topology.highest_tier_name and hypernodes:
        names = {str((h.get("spec") or {}).get("tierName") or "") for h in hypernodes.values()}
        if topology.highest_tier_name not in names:
            known = ", ".join(sorted(n for n in names if n)) or "none"
            errors.append(
                vcjob.JobError(
                    f"{network.FIELD}.highestTierName",
                    f'"{topology.highest_tier_name}" is no HyperNode\'s tierName (known: {known})',
                )
            )
    return errors


def is_hypernode(request: dict[str, Any]) -> bool:
    """Is the AdmissionReview request about a Volcano HyperNode?"""
    kind = request.get("kind") or {}
    return bool(kind.get("group") == "topology.volcano.sh" and kind.get("kind") == "HyperNode")


def hypernode_refusal(
    hypernode: dict[str, Any], hypernodes: dict[str, dict[str, Any]] | None = None
) -> str | None:
    """Why a HyperNode is refused, or None: a field that breaks a rule, a member naming
    the HyperNode itself, or (with the other HyperNodes, when they could be read) a
    cycle it would close (shared/core/network.py)."""
    read, errors = network.read_hypernode(hypernode)
    if not errors and hypernodes is not None:
        others = [
            network.read_hypernode(h)[0] for name, h in hypernodes.items() if name != read.name
        ]
        fabric = network.build([*others, read], {})
        why = fabric.problems.get(read.name)
        if why is not None:
            errors.append(vcjob.JobError("spec.members", why))
    return network.refusal("HyperNode", errors) if errors else None


def is_queue(request: dict[str, Any]) -> bool:
    """Is the AdmissionReview request about a Volcano Queue?"""
    kind = request.get("kind") or {}
    return bool(kind.get("group") == "scheduling.volcano.sh" and kind.get("kind") == "Queue")


QUEUE_LISTS = ("deserved", "guarantee.resource", "capability")
"""A Queue's resource lists, under ``spec``."""


def queue_refusal(
    queue: dict[str, Any], queues: dict[str, dict[str, Any]] | None, capacity: bool
) -> str | None:
    """Why a Volcano Queue (created or updated) is refused, or None. ``queues``: every
    Queue by name (None: not read; the tree is not checked); ``capacity``: the tree is
    Tessera's (``scheduler.queuePlugin``)."""
    name = str((queue.get("metadata") or {}).get("name") or "")
    spec = queue.get("spec") or {}
    errors: list[vcjob.JobError] = []
    lists: dict[str, dict[str, tuple[str, float]]] = {}
    for where in QUEUE_LISTS:
        raw: Any = spec
        for part in where.split("."):
            raw = (raw or {}).get(part) if isinstance(raw, dict) else None
        lists[where] = {}
        for resource, value in (raw or {}).items() if isinstance(raw, dict) else ():
            at = f"spec.{where}.{resource}"
            if (wrong := name_error(str(resource))) is not None:
                errors.append(vcjob.JobError(at, wrong))
                continue
            try:
                amount = float(parse_quantity(value))
            except ValueError:
                errors.append(vcjob.JobError(at, f"{value!r} is not a quantity"))
                continue
            if amount < 0:
                errors.append(vcjob.JobError(at, f"{value} is negative"))
            lists[where][str(resource)] = (str(value), amount)
    for key in ("preemptMinRuntime", "reclaimMinRuntime"):
        text = spec.get(key)
        if text not in (None, "") and ((found := vcjob.duration_s(str(text))) is None or found < 0):
            errors.append(
                vcjob.JobError(f"spec.{key}", f"{text!r} is not a duration such as 30s or 10m")
            )
    capability = lists["capability"]
    for where in ("guarantee.resource", "deserved"):
        for resource, (value, amount) in lists[where].items():
            if resource in capability and amount > capability[resource][1]:
                errors.append(
                    vcjob.JobError(
                        f"spec.{where}.{resource}",
                        f"{value} is above the capability ({capability[resource][0]})",
                    )
                )
    if capacity and queues is not None and name:
        parents = {n: str((q.get("spec") or {}).get("parent") or "") for n, q in queues.items()}
        parents[name] = str(spec.get("parent") or "")
        tree = build(TreeQueue(name=n, parent=p) for n, p in parents.items())
        if name in tree.broken:
            errors.append(vcjob.JobError("spec.parent", tree.broken[name]))
    if not errors:
        return None
    return "invalid Volcano Queue: " + "; ".join(f"{e.field}: {e.message}" for e in errors)


def queue_errors(name: str, queues: dict[str, dict[str, Any]]) -> list[vcjob.JobError]:
    """Volcano's queue checks at a Job's creation: the queue exists (here: once any
    Queue does, as Tessera's scheduler reads queues), is Open, is not ``root`` and has
    no child queues."""
    where = "spec.queue"
    if name == "root":
        return [vcjob.JobError(where, "a Job may not be submitted to the root queue")]
    queue = queues.get(name)
    if queue is None:
        if not queues:
            return []
        return [vcjob.JobError(where, f'queue "{name}" does not exist; create it or name another')]
    state = (queue.get("status") or {}).get("state") or (queue.get("spec") or {}).get("state")
    if (state or "Open") != "Open":
        return [vcjob.JobError(where, f'queue "{name}" is {state}: only an Open queue takes Jobs')]
    children = sum(1 for q in queues.values() if (q.get("spec") or {}).get("parent") == name)
    if children:
        return [
            vcjob.JobError(
                where, f'queue "{name}" has {children} child queues: submit to a leaf queue'
            )
        ]
    return []


class Validation:
    """Why a new pod or a Volcano Job is refused; a part of service.py's ``Webhook``,
    which holds the config and the request parser."""

    cfg: Config
    parser: RequestParser

    def validate(self, pod: dict[str, Any]) -> str | None:
        """Why a new pod is refused, or None."""
        forged = forged_annotations(pod)
        if forged:
            return (
                f"annotation {', '.join(forged)} is written by the scheduler when it binds "
                "a pod; a pod may not carry it at creation"
            )
        if (pod.get("spec") or {}).get("schedulerName") not in self.cfg.scheduler.names:
            return None
        parsed = self.parser.parse(pod)
        if isinstance(parsed, PodRequest):
            return None
        return rejection(parsed)

    def validate_job(
        self,
        job: dict[str, Any],
        old: dict[str, Any] | None = None,
        queues: dict[str, dict[str, Any]] | None = None,
    ) -> str | None:
        """Why a Volcano Job (created, or updated from ``old``) is refused, or None.
        ``queues``: every Queue by name (None: not read; the queue is not checked)."""
        spec = job.get("spec") or {}
        if (spec.get("schedulerName") or vcjob.DEFAULT_SCHEDULER) not in self.cfg.scheduler.names:
            return None  # another controller's Job (Volcano's, beside it)
        name = (job.get("metadata") or {}).get("name") or ""
        errors = vcjob.check(name, spec)
        if old is not None:
            # An update may not change what Volcano keeps, nor break a rule the Job kept
            # (one made invalid while the webhook was down may still be fixed).
            kept = {e.field for e in vcjob.check(name, old.get("spec") or {})}
            errors = vcjob.check_update(old.get("spec") or {}, spec) + [
                e for e in errors if e.field not in kept
            ]
        elif queues is not None:
            errors += queue_errors(spec.get("queue") or vcjob.DEFAULT_QUEUE, queues)
        return vcjob.refusal(errors) if errors else None
