"""Volcano Job rules and defaults (shared/core/vcjob.py): each test names the rule of
Volcano it follows (its admission webhook ``pkg/webhooks/admission/jobs/validate``, the
validating admission policy and CRD schema shipped beside it, or its mutating webhook's
defaults)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core import vcjob


def job(**spec: Any) -> dict[str, Any]:
    """A valid spec: one task of two pods; ``spec`` replaces keys."""
    base: dict[str, Any] = {
        "minAvailable": 2,
        "schedulerName": "volcano",
        "tasks": [
            {
                "name": "worker",
                "replicas": 2,
                "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
            }
        ],
    }
    base.update(spec)
    return base


def task(name: str, replicas: int = 1, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
        **more,
    }


def fields(spec: dict[str, Any], name: str = "job") -> list[str]:
    return [e.field for e in vcjob.check(name, spec)]


def messages(spec: dict[str, Any], name: str = "job") -> str:
    return vcjob.refusal(vcjob.check(name, spec))


def test_a_valid_job_breaks_no_rule() -> None:
    assert vcjob.check("job", job()) == []


def test_job_min_available_above_the_replicas_is_refused() -> None:
    """Webhook and policy: "job 'minAvailable' should not be greater than total
    replicas in tasks" (Volcano's example/invalid_jobs/minAvailable-webhook-deny.yaml)."""
    said = messages(job(minAvailable=3))
    assert "spec.minAvailable: 3 is greater than the tasks' replicas in all (2)" in said


def test_tasks_sharing_a_name_are_refused() -> None:
    """Webhook: "duplicated task name"; policy: task names are unique."""
    spec = job(tasks=[task("a"), task("a")], minAvailable=1)
    assert fields(spec) == ["spec.tasks[1].name"]
    assert "duplicated task name 'a'" in messages(spec)


def test_a_job_without_tasks_is_refused() -> None:
    """Webhook and policy: "No task specified in job spec"."""
    assert fields(job(tasks=[], minAvailable=0)) == ["spec.tasks"]
    assert fields({"minAvailable": 0}) == ["spec.tasks"]


def test_numbers_keep_the_crd_schemas_minimums() -> None:
    """CRD schema and policy: minAvailable >= 0, maxRetry >= 0, minSuccess >= 1,
    ttlSecondsAfterFinished >= 0; a task's replicas, minAvailable and maxRetry >= 0."""
    spec = job(minAvailable=-1, maxRetry=-1, minSuccess=0, ttlSecondsAfterFinished=-5)
    spec["tasks"][0] |= {"replicas": -1, "minAvailable": -1, "maxRetry": -2}
    assert set(fields(spec)) == {
        "spec.minAvailable",
        "spec.maxRetry",
        "spec.minSuccess",
        "spec.ttlSecondsAfterFinished",
        "spec.tasks[0].replicas",
        "spec.tasks[0].minAvailable",
        "spec.tasks[0].maxRetry",
    }
    assert fields(job(minAvailable="2")) == ["spec.minAvailable"]  # an integer, not text


def test_a_task_min_available_above_its_replicas_is_refused() -> None:
    """Webhook: "'minAvailable' is greater than 'replicas' in task"."""
    spec = job()
    spec["tasks"][0]["minAvailable"] = 3
    assert "spec.tasks[0].minAvailable: 3 is greater than the task's replicas (2)" in messages(spec)


def test_task_and_job_names_must_be_valid_names() -> None:
    """Policy: a task name is a DNS-1123 label; webhook: the Job's name and every pod's
    (``<job>-<task>-<index>``) are qualified names of at most 63 characters."""
    assert fields(job(tasks=[task("Worker_1", 2)])) == ["spec.tasks[0].name"]
    assert fields(job(), name="-bad") == ["metadata.name"]
    long_job = "j" * 55
    said = messages(job(tasks=[task("worker", 2)]), name=long_job)
    assert "pods would be named" in said
    assert "shorten" in said


def test_a_task_without_a_name_is_named_default_and_index() -> None:
    """Mutating webhook: a task without a name is ``default<index>``."""
    spec = job(tasks=[{k: v for k, v in task("x", 2).items() if k != "name"}])
    assert vcjob.check("job", spec) == []
    assert vcjob.read(spec).tasks[0].name == "default0"


