"""Helpers for Volcano Job tests on the real API server: Jobs as users write them, and
a pod's status written through its status subresource as its kubelet would (where no
real node runs it)."""

from __future__ import annotations

from typing import Any

from shared import kube
from tests.helpers import eventually
from tests.integration.pipeline import Pipeline

BATCH = "/apis/batch.volcano.sh/v1alpha1"


def jobs_path(ns: str) -> str:
    return f"{BATCH}/namespaces/{ns}/jobs"


def vcjob(name: str, tasks: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A Job of ``tasks`` (see :func:`task`) for Volcano's scheduler name."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"schedulerName": "volcano", "queue": "default", "tasks": tasks, **spec},
    }


def task(
    name: str,
    replicas: int = 1,
    *,
    image: str = "busybox",
    command: list[str] | None = None,
    **more: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image}
    if command is not None:
        container["command"] = command
    return {
        "name": name,
        "replicas": replicas,
        "template": {"spec": {"containers": [container], "restartPolicy": "Never"}},
        **more,
    }


async def job(p: Pipeline, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await kube.request(p.api, "GET", f"{jobs_path(ns)}/{name}")
    return found


async def status(p: Pipeline, ns: str, name: str) -> dict[str, Any]:
    return dict((await job(p, ns, name)).get("status") or {})


async def phase_of(p: Pipeline, ns: str, name: str) -> str:
    return str(((await status(p, ns, name)).get("state") or {}).get("phase", ""))


async def reaches(
    p: Pipeline, ns: str, name: str, phase: str, timeout_s: float = 30
) -> dict[str, Any]:
    """The Job's status once its phase is ``phase``."""
    last: dict[str, Any] = {}

    async def there() -> dict[str, Any] | None:
        nonlocal last
        last = await status(p, ns, name)
        return last if (last.get("state") or {}).get("phase") == phase else None

    try:
        return await eventually(there, timeout_s=timeout_s, what=f"job {ns}/{name} {phase}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its status: {last}") from None


async def pods_of(p: Pipeline, ns: str, name: str) -> dict[str, dict[str, Any]]:
    found = await kube.request(
        p.api,
        "GET",
        f"/api/v1/namespaces/{ns}/pods",
        query={"labelSelector": f"volcano.sh/job-name={name}"},
    )
    return {o["metadata"]["name"]: o for o in found["items"]}


async def job_events(p: Pipeline, ns: str, name: str) -> list[dict[str, Any]]:
    found = await kube.request(
        p.api,
        "GET",
        f"/api/v1/namespaces/{ns}/events",
        query={"fieldSelector": f"involvedObject.name={name},involvedObject.kind=Job"},
    )
    items: list[dict[str, Any]] = found["items"]
    return items


async def kubelet_says(
    p: Pipeline,
    ns: str,
    name: str,
    phase: str,
    *,
    ready: bool = True,
    exit_code: int | None = None,
    restarts: int = 0,
) -> None:
    """Write the pod's status as its kubelet would: the phase, and its one container
    running (ready or not) or terminated with ``exit_code``."""
    now = kube.now_rfc3339()
    state: dict[str, Any] = {"running": {"startedAt": now}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "startedAt": now, "finishedAt": now}}
    elif phase == "Pending":
        state = {"waiting": {"reason": "ContainerCreating"}}
    pod = await p.get(ns, name)
    container = pod["spec"]["containers"][0]
    await kube.request(
        p.api,
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{name}/status",
        {
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": container["name"],
                        "image": container["image"],
                        "imageID": "",
                        "ready": ready and phase == "Running",
                        "restartCount": restarts,
                        "state": state,
                    }
                ],
            }
        },
        content_type="application/merge-patch+json",
    )


async def run_all(p: Pipeline, ns: str, names: list[str], phase: str = "Running") -> None:
    """Each pod bound (by Tessera), then in ``phase`` as its kubelet would say."""
    for name in names:
        await p.bound(ns, name)
        await kubelet_says(p, ns, name, phase, exit_code=0 if phase == "Succeeded" else None)
