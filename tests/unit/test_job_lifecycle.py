"""A Volcano Job's life (services/job_controller/: lifecycle.py, policies.py, status.py,
podview.py), each case as Volcano's job controller leads it (``pkg/controllers/job``:
its state machine, its pod handlers' events, applyPolicies): phases, counts, kills,
restarts, dependsOn."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from services.job_controller import lifecycle as lc
from services.job_controller import policies as po
from services.job_controller.podview import (
    JOB_NAME,
    JOB_VERSION,
    TASK_INDEX,
    TASK_SPEC,
    PodView,
    read_pod,
)
from services.job_controller.status import Status, merge_patch, read_status
from shared.core import vcjob

NOW = "2026-01-01T00:00:00Z"
SYNC = po.Decision(po.SYNC)


def spec(**more: Any) -> vcjob.JobSpec:
    """Tasks ``ps`` (1 pod) and ``worker`` (2 pods); ``more`` replaces keys."""
    raw: dict[str, Any] = {
        "tasks": [
            {"name": "ps", "replicas": 1, "template": {}},
            {"name": "worker", "replicas": 2, "template": {}},
        ]
    }
    raw.update(more)
    return vcjob.read(raw)


def pod(task: str, index: int, phase: str = "Running", **more: Any) -> PodView:
    name = vcjob.pod_name("job", task, index)
    return PodView("ns", name, f"uid-{name}", "job", "j1", task, index, 0, phase, **more)


def pods(*views: PodView) -> dict[str, PodView]:
    return {v.name: v for v in views}


def every(phase: str = "Running", **more: Any) -> dict[str, PodView]:
    return pods(
        pod("ps", 0, phase, **more),
        pod("worker", 0, phase, **more),
        pod("worker", 1, phase, **more),
    )


def step(
    job: vcjob.JobSpec,
    status: Status,
    views: dict[str, PodView],
    decision: po.Decision = SYNC,
) -> lc.Plan:
    return lc.step("job", job, status, views, decision, NOW)


def test_a_new_job_creates_its_pods_and_waits_pending() -> None:
    plan = step(spec(), Status(), {})
    assert plan.create == (("ps", 0), ("worker", 0), ("worker", 1))
    assert plan.setup
    assert (plan.status.phase, plan.status.pending, plan.status.min_available) == ("Pending", 3, 3)
    assert [c["status"] for c in plan.status.conditions] == ["Pending"]


def test_pending_becomes_running_once_min_available_pods_run_or_finished() -> None:
    """pendingState: minAvailable <= running + succeeded + failed."""
    status = Status(phase="Pending")
    views = pods(pod("ps", 0), pod("worker", 0, "Succeeded"), pod("worker", 1, "Pending"))
    assert step(spec(), status, views).status.phase == "Pending"
    assert step(spec(minAvailable=2), status, views).status.phase == "Running"


def test_running_completes_when_every_pod_finished_and_min_available_succeeded() -> None:
    status = Status(phase="Running")
    done = step(spec(minAvailable=2), status, every("Succeeded") | pods(pod("ps", 0, "Failed")))
    assert done.status.phase == "Completed"
    assert (done.status.succeeded, done.status.failed) == (2, 1)
    assert done.status.tasks == {"ps": {"Failed": 1}, "worker": {"Succeeded": 2}}
    failed = step(spec(), status, every("Failed") | pods(pod("ps", 0, "Succeeded")))
    assert failed.status.phase == "Failed"


def test_a_task_below_its_min_available_fails_the_job() -> None:
    """runningState: with minAvailable >= the tasks' together, every task must have its
    minAvailable pods succeeded."""
    views = every("Succeeded") | pods(pod("worker", 1, "Failed"))
    assert step(spec(), Status(phase="Running"), views).status.phase == "Failed"


def test_min_success_completes_the_job_and_kills_the_rest() -> None:
    """runningState: succeeded >= minSuccess completes it; a finished Job kills (softly)
    what still runs on its next sync."""
    job = spec(minSuccess=1)
    views = every() | pods(pod("ps", 0, "Succeeded"))
    plan = step(job, Status(phase="Running"), views)
    assert plan.status.phase == "Completed"
    after = step(job, plan.status, views)
    assert after.kill == ("job-worker-0", "job-worker-1")
    assert after.teardown
    assert after.status.phase == "Completed"
    assert (after.status.succeeded, after.status.terminating) == (1, 2)  # volcano#4616
    assert after.status.version == plan.status.version + 1


def test_running_goes_back_to_pending_when_too_many_pods_wait() -> None:
    views = pods(pod("ps", 0, "Pending"), pod("worker", 0, "Pending"), pod("worker", 1))
    assert step(spec(minAvailable=2), Status(phase="Running"), views).status.phase == "Pending"


def test_restart_job_kills_every_pod_and_counts_a_retry() -> None:
    """RestartJob: KillJob keeping nothing, retryCount + 1, Restarting; once enough of
    the old pods are gone the Job is Pending and makes them anew."""
    job = spec(maxRetry=3)
    views = every() | pods(pod("worker", 1, "Failed"))
    plan = step(job, Status(phase="Running"), views, po.Decision("RestartJob"))
    assert plan.kill == ("job-ps-0", "job-worker-0", "job-worker-1")
    assert (plan.status.phase, plan.status.retry_count, plan.status.version) == (
        "Restarting",
        1,
        1,
    )
    assert plan.status.terminating == 3
    assert plan.teardown
    dying = {n: replace(v, deleting=True) for n, v in views.items()}
    waiting = step(job, plan.status, dying)
    assert (waiting.status.phase, waiting.create) == ("Restarting", ())
    gone = step(job, plan.status, {})
    assert gone.status.phase == "Pending"
    assert len(gone.create) == 3


def test_the_last_retry_keeps_the_finished_pods_and_max_retry_fails_the_job() -> None:
    """KillJob keeps Succeeded and Failed pods at the last retry (retryCount >=
    maxRetry - 1); restartingState fails the Job once retryCount reaches maxRetry."""
    job = spec(maxRetry=2)
    views = every() | pods(pod("worker", 1, "Failed"))
    plan = step(job, Status(phase="Running", retry_count=1), views, po.Decision("RestartJob"))
    assert plan.kill == ("job-ps-0", "job-worker-0")  # the failed pod stays to be read
    assert plan.status.retry_count == 2
    assert step(job, plan.status, {}).status.phase == "Failed"


def test_abort_then_resume() -> None:
    """AbortJob: KillJob keeping finished pods, Aborting until none is alive, then
    Aborted; ResumeJob restarts it (retryCount + 1)."""
    job = spec()
    views = every() | pods(pod("ps", 0, "Succeeded"))
    plan = step(job, Status(phase="Running"), views, po.Decision("AbortJob"))
    assert (plan.kill, plan.status.phase) == (("job-worker-0", "job-worker-1"), "Aborting")
    left = pods(pod("ps", 0, "Succeeded"))
    aborted = step(job, plan.status, left)
    assert aborted.status.phase == "Aborted"
    resumed = step(job, aborted.status, left, po.Decision("ResumeJob"))
    assert (resumed.status.phase, resumed.status.retry_count) == ("Restarting", 1)


def test_complete_and_terminate_wait_for_the_pods_to_go() -> None:
    for action, then, final in (
        ("CompleteJob", "Completing", "Completed"),
        ("TerminateJob", "Terminating", "Terminated"),
    ):
        plan = step(spec(), Status(phase="Running"), every(), po.Decision(action))
        assert plan.status.phase == then
        dying = {n: replace(v, deleting=True) for n, v in every().items()}
        assert step(spec(), plan.status, dying).status.phase == then
        assert step(spec(), plan.status, {}).status.phase == final


def test_restart_task_pod_and_partition_kill_only_their_target() -> None:
    """KillTarget: a task's pods, one pod, or the pods of one partition of a task; the
    PodGroup stays (no teardown, no new version)."""
    status = Status(phase="Running")
    task = step(spec(), status, every(), po.Decision("RestartTask", task="worker"))
    assert task.kill == ("job-worker-0", "job-worker-1")
    assert (task.teardown, task.status.version, task.status.phase) == (False, 0, "Restarting")
    one = step(
        spec(), status, every(), po.Decision("RestartPod", task="worker", pod="job-worker-1")
    )
    assert one.kill == ("job-worker-1",)
    parted = vcjob.read(
        {
            "tasks": [
                {
                    "name": "worker",
                    "replicas": 4,
                    "partitionPolicy": {"totalPartitions": 2, "partitionSize": 2},
                    "template": {},
                }
            ]
        }
    )
    views = pods(*(pod("worker", i) for i in range(4)))
    part = step(
        parted, status, views, po.Decision("RestartPartition", task="worker", pod="job-worker-3")
    )
    assert part.kill == ("job-worker-2", "job-worker-3")


def test_depends_on_waits_for_ready_or_succeeded_pods() -> None:
    """waitDependsOnTaskMeetCondition: a task's pods are created once the tasks it
    depends on have minAvailable pods succeeded or running with every container ready;
    ``iteration: any`` needs one of several."""
    raw: dict[str, Any] = {
        "minAvailable": 1,
        "tasks": [
            {"name": "a", "replicas": 1, "template": {}},
            {"name": "b", "replicas": 1, "template": {}, "dependsOn": {"name": ["a"]}},
            {"name": "c", "replicas": 2, "template": {}, "dependsOn": {"name": ["b"]}},
        ],
    }
    job = vcjob.read(raw)
    first = step(job, Status(), {})
    assert first.create == (("a", 0),)
    started = pods(pod("a", 0, "Running", ready=False))
    assert step(job, first.status, started).create == ()
    ready = pods(pod("a", 0, "Running", ready=True))
    assert step(job, first.status, ready).create == (("b", 0),)
    done = pods(pod("a", 0, "Succeeded"), pod("b", 0, "Succeeded"))
    assert step(job, first.status, done).create == (("c", 0), ("c", 1))
    raw["tasks"][2]["dependsOn"] = {"name": ["a", "b"], "iteration": "any"}
    assert step(vcjob.read(raw), first.status, ready).create == (("b", 0), ("c", 0), ("c", 1))


def test_sync_deletes_pods_beyond_the_replicas_and_out_of_sync_ones() -> None:
    views = every() | pods(pod("worker", 2), pod("ps", 0, out_of_sync=True))
    plan = step(spec(), Status(phase="Running"), views)
    assert plan.kill == ("job-ps-0", "job-worker-2")
    assert plan.create == ()  # ps-0 is made again once it is gone


def test_pod_events_as_volcanos_pod_handlers_say() -> None:
    job = spec(tasks=[{"name": "worker", "replicas": 2, "template": {}, "maxRetry": 2}])
    running = pod("worker", 0)
    views = pods(running, pod("worker", 1))
    assert po.pod_event(job, None, pod("worker", 0, "Pending"), views).event == "PodPending"
    failed = po.pod_event(job, running, replace(running, phase="Failed", exit_code=3), views)
    assert (failed.event, failed.exit_code, failed.task) == ("PodFailed", 3, "worker")
    assert po.pod_event(job, running, None, views).event == "PodEvicted"
    ours = replace(running, out_of_sync=True)
    assert po.pod_event(job, ours, None, views).event == "OutOfSync"
    first = replace(running, phase="Succeeded")
    assert po.pod_event(job, running, first, pods(first, pod("worker", 1))).event == "OutOfSync"
    both = pods(first, pod("worker", 1, "Succeeded"))
    assert po.pod_event(job, running, first, both).event == "TaskCompleted"
    started = po.pod_event(job, replace(running, phase="Pending"), running, views)
    assert started.event == "PodRunning"
    restarted = replace(running, restarts=2)
    assert po.pod_event(job, running, restarted, pods(restarted)).event == "TaskFailed"


def test_decide_syncs_stale_and_internal_requests() -> None:
    """applyPolicies: internal events, a pod of a namesake Job and a pod of an older
    version only sync; a policy answers the rest."""
    job = spec(policies=[{"event": "PodFailed", "action": "RestartJob"}])
    failed = po.Request("PodFailed", "job-ps-0", "u", "ps", 1, version=2, job_uid="j1")
    assert po.decide(job, "j1", 2, failed).action == "RestartJob"
    assert po.decide(job, "j1", 3, failed).action == po.SYNC  # an older version's pod
    assert po.decide(job, "j2", 2, failed).action == po.SYNC  # a namesake's pod
    assert po.decide(job, "j1", 0, po.Request("OutOfSync")).action == po.SYNC
    timed = spec(policies=[{"event": "PodPending", "action": "AbortJob", "timeout": "30s"}])
    pending = po.decide(timed, "j1", 0, po.Request("PodPending", "job-ps-0", "u", "ps"))
    assert (pending.action, pending.delay_s) == ("AbortJob", 30.0)


def test_gang_broken_is_volcanos_unknown() -> None:
    assert not po.gang_broken(every())
    views = every() | pods(pod("worker", 1, "Pending", unschedulable=True))
    assert po.gang_broken(views)


def test_status_round_trips_and_patches_with_nulls() -> None:
    status = Status(phase="Running", running=2, tasks={"w": {"Running": 2}}, version=1)
    written = status.to_api()
    assert read_status(written) == status
    after = replace(status, running=1, succeeded=1, tasks={"w": {"Running": 1, "Succeeded": 1}})
    patch = merge_patch(written, after.to_api())
    assert patch == {
        "running": 1,
        "succeeded": 1,
        "taskStatusCount": {"w": {"phase": {"Running": 1, "Succeeded": 1}}},
    }
    assert merge_patch(after.to_api(), replace(after, running=0).to_api()) == {"running": None}


def test_a_phase_has_one_condition_the_latest_last() -> None:
    status = Status().entered("Pending", "t1").entered("Running", "t2").entered("Pending", "t3")
    assert [(c["status"], c["lastTransitionTime"]) for c in status.conditions] == [
        ("Running", "t2"),
        ("Pending", "t3"),
    ]


def test_read_pod() -> None:
    obj = {
        "metadata": {
            "namespace": "ns",
            "name": "job-worker-1",
            "uid": "u1",
            "annotations": {
                JOB_NAME: "job",
                TASK_SPEC: "worker",
                TASK_INDEX: "1",
                JOB_VERSION: "2",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch.volcano.sh/v1alpha1",
                    "kind": "Job",
                    "name": "job",
                    "uid": "j1",
                    "controller": True,
                }
            ],
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"ready": False, "restartCount": 1, "state": {"terminated": {"exitCode": 3}}}
            ],
        },
    }
    view = read_pod(obj)
    assert view == PodView(
        "ns", "job-worker-1", "u1", "job", "j1", "worker", 1, 2, "Failed", restarts=1, exit_code=3
    )
    obj["metadata"]["ownerReferences"] = []
    assert read_pod(obj) is None