@pytest.mark.parametrize(
    ("policies", "wanted"),
    [
        # "must not specify event and exitCode simultaneously"
        ([{"event": "PodFailed", "exitCode": 3, "action": "RestartJob"}], "must not name"),
        # "either event and exitCode should be specified"
        ([{"action": "RestartJob"}], "names neither an event nor an exitCode"),
        # "invalid policy event" (internal events are not for users)
        ([{"event": "OutOfSync", "action": "RestartJob"}], "invalid policy event 'OutOfSync'"),
        ([{"event": "PodRunning", "action": "RestartJob"}], "invalid policy event"),
        # "invalid policy action"
        ([{"event": "PodFailed", "action": "SyncJob"}], "invalid policy action 'SyncJob'"),
        # "duplicate event ... across different policy"
        (
            [
                {"event": "PodFailed", "action": "RestartJob"},
                {"events": ["PodEvicted", "PodFailed"], "action": "AbortJob"},
            ],
            "duplicate event PodFailed",
        ),
        # "0 is not a valid error code"
        ([{"exitCode": 0, "action": "RestartJob"}], "0 is not a valid error code"),
        # "duplicate exitCode"
        (
            [{"exitCode": 3, "action": "RestartJob"}, {"exitCode": 3, "action": "AbortJob"}],
            "duplicate exitCode 3",
        ),
        # "if there's * here, no other policy should be here"
        (
            [{"event": "*", "action": "RestartJob"}, {"event": "PodFailed", "action": "AbortJob"}],
            "no other event may have a policy",
        ),
        ([{"event": "PodPending", "action": "AbortJob", "timeout": "soon"}], "not a duration"),
    ],
)
def test_policies_follow_volcanos_validate_policies(
    policies: list[dict[str, Any]], wanted: str
) -> None:
    """Webhook, validatePolicies, for the Job's policies and each task's alike."""
    assert wanted in messages(job(policies=policies))
    spec = job()
    spec["tasks"][0]["policies"] = policies
    said = messages(spec)
    assert wanted in said
    assert "spec.tasks[0].policies" in said


def test_every_event_and_action_volcano_allows_is_accepted() -> None:
    policies = [
        {"event": e, "action": a}
        for e, a in zip(vcjob.POLICY_EVENTS[1:], vcjob.POLICY_ACTIONS, strict=False)
    ]
    policies.append({"exitCode": 137, "action": "RestartTask", "timeout": "1m30s"})
    assert vcjob.check("job", job(policies=policies)) == []


def test_unknown_plugins_are_refused_and_mpi_needs_its_master() -> None:
    """Webhook: "unable to find job plugin"; "The specified mpi master task was not
    found" (``--master``, default ``master``)."""
    assert "unable to find job plugin 'horovod'" in messages(job(plugins={"horovod": []}))
    assert "mpi master task 'master'" in messages(job(plugins={"mpi": []}))
    spec = job(plugins={"mpi": ["--master=worker"], "ssh": [], "svc": [], "env": []})
    assert vcjob.check("job", spec) == []


def test_depends_on_must_form_a_dag() -> None:
    """Webhook: "job has dependencies between tasks, but doesn't form a directed acyclic
    graph(DAG)"; a dependency on a task the Job lacks never ends either."""
    cycle = [
        task("a", dependsOn={"name": ["b"]}),
        task("b", dependsOn={"name": ["a"]}),
        task("c"),
    ]
    said = messages(job(tasks=cycle, minAvailable=1))
    assert "directed acyclic graph: a, b wait on one another" in said
    chain = [task("a"), task("b", dependsOn={"name": ["a"]}), task("c", dependsOn={"name": ["b"]})]
    assert vcjob.check("job", job(tasks=chain, minAvailable=1)) == []
    missing = [task("a", dependsOn={"name": ["nope"]})]
    assert "spec.tasks[0].dependsOn.name: names no task of this Job: nope" in messages(
        job(tasks=missing, minAvailable=1)
    )


def test_volumes_follow_validate_io() -> None:
    """Webhook, validateIO: a mount path, unique, and a claim's name or a claim."""
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    said = messages(
        job(
            volumes=[
                {"mountPath": "/data"},
                {"mountPath": "/data", "volumeClaimName": "x"},
                {"volumeClaimName": "y"},
                {"mountPath": "/out", "volumeClaimName": "z", "volumeClaim": claim},
            ]
        )
    )
    assert "spec.volumes[0]: either volumeClaim or volumeClaimName" in said
    assert "spec.volumes[1].mountPath: duplicated mountPath /data" in said
    assert "spec.volumes[2].mountPath: required" in said
    assert "spec.volumes[3]: names an existing claim" in said


