"""Volcano Jobs on the real API server, run by the job-controller as Volcano's controller
runs them: the pods' phases are written through their status subresource as their
kubelet would (tests/integration/test_vcjob_realnode.py has pods that really run and
fail). Each test proves one feature: the invalid Job left alone, the status and phases,
each lifecycle policy, maxRetry, minSuccess, ttlSecondsAfterFinished, dependsOn, the
plugins, volumes, scaling."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.config import NatsConfig
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline, start_pipeline
from tests.integration.vcjobs import (
    job,
    job_events,
    jobs_path,
    kubelet_says,
    phase_of,
    pods_of,
    reaches,
    run_all,
    status,
    task,
    vcjob,
)

pytestmark = pytest.mark.integration
INVENTORY = {
    "nodes": [
        {
            "name": "vj-a100",
            "devices": [
                {"vendor": "nvidia", "model": "NVIDIA-A100-SXM4-80GB", "memory": 81920, "count": 2}
            ],
        },
    ]
}
SCHEDULING = "/apis/scheduling.volcano.sh/v1beta1"


@pytest.fixture(scope="module")
async def pipeline(
    kubeconfig: Path, nats_admin: NatsConfig, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    p = await start_pipeline(tmp_path_factory.mktemp("vcjob"), kubeconfig, nats_admin, INVENTORY)
    yield p
    assert not [line for line in p.loud() if "job-controller" in line]
    await p.close()


@pytest.fixture
async def ns(pipeline: Pipeline) -> AsyncIterator[str]:
    """A fresh namespace; its Jobs and pods are deleted afterwards (a Job left behind
    would be run by the next module's job-controller, on its nodes)."""
    name = await pipeline.namespace()
    yield name
    await kube.request(pipeline.api, "DELETE", jobs_path(name))
    for pod in (await kube.request(pipeline.api, "GET", f"/api/v1/namespaces/{name}/pods"))[
        "items"
    ]:
        await pipeline.delete(name, pod["metadata"]["name"])


async def create(p: Pipeline, ns: str, body: dict[str, Any]) -> None:
    await kube.request(p.api, "POST", jobs_path(ns), body)


async def uids(p: Pipeline, ns: str, name: str) -> dict[str, str]:
    return {n: o["metadata"]["uid"] for n, o in (await pods_of(p, ns, name)).items()}


async def exists(p: Pipeline, path: str) -> bool:
    try:
        await kube.request(p.api, "GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def test_a_job_volcano_refuses_is_never_acted_on_and_says_why(
    pipeline: Pipeline, ns: str
) -> None:
    """Made while no webhook checked it: minAvailable above the replicas. No pod, no
    PodGroup; its state and a Warning Event name the field; fixed, it starts."""
    await create(pipeline, ns, vcjob("bad", [task("worker", 2)], minAvailable=3))
    state = (await reaches(pipeline, ns, "bad", "Failed"))["state"]
    assert state["reason"] == "InvalidJob"
    assert "spec.minAvailable: 3 is greater than the tasks' replicas in all (2)" in state["message"]
    warned = [e for e in await job_events(pipeline, ns, "bad") if e["reason"] == "InvalidJob"]
    assert warned
    assert warned[0]["type"] == "Warning"
    assert "spec.minAvailable" in warned[0]["message"]
    await asyncio.sleep(1.0)
    assert await pods_of(pipeline, ns, "bad") == {}
    assert not await exists(pipeline, f"{SCHEDULING}/namespaces/{ns}/podgroups/bad")
    await kube.request(
        pipeline.api,
        "PATCH",
        f"{jobs_path(ns)}/bad",
        {"spec": {"minAvailable": 2}},
        content_type="application/merge-patch+json",
    )
    await pipeline.bound(ns, "bad-worker-0")
    assert (await phase_of(pipeline, ns, "bad")) == "Pending"


async def test_status_counts_each_phase_as_volcanos_tools_read_it(
    pipeline: Pipeline, ns: str
) -> None:
    """Pending until minAvailable pods run, Running, Completed once all succeeded; the
    counts, per task too, version, minAvailable and one condition per phase."""
    await create(pipeline, ns, vcjob("counted", [task("ps"), task("worker", 2)]))
    first = await reaches(pipeline, ns, "counted", "Pending")
    assert (first["pending"], first["minAvailable"]) == (3, 3)
    await run_all(pipeline, ns, ["counted-ps-0", "counted-worker-0"])
    await asyncio.sleep(0.5)
    assert (await phase_of(pipeline, ns, "counted")) == "Pending"  # 2 of 3 run
    await run_all(pipeline, ns, ["counted-worker-1"])
    running = await reaches(pipeline, ns, "counted", "Running")
    assert running["running"] == 3
    assert running["taskStatusCount"] == {
        "ps": {"phase": {"Running": 1}},
        "worker": {"phase": {"Running": 2}},
    }
    for name in ("counted-ps-0", "counted-worker-0", "counted-worker-1"):
        await kubelet_says(pipeline, ns, name, "Succeeded", exit_code=0)
    done = await reaches(pipeline, ns, "counted", "Completed")
    assert done["succeeded"] == 3
    assert "running" not in done
    assert [c["status"] for c in done["conditions"]] == ["Pending", "Running", "Completed"]
    assert done["state"]["lastTransitionTime"] == done["conditions"][-1]["lastTransitionTime"]

    async def killed() -> bool:  # a finished Job's sync kills what is left: a new version
        return int((await status(pipeline, ns, "counted")).get("version", 0)) >= 1

    await eventually(killed, what="version 1")
    assert not await exists(pipeline, f"{SCHEDULING}/namespaces/{ns}/podgroups/counted")


async def test_a_failed_pod_restarts_the_job_until_max_retry_fails_it(
    pipeline: Pipeline, ns: str
) -> None:
    """PodFailed -> RestartJob: every pod made anew, retryCount + 1; at maxRetry the
    Job is Failed, the failed pod of the last try kept to be read."""
    body = vcjob(
        "retry",
        [task("worker", 2)],
        maxRetry=2,
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    await create(pipeline, ns, body)
    names = ["retry-worker-0", "retry-worker-1"]
    await run_all(pipeline, ns, names)
    first = await uids(pipeline, ns, "retry")
    await kubelet_says(pipeline, ns, "retry-worker-1", "Failed", exit_code=1)

    async def anew() -> bool:
        now = await uids(pipeline, ns, "retry")
        return set(now) == set(names) and all(now[n] != first[n] for n in names)

    await eventually(anew, what="both pods made anew")
    restarted = await status(pipeline, ns, "retry")
    assert restarted["retryCount"] == 1
    assert "Restarting" in [c["status"] for c in restarted["conditions"]]
    pod = (await pods_of(pipeline, ns, "retry"))["retry-worker-0"]
    assert pod["metadata"]["annotations"]["volcano.sh/job-retry-count"] == "1"
    await run_all(pipeline, ns, names)
    await kubelet_says(pipeline, ns, "retry-worker-0", "Failed", exit_code=1)
    failed = await reaches(pipeline, ns, "retry", "Failed")
    assert failed["retryCount"] == 2
    left = await pods_of(pipeline, ns, "retry")
    assert left["retry-worker-0"]["status"]["phase"] == "Failed"  # kept at the last retry
    assert "retry-worker-1" not in left or left["retry-worker-1"]["metadata"].get(
        "deletionTimestamp"
    )
    reasons = [e["message"] for e in await job_events(pipeline, ns, "retry")]
    assert "Start to execute action RestartJob" in reasons


async def test_task_completed_completes_the_job_and_min_success_too(
    pipeline: Pipeline, ns: str
) -> None:
    """A task policy TaskCompleted -> CompleteJob: the rest is deleted, Completing, then
    Completed. minSuccess 1 of 2: one success completes the Job."""
    driver = task("driver", policies=[{"event": "TaskCompleted", "action": "CompleteJob"}])
    await create(pipeline, ns, vcjob("drive", [driver, task("worker", 2)]))
    await run_all(pipeline, ns, ["drive-driver-0", "drive-worker-0", "drive-worker-1"])
    await reaches(pipeline, ns, "drive", "Running")
    await kubelet_says(pipeline, ns, "drive-driver-0", "Succeeded", exit_code=0)
    done = await reaches(pipeline, ns, "drive", "Completed")
    assert "Completing" in [c["status"] for c in done["conditions"]]
    assert set(await pods_of(pipeline, ns, "drive")) == {"drive-driver-0"}

    await create(pipeline, ns, vcjob("enough", [task("worker", 2)], minSuccess=1, minAvailable=2))
    await run_all(pipeline, ns, ["enough-worker-0", "enough-worker-1"])
    await kubelet_says(pipeline, ns, "enough-worker-0", "Succeeded", exit_code=0)
    await reaches(pipeline, ns, "enough", "Completed")

    async def rest_gone() -> bool:
        return set(await pods_of(pipeline, ns, "enough")) == {"enough-worker-0"}

    await eventually(rest_gone, what="the running worker deleted")


async def test_abort_terminate_and_restart_task_policies(pipeline: Pipeline, ns: str) -> None:
    """PodEvicted -> AbortJob (Aborting, then Aborted); an exit code -> TerminateJob
    (Terminated); PodFailed -> RestartTask (only that task's pods made anew)."""
    await create(
        pipeline,
        ns,
        vcjob("abort", [task("w", 2)], policies=[{"event": "PodEvicted", "action": "AbortJob"}]),
    )
    await run_all(pipeline, ns, ["abort-w-0", "abort-w-1"])
    await pipeline.delete(ns, "abort-w-0")  # evicted
    aborted = await reaches(pipeline, ns, "abort", "Aborted")
    assert "Aborting" in [c["status"] for c in aborted["conditions"]]
    assert await pods_of(pipeline, ns, "abort") == {}

    await create(
        pipeline,
        ns,
        vcjob("term", [task("w", 2)], policies=[{"exitCode": 3, "action": "TerminateJob"}]),
    )
    await run_all(pipeline, ns, ["term-w-0", "term-w-1"])
    await kubelet_says(pipeline, ns, "term-w-1", "Failed", exit_code=3)
    await reaches(pipeline, ns, "term", "Terminated")

    restart_ps = task("ps", policies=[{"event": "PodFailed", "action": "RestartTask"}])
    await create(pipeline, ns, vcjob("part", [restart_ps, task("w", 1)]))
    await run_all(pipeline, ns, ["part-ps-0", "part-w-0"])
    before = await uids(pipeline, ns, "part")
    await kubelet_says(pipeline, ns, "part-ps-0", "Failed", exit_code=1)

    async def ps_anew() -> bool:
        now = await uids(pipeline, ns, "part")
        return now.get("part-ps-0") not in (None, before["part-ps-0"])

    await eventually(ps_anew, what="the ps pod made anew")
    assert (await uids(pipeline, ns, "part"))["part-w-0"] == before["part-w-0"]
    assert (await status(pipeline, ns, "part"))["retryCount"] == 1


async def test_unknown_and_a_pending_timeout(pipeline: Pipeline, ns: str) -> None:
    """Unknown (Volcano's PodGroup Unknown: a pod runs while another cannot be placed)
    -> AbortJob; PodPending with a timeout -> AbortJob once a pod waited that long."""
    huge = task("huge")
    huge["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    body = vcjob(
        "gang",
        [task("fits"), huge],
        minAvailable=1,
        policies=[{"event": "Unknown", "action": "AbortJob"}],
    )
    await create(pipeline, ns, body)
    await pipeline.refused(ns, "gang-huge-0")  # PodScheduled False: no node can take it
    await run_all(pipeline, ns, ["gang-fits-0"])
    await reaches(pipeline, ns, "gang", "Aborted")

    timed = vcjob(
        "slow",
        [task("w")],
        policies=[{"event": "PodPending", "action": "AbortJob", "timeout": "2s"}],
    )
    await create(pipeline, ns, timed)
    await pipeline.bound(ns, "slow-w-0")  # bound, and never started: Pending
    aborted = await reaches(pipeline, ns, "slow", "Aborted", timeout_s=20)
    assert aborted["state"]["lastTransitionTime"]
    messages = [e["message"] for e in await job_events(pipeline, ns, "slow")]
    assert "Execute action AbortJob after 2s" in messages


async def test_ttl_seconds_after_finished_deletes_the_job(pipeline: Pipeline, ns: str) -> None:
    await create(pipeline, ns, vcjob("brief", [task("w")], ttlSecondsAfterFinished=2))
    await run_all(pipeline, ns, ["brief-w-0"])
    await kubelet_says(pipeline, ns, "brief-w-0", "Succeeded", exit_code=0)
    await reaches(pipeline, ns, "brief", "Completed")

    async def deleted() -> bool:
        return not await exists(pipeline, f"{jobs_path(ns)}/brief")

    await eventually(deleted, timeout_s=20, what="the Job deleted 2 s after it finished")

    async def pods_gone() -> bool:
        return await pods_of(pipeline, ns, "brief") == {}

    await eventually(pods_gone, what="its pods deleted with it")


async def test_depends_on_creates_a_task_once_the_tasks_before_it_are_ready(
    pipeline: Pipeline, ns: str
) -> None:
    tasks = [
        task("a"),
        task("b", dependsOn={"name": ["a"]}),
        task("c", 2, dependsOn={"name": ["b"]}),
    ]
    await create(pipeline, ns, vcjob("chain", tasks, minAvailable=1))
    await pipeline.bound(ns, "chain-a-0")
    await kubelet_says(pipeline, ns, "chain-a-0", "Running", ready=False)
    await asyncio.sleep(1.0)
    assert set(await pods_of(pipeline, ns, "chain")) == {"chain-a-0"}  # running, not ready
    await kubelet_says(pipeline, ns, "chain-a-0", "Running", ready=True)
    await pipeline.bound(ns, "chain-b-0")
    assert set(await pods_of(pipeline, ns, "chain")) == {"chain-a-0", "chain-b-0"}
    await kubelet_says(pipeline, ns, "chain-b-0", "Succeeded", exit_code=0)
    await pipeline.bound(ns, "chain-c-1")


async def test_the_ssh_and_svc_plugins_make_their_objects(pipeline: Pipeline, ns: str) -> None:
    """ssh: a Secret of fresh keys and a config naming every pod, mounted at
    /root/.ssh; svc: a headless Service, the hosts ConfigMap read into the environment
    and mounted at /etc/volcano, a NetworkPolicy; env: the task index."""
    body = vcjob(
        "mpi", [task("master"), task("worker", 2)], plugins={"ssh": [], "svc": [], "env": []}
    )
    await create(pipeline, ns, body)
    await pipeline.bound(ns, "mpi-worker-1")
    core = f"/api/v1/namespaces/{ns}"
    secret = await kube.request(pipeline.api, "GET", f"{core}/secrets/mpi-ssh")
    assert set(secret["data"]) == {"id_rsa", "id_rsa.pub", "authorized_keys", "config"}
    hosts = (await kube.request(pipeline.api, "GET", f"{core}/configmaps/mpi-svc"))["data"]
    assert hosts["VC_WORKER_HOSTS"] == "mpi-worker-0.mpi,mpi-worker-1.mpi"
    assert (hosts["VC_WORKER_NUM"], hosts["master.host"]) == ("2", "mpi-master-0.mpi")
    service = await kube.request(pipeline.api, "GET", f"{core}/services/mpi")
    assert service["spec"]["clusterIP"] == "None"
    policy = f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/mpi"
    assert await exists(pipeline, policy)
    pod = await pipeline.get(ns, "mpi-worker-1")
    container = pod["spec"]["containers"][0]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/root/.ssh", "/etc/volcano"} <= mounts
    env = {e["name"]: e for e in container["env"]}
    assert env["VC_TASK_INDEX"]["value"] == "1"
    assert env["VC_MASTER_HOSTS"]["valueFrom"]["configMapKeyRef"]["name"] == "mpi-svc"
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("mpi-worker-1", "mpi")
    await kube.request(pipeline.api, "DELETE", f"{jobs_path(ns)}/mpi")

    async def cleaned() -> bool:
        return not any(
            [
                await exists(pipeline, f"{core}/secrets/mpi-ssh"),
                await exists(pipeline, f"{core}/configmaps/mpi-svc"),
                await exists(pipeline, f"{core}/services/mpi"),
                await exists(pipeline, policy),
                bool(await pods_of(pipeline, ns, "mpi")),
            ]
        )

    await eventually(cleaned, what="the Job's objects deleted with it")


async def test_volumes_and_scaling(pipeline: Pipeline, ns: str) -> None:
    """spec.volumes: a claim made for the Job and mounted in its pods; a claim it names
    that does not exist holds the pods, with a warning. Scaling a task makes or deletes
    pods and updates the PodGroup."""
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    body = vcjob("data", [task("w", 1)], volumes=[{"mountPath": "/data", "volumeClaim": claim}])
    await create(pipeline, ns, body)

    async def made() -> dict[str, Any] | None:
        try:
            return await pipeline.get(ns, "data-w-0")
        except ApiException:
            return None

    pod = await eventually(made, what="the pod made")
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert "/data" in mounts
    assert await exists(pipeline, f"/api/v1/namespaces/{ns}/persistentvolumeclaims/data-pvc-0")
    missing = vcjob(
        "nodata", [task("w")], volumes=[{"mountPath": "/in", "volumeClaimName": "none"}]
    )
    await create(pipeline, ns, missing)

    async def warned() -> bool:
        return any(e["reason"] == "PVCError" for e in await job_events(pipeline, ns, "nodata"))

    await eventually(warned, what="a PVCError Event")
    assert await pods_of(pipeline, ns, "nodata") == {}

    await create(pipeline, ns, vcjob("scaled", [task("w", 1)]))
    await pipeline.bound(ns, "scaled-w-0")
    spec = (await job(pipeline, ns, "scaled"))["spec"]

    async def scale(replicas: int) -> None:
        spec["tasks"][0]["replicas"] = spec["minAvailable"] = replicas
        await kube.request(
            pipeline.api,
            "PATCH",
            f"{jobs_path(ns)}/scaled",
            {"spec": spec},
            content_type="application/merge-patch+json",
        )

    await scale(2)
    await pipeline.bound(ns, "scaled-w-1")
    group = await kube.request(
        pipeline.api, "GET", f"{SCHEDULING}/namespaces/{ns}/podgroups/scaled"
    )
    assert group["spec"]["minMember"] == 2
    await scale(1)

    async def shrunk() -> bool:
        return set(await pods_of(pipeline, ns, "scaled")) == {"scaled-w-0"}

    await eventually(shrunk, what="the second pod deleted")


async def test_a_restarted_controller_goes_on_from_the_jobs_status(
    pipeline: Pipeline, ns: str
) -> None:
    """The retry count and version come back from the Job's status: a failure after
    the controller restarted is the second, not the first."""
    body = vcjob(
        "again", [task("w")], maxRetry=5, policies=[{"event": "PodFailed", "action": "RestartJob"}]
    )
    await create(pipeline, ns, body)
    await run_all(pipeline, ns, ["again-w-0"])
    await kubelet_says(pipeline, ns, "again-w-0", "Failed", exit_code=1)

    async def once() -> bool:
        return (await status(pipeline, ns, "again")).get("retryCount") == 1

    await eventually(once, what="retryCount 1")
    await reaches(pipeline, ns, "again", "Pending")
    starts = pipeline.log("job-controller").count("jobs taken on")
    pipeline.kill(await pipeline.active("job-controller"))

    async def taken_on() -> bool:  # by the standby, at once: not at the next re-announcement
        return pipeline.log("job-controller").count("jobs taken on") > starts

    await eventually(taken_on, timeout_s=20, what="the Jobs taken on by the new active one")
    await run_all(pipeline, ns, ["again-w-0"])
    await kubelet_says(pipeline, ns, "again-w-0", "Failed", exit_code=1)

    async def twice() -> bool:
        return (await status(pipeline, ns, "again")).get("retryCount") == 2

    await eventually(twice, timeout_s=30, what="retryCount 2 from the restarted controller")
