"""Volcano Jobs (``batch.volcano.sh/v1alpha1``) as Volcano admits them: the rules a Job
must keep, the spec with Volcano's defaults, and which lifecycle policy answers an event.

:func:`check` finds every rule a Job breaks, each error naming its field: the rules of
Volcano's admission webhook (``pkg/webhooks/admission/jobs/validate``), of the
validating admission policy and CRD schema it ships beside it (types, minimums, name
formats), and the part of Kubernetes' pod template validation a Job's pods would fail at
creation. The webhook refuses such a Job (services/webhook) and the job-controller never
acts on one that got in while the webhook was down (services/job_controller). Checks
that read the cluster (the queue exists and is open) are the webhook's own.

:func:`read` gives a valid Job's spec with the defaults Volcano's mutating webhook
writes (queue ``default``, ``maxRetry`` 3, task names ``default<i>``, a task's
``minAvailable`` its replicas, the Job's the sum of its tasks'), read when used rather
than written into the object. Pure: values in, values out.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core.quantity import parse_quantity

# --- what Volcano accepts ----------------------------------------------------------------

ANY_EVENT = "*"
POLICY_EVENTS = (
    ANY_EVENT,
    "PodFailed",
    "PodEvicted",
    "PodPending",
    "Unknown",
    "TaskCompleted",
    "TaskFailed",
    "JobUpdated",
)
"""The events a policy may name (Volcano's internal ones, ``OutOfSync``,
``CommandIssued`` and ``PodRunning``, are refused)."""
POLICY_ACTIONS = (
    "AbortJob",
    "RestartJob",
    "RestartTask",
    "RestartPod",
    "RestartPartition",
    "TerminateJob",
    "CompleteJob",
    "ResumeJob",
)
"""The actions a policy may take (``SyncJob``, ``EnqueueJob`` and the queue actions are
Volcano's internal ones)."""
PLUGINS = ("env", "svc", "ssh", "tensorflow", "mpi", "pytorch", "ray", "hcclrank")
"""The Job plugins Volcano's controller knows; any other name is refused."""
FRAMEWORKS_NEEDING_SVC = ("tensorflow", "mpi", "pytorch", "ray")
"""Plugins that Volcano's mutating webhook gives the ``svc`` plugin (and ``mpi`` the
``ssh`` plugin) when the Job does not name it."""
TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
RESTART_POLICIES = ("Always", "OnFailure", "Never")
DEFAULT_QUEUE = "default"
DEFAULT_SCHEDULER = "volcano"
DEFAULT_MAX_RETRY = 3
"""A Job's and a task's ``maxRetry`` when it names none (or 0), as Volcano's webhook."""
DEFAULT_TASK = "default"
"""A task without a name is ``default<index>``."""
INT32_MAX = 2**31 - 1

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
_UNITS_S["h"] = 3600.0


Report = Callable[[str, str], None]
"""Where a check reports a broken rule: ``(field, message)``."""


@dataclass(frozen=True)
class JobError:
    """A rule a Job breaks: the field (``spec.tasks[1].minAvailable``) and why."""

    field: str
    message: str


def refusal(errors: Sequence[JobError]) -> str:
    """What a user is told of an invalid Job, by the webhook (the refusal ``kubectl
    apply`` prints) and the job-controller (its Event and the Job's state) alike."""
    return "invalid Volcano Job: " + "; ".join(f"{e.field}: {e.message}" for e in errors)


# --- the spec with Volcano's defaults ----------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """A lifecycle policy: on one of ``events`` (or a container exit code), ``action``,
    at once or after ``timeout_s``."""

    action: str
    events: frozenset[str] = frozenset()
    exit_code: int | None = None
    timeout_s: float | None = None


@dataclass(frozen=True)
class Task:
    """One task of a Job with Volcano's defaults: its pods' template, replicas, minimum, and
    lifecycle policies."""

    name: str
    replicas: int
    min_available: int
    """Volcano's default: the replicas."""
    template: Mapping[str, Any]
    policies: tuple[Policy, ...] = ()
    max_retry: int = DEFAULT_MAX_RETRY
    """How many container restarts of its running pods make ``TaskFailed``."""
    depends_on: tuple[str, ...] = ()
    any_dependency: bool = False
    """``dependsOn.iteration: any``: one of ``depends_on`` ready is enough (else all)."""
    partition_size: int = 0
    """``partitionPolicy.partitionSize`` (0: none): ``RestartPartition`` restarts the
    pods whose index falls in the same partition."""
    min_partitions: int = 0
    """``partitionPolicy.minPartitions``: the whole partitions its gang needs (the
    PodGroup's ``minSubGroups`` for this task)."""
    topology_policy: str = ""
    """``topologyPolicy``: the NUMA policy its pods are annotated with."""

    def pod_name(self, job: str, index: int) -> str:
        """The name of this task's pod ``index`` of Job ``job``."""
        return pod_name(job, self.name, index)

    def partition(self, index: int) -> int | None:
        """The partition of its pod ``index`` (None: the task has no ``partitionPolicy``)."""
        return index // self.partition_size if self.partition_size > 0 else None


@dataclass(frozen=True)
class Volume:
    """A volume of a Job: an existing claim by name, or the spec of one the controller makes."""

    mount_path: str
    claim_name: str
    """An existing PersistentVolumeClaim's name; '' when ``claim`` asks for a new one."""
    claim: Mapping[str, Any] | None = None
    """The spec of the claim the controller makes for the Job."""


@dataclass(frozen=True)
class JobSpec:
    """A valid Job's spec as Volcano's controller reads it (defaults applied)."""

    tasks: tuple[Task, ...]
    min_available: int
    scheduler_name: str = DEFAULT_SCHEDULER
    queue: str = DEFAULT_QUEUE
    max_retry: int = DEFAULT_MAX_RETRY
    min_success: int | None = None
    ttl_s: int | None = None
    priority_class: str = ""
    plugins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Plugin name -> its arguments, with the plugins Volcano's webhook adds."""
    policies: tuple[Policy, ...] = ()
    volumes: tuple[Volume, ...] = ()
    network_topology: Mapping[str, Any] | None = None
    """``spec.networkTopology`` as written: its PodGroup gets it (shared/core/network.py)."""

    @property
    def replicas(self) -> int:
        """Pods of every task together."""
        return sum(t.replicas for t in self.tasks)

    @property
    def task_min_available(self) -> int:
        """The sum of the tasks' ``minAvailable``."""
        return sum(t.min_available for t in self.tasks)

    def task(self, name: str) -> Task | None:
        """The task of that name, or None."""
        return next((t for t in self.tasks if t.name == name), None)


def pod_name(job: str, task: str, index: int) -> str:
    """A Job's pod: ``<job>-<task>-<index>``, as Volcano names it."""
    return f"{job}-{task}-{index}"


def task_name(task: Mapping[str, Any], index: int) -> str:
    """A task's name, or ``default<index>`` when it has none, as Volcano names it."""
    name = task.get("name")
    return name if isinstance(name, str) and name else f"{DEFAULT_TASK}{index}"


def read(spec: Mapping[str, Any], default_scheduler: str = DEFAULT_SCHEDULER) -> JobSpec:
    """A Job's spec with Volcano's defaults; ``spec`` must pass :func:`check`."""
    tasks = []
    for i, raw in enumerate(_list(spec.get("tasks"))):
        replicas = _int(raw.get("replicas"))
        partition = raw.get("partitionPolicy") or {}
        depends = raw.get("dependsOn") or {}
        tasks.append(
            Task(
                name=task_name(raw, i),
                replicas=replicas,
                min_available=_int(raw.get("minAvailable"), replicas),
                template=raw.get("template") or {},
                policies=_policies(raw.get("policies")),
                max_retry=_int(raw.get("maxRetry")) or DEFAULT_MAX_RETRY,
                depends_on=tuple(_list(depends.get("name"))),
                any_dependency=depends.get("iteration") == "any",
                partition_size=_int(partition.get("partitionSize")),
                min_partitions=_int(partition.get("minPartitions")),
                topology_policy=str(raw.get("topologyPolicy") or ""),
            )
        )
    plugins = {
        str(k): tuple(str(a) for a in _list(v)) for k, v in _map(spec.get("plugins")).items()
    }
    if any(p in plugins for p in FRAMEWORKS_NEEDING_SVC):
        plugins.setdefault("svc", ())
    if "mpi" in plugins:
        plugins.setdefault("ssh", ())
    volumes = tuple(
        Volume(
            mount_path=str(v.get("mountPath") or ""),
            claim_name=str(v.get("volumeClaimName") or ""),
            claim=v.get("volumeClaim"),
        )
        for v in _list(spec.get("volumes"))
    )
    return JobSpec(
        tasks=tuple(tasks),
        min_available=_int(spec.get("minAvailable")) or sum(t.min_available for t in tasks),
        scheduler_name=str(spec.get("schedulerName") or default_scheduler),
        queue=str(spec.get("queue") or DEFAULT_QUEUE),
        max_retry=_int(spec.get("maxRetry")) or DEFAULT_MAX_RETRY,
        min_success=spec.get("minSuccess"),
        ttl_s=spec.get("ttlSecondsAfterFinished"),
        priority_class=str(spec.get("priorityClassName") or ""),
        plugins=plugins,
        policies=_policies(spec.get("policies")),
        volumes=volumes,
        network_topology=_map(spec.get("networkTopology")) or None,
    )


def _policies(raw: Any) -> tuple[Policy, ...]:
    out = []
    for p in _list(raw):
        events = {str(e) for e in _list(p.get("events"))}
        if p.get("event"):
            events.add(str(p["event"]))
        timeout = p.get("timeout")
        out.append(
            Policy(
                action=str(p.get("action") or ""),
                events=frozenset(events),
                exit_code=p.get("exitCode"),
                timeout_s=duration_s(timeout) if isinstance(timeout, str) and timeout else None,
            )
        )
    return tuple(out)


def plugin_flags(args: Sequence[str]) -> dict[str, str]:
    """A plugin's arguments (``--master=leader``, ``--port 2222``, ``--flag``) as Go's
    flag package reads them: name -> value, ``true`` for a bare flag."""
    out: dict[str, str] = {}
    words = [w for a in args for w in (shlex.split(a) if " " in a else [a])]
    i = 0
    while i < len(words):
        word = words[i].lstrip("-")
        if not words[i].startswith("-") or not word:
            break  # Go stops at the first non-flag argument
        name, eq, value = word.partition("=")
        if not eq:
            following = words[i + 1] if i + 1 < len(words) else ""
            if following and not following.startswith("-"):
                value, i = following, i + 1
            else:
                value = "true"
        out[name] = value
        i += 1
    return out


# --- the rules ---------------------------------------------------------------------------


def check(name: str, spec: Mapping[str, Any]) -> list[JobError]:
    """Every rule the Job ``name`` with ``spec`` breaks, in field order (empty: valid).

    Each check says which of Volcano's it follows; where Volcano stops at the first
    broken rule of a kind, this goes on, so a user fixes all at once.
    """
    errors: list[JobError] = []

    def err(where: str, message: str) -> None:
        errors.append(JobError(where, message))

    # The Job's own name (webhook: validateJobName, IsQualifiedName).
    if not _qualified(name):
        err(
            "metadata.name",
            f"{name!r} is not a valid qualified name (at most 63 "
            "characters: letters, digits, '-', '_' or '.', starting and ending with a "
            "letter or digit)",
        )
    # The CRD schema's types and minimums (minAvailable >= 0, maxRetry >= 0, minSuccess
    # >= 1, ttlSecondsAfterFinished >= 0), as the validating admission policy repeats.
    whole = {
        key: whole_field(spec.get(key), f"spec.{key}", least, err)
        for key, least in (
            ("minAvailable", 0),
            ("maxRetry", 0),
            ("minSuccess", 1),
            ("ttlSecondsAfterFinished", 0),
        )
    }
    for key in ("queue", "priorityClassName"):  # CRD schema: DNS subdomains
        value = spec.get(key)
        if value not in (None, "") and not (isinstance(value, str) and _subdomain(value)):
            err(f"spec.{key}", f"{value!r} must be a lowercase DNS subdomain (RFC 1123)")
    scheduler = spec.get("schedulerName")
    if scheduler is not None and not (isinstance(scheduler, str) and len(scheduler) <= 63):
        err("spec.schedulerName", "must be a string of at most 63 characters")
    raw_tasks = spec.get("tasks")
    if raw_tasks is not None and not isinstance(raw_tasks, list):
        err("spec.tasks", "must be a list of tasks")
        raw_tasks = []
    tasks = [t for t in raw_tasks or [] if isinstance(t, dict)]
    if len(tasks) != len(raw_tasks or []):
        err("spec.tasks", "every task must be an object")
    if not tasks:  # webhook: "No task specified in job spec"
        err("spec.tasks", "no task specified: a Job needs at least one task")
    seen: set[str] = set()
    total = 0
    names = [task_name(t, i) for i, t in enumerate(tasks)]
    for i, task in enumerate(tasks):
        where, tname = f"spec.tasks[{i}]", names[i]
        if "name" in task and not isinstance(task["name"], str):
            err(f"{where}.name", "must be a string")
        elif not _label(tname):  # CRD schema and policy: a DNS-1123 label
            err(
                f"{where}.name",
                f"{tname!r} must be a lowercase DNS-1123 label (at most 63 "
                "characters: a-z, 0-9 and '-', starting and ending with a letter or digit)",
            )
        if tname in seen:  # webhook and policy: task names are unique
            err(f"{where}.name", f"duplicated task name {tname!r}: each task needs its own")
        seen.add(tname)
        replicas = whole_field(task.get("replicas"), f"{where}.replicas", 0, err)
        total += replicas or 0
        least = whole_field(task.get("minAvailable"), f"{where}.minAvailable", 0, err)
        if least is not None and replicas is not None and least > replicas:
            err(
                f"{where}.minAvailable", f"{least} is greater than the task's replicas ({replicas})"
            )
        whole_field(task.get("maxRetry"), f"{where}.maxRetry", 0, err)
        _check_policies(task.get("policies"), f"{where}.policies", err)
        if _qualified(name) and _label(tname) and replicas:  # webhook: pod names valid
            last = pod_name(name, tname, max(replicas - 1, 0))
            if not _qualified(last):
                err(
                    f"{where}.name",
                    f"the task's pods would be named {last!r}, longer than "
                    "the 63 characters a pod name may have: shorten the Job's or the task's name",
                )
        _check_template(task.get("template"), f"{where}.template", err)
        _check_topology(task, where, err)
        _check_partition(task, replicas, least, where, err)
        _check_depends_on(task.get("dependsOn"), where, err)
    # webhook and policy: job minAvailable <= total replicas
    job_least = whole["minAvailable"]
    if job_least is not None and job_least > total:
        err(
            "spec.minAvailable", f"{job_least} is greater than the tasks' replicas in all ({total})"
        )
    _check_policies(spec.get("policies"), "spec.policies", err)
    _check_plugins(spec.get("plugins"), names, err)
    _check_volumes(spec.get("volumes"), err)
    _check_network_topology(spec.get("networkTopology"), "spec.networkTopology", err)
    _check_dag(tasks, names, err)
    return errors


def check_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[JobError]:
    """What an update of a Job's spec may not do (Volcano's webhook, validateJobUpdate):
    change anything but ``minAvailable``, the tasks' ``replicas`` and ``minAvailable``
    and ``priorityClassName``, or add or remove a task. (:func:`check` holds for the new
    spec too.)"""
    errors: list[JobError] = []
    old_tasks, new_tasks = _list(old.get("tasks")), _list(new.get("tasks"))
    if len(old_tasks) != len(new_tasks):
        errors.append(JobError("spec.tasks", "a Job's update may not add or remove tasks"))
        return errors
    mutable = ("minAvailable", "priorityClassName")
    if _strip(old, mutable, old_tasks) != _strip(new, mutable, new_tasks):
        errors.append(
            JobError(
                "spec",
                "a Job's update may change only minAvailable, priorityClassName and the "
                "tasks' replicas and minAvailable",
            )
        )
    return errors


def _strip(spec: Mapping[str, Any], keys: Sequence[str], tasks: list[Any]) -> dict[str, Any]:
    out = {k: v for k, v in spec.items() if k not in keys}
    out["tasks"] = [
        {k: v for k, v in t.items() if k not in ("replicas", "minAvailable")}
        if isinstance(t, dict)
        else t
        for t in tasks
    ]
    return out


def _check_policies(raw: Any, where: str, err: Report) -> None:
    """Volcano's validatePolicies: each policy has an event (``event`` or ``events``) or
    an ``exitCode``, not both; events and actions from the allowed lists; an event or
    exit code handled once per list; ``*`` alone; exit code 0 is no error."""
    if raw is None:
        return
    if not isinstance(raw, list):
        err(where, "must be a list of policies")
        return
    handled: dict[str, int] = {}
    codes: set[int] = set()
    for i, policy in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(policy, dict):
            err(at, "must be an object with event (or events) or exitCode, and action")
            continue
        events = _list(policy.get("events"))
        if "events" in policy and not isinstance(policy["events"], list):
            err(f"{at}.events", "must be a list of events")
        if policy.get("event"):
            events = [*events, policy["event"]]
        code = policy.get("exitCode")
        if events and code is not None:
            err(at, "must not name an event and an exitCode at once")
        elif not events and code is None:
            err(at, "names neither an event nor an exitCode: one is needed")
        for event in dict.fromkeys(e if isinstance(e, str) else repr(e) for e in events):
            if event not in POLICY_EVENTS:
                err(
                    at,
                    f"invalid policy event {event!r}; valid events are {', '.join(POLICY_EVENTS)}",
                )
            elif event in handled and handled[event] != i:
                err(
                    at, f"duplicate event {event}: policies {handled[event]} and {i} both handle it"
                )
            else:
                handled[event] = i
        if code is not None:
            if not isinstance(code, int) or isinstance(code, bool):
                err(f"{at}.exitCode", "must be an integer")
            elif code == 0:
                err(f"{at}.exitCode", "0 is not a valid error code")
            elif code in codes:
                err(f"{at}.exitCode", f"duplicate exitCode {code}")
            else:
                codes.add(code)
        action = policy.get("action")
        if action not in POLICY_ACTIONS:
            err(
                f"{at}.action",
                f"invalid policy action {action!r}; valid actions are {', '.join(POLICY_ACTIONS)}",
            )
        timeout = policy.get("timeout")
        if timeout is not None and (not isinstance(timeout, str) or duration_s(timeout) is None):
            err(f"{at}.timeout", f"{timeout!r} is not a duration (like 30s, 5m or 1h30m)")
    if ANY_EVENT in handled and len(handled) > 1:
        err(where, "a policy for '*' handles every event: no other event may have a policy")


def _check_template(raw: Any, where: str, err: Report) -> None:
    """What Kubernetes' pod template validation would refuse of the pods, in part: the
    containers (at least one; each named as a DNS-1123 label, unique across init and
    regular containers; with an image) and the restart policy."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        err(where, "must be a pod template")
        return
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        err(f"{where}.spec", "must be a pod spec")
        return
    names: set[str] = set()
    for key in ("initContainers", "containers"):
        containers = spec.get(key) or []
        if not isinstance(containers, list):
            err(f"{where}.spec.{key}", "must be a list of containers")
            continue
        if key == "containers" and not containers:
            err(f"{where}.spec.containers", "required: a pod needs at least one container")
        for i, c in enumerate(containers):
            at = f"{where}.spec.{key}[{i}]"
            if not isinstance(c, dict):
                err(at, "must be a container")
                continue
            cname = c.get("name")
            if not cname:
                err(f"{at}.name", "required")
            elif not isinstance(cname, str) or not _label(cname):
                err(f"{at}.name", f"{cname!r} must be a lowercase DNS-1123 label")
            elif cname in names:
                err(f"{at}.name", f"duplicate container name {cname!r}")
            else:
                names.add(cname)
            if not c.get("image"):
                err(f"{at}.image", "required")
    restart = spec.get("restartPolicy")
    if restart is not None and restart not in RESTART_POLICIES:
        err(
            f"{where}.spec.restartPolicy",
            f"{restart!r} is not one of {', '.join(RESTART_POLICIES)}",
        )


def _check_topology(task: Mapping[str, Any], where: str, err: Report) -> None:
    """Volcano's validateTaskTopoPolicy: with a NUMA topology policy other than none,
    every container's cpu request (its limit when it requests nothing) is whole cpus."""
    policy = task.get("topologyPolicy")
    if policy in (None, "", "none"):
        return
    if policy not in TOPOLOGY_POLICIES:
        err(f"{where}.topologyPolicy", f"{policy!r} is not one of {', '.join(TOPOLOGY_POLICIES)}")
        return
    spec = _map(_map(task.get("template")).get("spec"))
    containers = [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]
    for i, c in enumerate(containers):
        if not isinstance(c, dict):
            continue
        resources = _map(c.get("resources"))
        asked = _map(resources.get("requests") or resources.get("limits"))
        try:
            cpu = parse_quantity(asked.get("cpu", 0))
        except ValueError:
            cpu = parse_quantity(0)
        if cpu == 0 or cpu.denominator != 1:
            err(
                f"{where}.template",
                f"container {i} must request whole cpus (topologyPolicy "
                f"{policy} pins cpus), not {asked.get('cpu', 'none')}",
            )


def _check_partition(
    task: Mapping[str, Any], replicas: int | None, least: int | None, where: str, err: Report
) -> None:
    """Volcano's validatePartitionPolicy: replicas = totalPartitions x partitionSize, and
    a task minAvailable = minPartitions x partitionSize when minPartitions is set."""
    policy = task.get("partitionPolicy")
    if policy is None:
        return
    at = f"{where}.partitionPolicy"
    if not isinstance(policy, dict):
        err(at, "must be an object")
        return
    total = whole_field(
        policy.get("totalPartitions"), f"{at}.totalPartitions", 1, err, required=True
    )
    size = whole_field(policy.get("partitionSize"), f"{at}.partitionSize", 1, err, required=True)
    minimum = whole_field(policy.get("minPartitions"), f"{at}.minPartitions", 0, err)
    if total and size and replicas is not None and replicas != total * size:
        err(
            f"{where}.replicas",
            f"{replicas} is not totalPartitions x partitionSize ({total} x {size})",
        )
    if size and minimum and least is not None and least != minimum * size:
        err(
            f"{where}.minAvailable",
            f"{least} is not minPartitions x partitionSize ({minimum} x {size})",
        )
    _check_network_topology(policy.get("networkTopology"), f"{at}.networkTopology", err)


def _check_network_topology(raw: Any, where: str, err: Report) -> None:
    if raw is None:
        return
    if not isinstance(raw, dict):
        err(where, "must be an object")
        return
    if raw.get("highestTierAllowed") is not None and raw.get("highestTierName"):
        err(where, "must not name highestTierAllowed and highestTierName at once")
    if raw.get("mode") not in (None, "hard", "soft"):
        err(f"{where}.mode", f"{raw.get('mode')!r} is not hard or soft")


def _check_depends_on(raw: Any, where: str, err: Report) -> None:
    if raw is None:
        return
    if not isinstance(raw, dict) or not isinstance(raw.get("name", []), list):
        err(f"{where}.dependsOn", "must be an object with name: a list of task names")
    elif raw.get("iteration") not in (None, "", "any", "all"):
        err(f"{where}.dependsOn.iteration", f"{raw['iteration']!r} is not any or all")


def _check_dag(tasks: list[dict[str, Any]], names: list[str], err: Report) -> None:
    """Volcano's topoSort: the tasks' ``dependsOn`` form a directed acyclic graph; a
    dependency on a task the Job lacks can never be met either."""
    deps: dict[str, list[str]] = {}
    for i, task in enumerate(tasks):
        raw = task.get("dependsOn")
        if isinstance(raw, dict) and isinstance(raw.get("name", []), list):
            deps[names[i]] = [str(n) for n in raw.get("name") or []]
    if not any(deps.values()):
        return
    known = set(names)
    for i, name in enumerate(names):
        missing = [d for d in deps.get(name, []) if d not in known]
        if missing:
            err(
                f"spec.tasks[{i}].dependsOn.name",
                f"names no task of this Job: {', '.join(missing)}",
            )
    done: set[str] = set()
    left = {n: {d for d in deps.get(n, []) if d in known} for n in names}
    while True:
        ready = [n for n, d in left.items() if n not in done and d <= done]
        if not ready:
            break
        done.update(ready)
    cycle = sorted(n for n in left if n not in done)
    if cycle:
        err(
            "spec.tasks",
            "the tasks' dependsOn do not form a directed acyclic graph: "
            f"{', '.join(cycle)} wait on one another",
        )


def _check_plugins(raw: Any, tasks: list[str], err: Report) -> None:
    if raw is None:
        return
    if not isinstance(raw, dict):
        err("spec.plugins", "must map plugin names to lists of arguments")
        return
    for name, args in raw.items():
        if name not in PLUGINS:
            err(
                "spec.plugins",
                f"unable to find job plugin {name!r}; known plugins are {', '.join(PLUGINS)}",
            )
        if args is not None and not (
            isinstance(args, list) and all(isinstance(a, str) for a in args)
        ):
            err(f"spec.plugins.{name}", "must be a list of strings (the plugin's arguments)")
    if "mpi" in raw and isinstance(raw["mpi"], list | None):
        master = plugin_flags([str(a) for a in raw["mpi"] or []]).get("master", "master")
        if master not in tasks:  # webhook: the mpi master task must exist
            err("spec.plugins.mpi", f"the mpi master task {master!r} is not a task of this Job")


def _check_volumes(raw: Any, err: Report) -> None:
    """Volcano's validateIO: each volume has a mount path (no ':'), unique, and either
    an existing claim's name or a claim to make, not both."""
    if raw is None:
        return
    if not isinstance(raw, list):
        err("spec.volumes", "must be a list")
        return
    paths: set[str] = set()
    for i, v in enumerate(raw):
        at = f"spec.volumes[{i}]"
        if not isinstance(v, dict):
            err(at, "must be an object")
            continue
        path = v.get("mountPath")
        if not path or not isinstance(path, str):
            err(f"{at}.mountPath", "required")
        elif ":" in path:
            err(f"{at}.mountPath", "must not contain ':'")
        elif path in paths:
            err(f"{at}.mountPath", f"duplicated mountPath {path}")
        else:
            paths.add(path)
        claim, named = v.get("volumeClaim"), v.get("volumeClaimName")
        if claim is None and not named:
            err(at, "either volumeClaim or volumeClaimName must be specified")
        elif claim is not None and named:
            err(
                at,
                "names an existing claim (volumeClaimName) and a claim to make "
                "(volumeClaim): keep one",
            )
        elif named and not (isinstance(named, str) and _subdomain(named)):
            err(f"{at}.volumeClaimName", f"{named!r} must be a lowercase DNS subdomain")


# --- policies ----------------------------------------------------------------------------


def answer(job: JobSpec, event: str, task: str = "", exit_code: int | None = None) -> Policy | None:
    """The policy that answers ``event`` of a pod of ``task`` (exit code ``exit_code``
    when it failed), as Volcano's applyPolicies: the task's policies first, then the
    Job's; within each, the first that names the event (or ``*``) or the exit code. A
    ``PodPending`` policy needs a timeout (a pod is pending for a while as a rule)."""
    found = job.task(task) if task else None
    for policies in (found.policies if found else (), job.policies):
        for p in policies:
            named = event in p.events or ANY_EVENT in p.events
            # Volcano acts on PodPending only after a timeout: a pod is pending a while.
            if event and named and (event != "PodPending" or p.timeout_s is not None):
                return p
            if p.exit_code is not None and p.exit_code == exit_code:
                return p
    return None


def duration_s(text: str) -> float | None:
    """A Go duration (``90s``, ``1m30s``, ``1.5h``) in seconds; None if it is not one."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(body):
        m = _DURATION.match(body, pos)
        if m is None or m.group(1) in ("", "."):
            return None
        total += float(m.group(1)) * _UNITS_S[m.group(2)]
        pos = m.end()
    return sign * total if body else None


# --- helpers -----------------------------------------------------------------------------


def whole_field(
    value: Any, where: str, least: int, err: Report, *, required: bool = False
) -> int | None:
    """``value`` as an int32 of at least ``least`` (None, reported, when it is not)."""
    if value is None:
        if required:
            err(where, "required")
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        err(where, f"{value!r} is not an integer")
        return None
    if value < least:
        err(where, f"{value} must be at least {least}")
        return None
    if value > INT32_MAX:
        err(where, f"{value} is larger than {INT32_MAX}")
        return None
    return value


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _label(text: str) -> bool:
    return len(text) <= 63 and _LABEL.match(text) is not None


def _subdomain(text: str) -> bool:
    return len(text) <= 253 and _SUBDOMAIN.match(text) is not None


def _qualified(text: str) -> bool:
    """Kubernetes' IsQualifiedName: an optional DNS-subdomain prefix and '/', then a
    name of at most 63 characters."""
    prefix, slash, rest = text.rpartition("/")
    if slash and not (prefix and _subdomain(prefix)):
        return False
    return 0 < len(rest) <= 63 and _QUALIFIED.match(rest) is not None