def test_the_pod_template_must_make_valid_pods() -> None:
    """Webhook: the template passes Kubernetes' pod template validation (here: the
    containers' names and images, the restart policy)."""
    spec = job()
    spec["tasks"][0]["template"] = {
        "spec": {
            "containers": [{"name": "main"}, {"name": "main", "image": "x"}],
            "restartPolicy": "Sometimes",
        }
    }
    assert fields(spec) == [
        "spec.tasks[0].template.spec.containers[0].image",
        "spec.tasks[0].template.spec.containers[1].name",
        "spec.tasks[0].template.spec.restartPolicy",
    ]
    spec["tasks"][0]["template"] = {"spec": {}}
    assert fields(spec) == ["spec.tasks[0].template.spec.containers"]


def test_partitions_and_topology_policy() -> None:
    """Webhook: validatePartitionPolicy (replicas = totalPartitions x partitionSize)
    and validateTaskTopoPolicy (whole cpus with a NUMA policy)."""
    spec = job()
    spec["tasks"][0]["partitionPolicy"] = {"totalPartitions": 3, "partitionSize": 1}
    assert "2 is not totalPartitions x partitionSize (3 x 1)" in messages(spec)
    spec = job()
    spec["tasks"][0]["topologyPolicy"] = "single-numa-node"
    spec["tasks"][0]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "500m"}
    }
    assert "must request whole cpus" in messages(spec)
    spec["tasks"][0]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}}
    assert vcjob.check("job", spec) == []


def test_every_error_is_reported_at_once() -> None:
    spec = job(minAvailable=9, tasks=[task("a"), task("a")], plugins={"x": []})
    assert len(vcjob.check("job", spec)) == 3


def test_an_update_may_change_only_the_scale_and_priority() -> None:
    """Webhook, validateJobUpdate: "job updates may not add or remove tasks"; only
    minAvailable, the tasks' replicas (and minAvailable) and priorityClassName change."""
    old = job()
    scaled = copy.deepcopy(old)
    scaled["tasks"][0]["replicas"] = 4
    scaled["minAvailable"] = 3
    scaled["priorityClassName"] = "high"
    assert vcjob.check_update(old, scaled) == []
    queue = job(queue="other")
    assert [e.field for e in vcjob.check_update(old, queue)] == ["spec"]
    more = job(tasks=[task("worker", 2), task("ps")])
    assert "may not add or remove tasks" in vcjob.refusal(vcjob.check_update(old, more))


def test_reading_applies_volcanos_defaults() -> None:
    """Mutating webhook: queue ``default``, maxRetry 3 (Job and task), a task's
    minAvailable its replicas, the Job's the sum of its tasks'; svc for the framework
    plugins, ssh for mpi."""
    spec = job(tasks=[task("ps", 1), task("worker", 3, minAvailable=2)], plugins={"mpi": []})
    del spec["minAvailable"]
    read = vcjob.read(spec)
    assert (read.queue, read.max_retry, read.min_available) == ("default", 3, 3)
    assert [(t.min_available, t.max_retry) for t in read.tasks] == [(1, 3), (2, 3)]
    assert set(read.plugins) == {"mpi", "svc", "ssh"}
    assert vcjob.read(job(maxRetry=5)).max_retry == 5


def test_a_task_policy_answers_before_the_jobs() -> None:
    """applyPolicies: the task's policies first, then the Job's; the first that names
    the event or ``*``, or the exit code; PodPending only with a timeout."""
    spec = job(
        policies=[
            {"event": "PodFailed", "action": "RestartJob"},
            {"exitCode": 3, "action": "AbortJob"},
        ]
    )
    spec["tasks"][0]["policies"] = [{"event": "*", "action": "RestartTask"}]
    read = vcjob.read(spec)
    assert vcjob.answer(read, "PodFailed", "worker").action == "RestartTask"  # type: ignore[union-attr]
    assert vcjob.answer(read, "PodFailed", "").action == "RestartJob"  # type: ignore[union-attr]
    assert vcjob.answer(read, "PodEvicted", "") is None
    found = vcjob.answer(read, "", "", exit_code=3)
    assert found is not None
    assert found.action == "AbortJob"
    pending = vcjob.read(job(policies=[{"event": "PodPending", "action": "AbortJob"}]))
    assert vcjob.answer(pending, "PodPending") is None
    timed = vcjob.read(
        job(policies=[{"event": "PodPending", "action": "AbortJob", "timeout": "90s"}])
    )
    found = vcjob.answer(timed, "PodPending")
    assert found is not None
    assert found.timeout_s == 90.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("1m30s", 90.0), ("1.5h", 5400.0), ("250ms", 0.25), ("0", 0.0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert vcjob.duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "s", "1x", "1m30"])
def test_not_durations(text: str) -> None:
    assert vcjob.duration_s(text) is None


def test_plugin_arguments_read_as_go_flags() -> None:
    assert vcjob.plugin_flags(["--master=leader", "--port", "2222", "--verbose"]) == {
        "master": "leader",
        "port": "2222",
        "verbose": "true",
    }
    assert vcjob.plugin_flags(["--ssh-port=2022 --ssh-key-file-path=/home/u/.ssh"]) == {
        "ssh-port": "2022",
        "ssh-key-file-path": "/home/u/.ssh",
    }


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5),
    st.text(max_size=4),
    st.sampled_from(
        ["worker", "ps", "PodFailed", "*", "RestartJob", "1m", "svc", "mpi", "/data", "Never"]
    ),
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "replicas",
                    "minAvailable",
                    "template",
                    "spec",
                    "containers",
                    "image",
                    "policies",
                    "event",
                    "events",
                    "action",
                    "exitCode",
                    "timeout",
                    "dependsOn",
                    "plugins",
                    "volumes",
                    "mountPath",
                    "volumeClaim",
                    "volumeClaimName",
                    "tasks",
                    "maxRetry",
                    "partitionPolicy",
                    "topologyPolicy",
                    "resources",
                    "iteration",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


_ANY_SPEC = st.dictionaries(
    st.sampled_from(
        [
            "tasks",
            "minAvailable",
            "policies",
            "plugins",
            "volumes",
            "queue",
            "minSuccess",
            "maxRetry",
            "ttlSecondsAfterFinished",
            "networkTopology",
        ]
    ),
    _json,
    max_size=5,
)
"""Whatever a user may write: any of a Job spec's fields, each any JSON."""

_PATHS = [
    ("minAvailable",),
    ("maxRetry",),
    ("minSuccess",),
    ("plugins",),
    ("policies",),
    ("volumes",),
    ("tasks",),
    ("tasks", 0),
    ("tasks", 0, "name"),
    ("tasks", 0, "replicas"),
    ("tasks", 0, "minAvailable"),
    ("tasks", 0, "policies"),
    ("tasks", 0, "dependsOn"),
    ("tasks", 0, "partitionPolicy"),
    ("tasks", 0, "topologyPolicy"),
    ("tasks", 0, "template"),
    ("tasks", 0, "template", "spec"),
    ("tasks", 0, "template", "spec", "containers"),
    ("tasks", 0, "template", "spec", "containers", 0),
    ("tasks", 0, "template", "spec", "containers", 0, "resources"),
]


@st.composite
def _one_field_replaced(draw: st.DrawFn) -> dict[str, Any]:
    """A valid Job using every feature, with one field at ``_PATHS`` replaced by any
    JSON."""
    path, value = draw(st.sampled_from(_PATHS)), draw(_json)
    spec = job(
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
        plugins={"svc": [], "ssh": []},
        volumes=[{"mountPath": "/d", "volumeClaimName": "d"}],
    )
    spec["tasks"][0]["topologyPolicy"] = "none"
    target: Any = spec
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return spec


@pytest.mark.parametrize(
    "specs", [_ANY_SPEC, _one_field_replaced()], ids=["any-spec", "one-field-replaced"]
)
@given(data=st.data())
def test_any_spec_is_checked_without_raising_and_a_valid_one_is_read(
    specs: st.SearchStrategy[dict[str, Any]], data: st.DataObject
) -> None:
    """The webhook and the controller read whatever a user wrote (Tessera's CRD takes
    any field): checking never raises, and what passes reads."""
    spec = data.draw(specs)
    if vcjob.check("job", spec) == []:
        read = vcjob.read(spec)
        assert read.min_available <= read.replicas
