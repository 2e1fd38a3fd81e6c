"""The API calls the job-controller makes: reading and listing Volcano Jobs, writing a
Job's status, its Events (``kubectl describe vcjob``), deleting its pods and the Job
itself, and creating, patching and deleting what it makes, each with the answers the
controller expects (already there, already gone) taken as done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from kubernetes_asyncio.client import ApiException

from services.job_controller.podview import OUT_OF_SYNC
from services.job_controller.status import merge_patch
from services.job_controller.tracked import Tracked
from shared import kube

log = logging.getLogger(__name__)

BATCH = "/apis/batch.volcano.sh/v1alpha1"
API_ERRORS: tuple[type[Exception], ...] = (ApiException, *kube.UNREACHABLE)
"""What an API call off the bus may fail with and be tried again for."""


def closing(exc: ApiException) -> bool:
    """Refused because the namespace is being deleted (nothing more to make there)."""
    return exc.status == 403 and "being terminated" in kube.refusal(exc).message


class JobApi:
    """The controller's calls to the API server, as one replica (``instance``) of
    ``component`` deleting pods with a grace period of ``grace_s``."""

    def __init__(
        self,
        client: Callable[[], kube.Client],
        component: str,
        instance: str,
        grace_s: int | None,
    ) -> None:
        self.client = client
        """The API server, asked for on each call (shared/runtime.py ``Service.api``: a
        service may be made without one, as tests/service/test_monitoring.py makes it)."""
        self.component = component
        self.instance = instance
        self.grace_s = grace_s
        """Grace period of the pods it deletes (``scheduler.evictionGraceS``)."""

    # --- Jobs --------------------------------------------------------------------------

    async def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Job as the API server has it; None when it is gone."""
        try:
            obj: dict[str, Any] = await kube.request(
                self.client(), "GET", f"{BATCH}/namespaces/{namespace}/jobs/{name}"
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def list_jobs(self) -> list[dict[str, Any]]:
        """Every Volcano Job; none while there is no Job CRD (yet)."""
        try:
            items, _ = await kube.list_all(self.client(), f"{BATCH}/jobs")
        except ApiException as exc:
            if exc.status != 404:
                raise
            return []
        return items

    async def write_status(self, tracked: Tracked) -> None:
        """Write what changed of the Job's status since it was last written."""
        status = tracked.status.to_api()
        patch = merge_patch(tracked.written, status)
        if not patch:
            return
        path = f"{BATCH}/namespaces/{tracked.namespace}/jobs/{tracked.name}/status"
        if await kube.patch_status(self.client(), path, patch):
            tracked.written = status

    async def delete_job(self, tracked: Tracked) -> None:
        """Delete the Job, this one only (never a namesake made since)."""
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": tracked.uid},
        }
        path = f"{BATCH}/namespaces/{tracked.namespace}/jobs/{tracked.name}"
        await kube.request(self.client(), "DELETE", path, options)

    async def event(
        self,
        tracked: Tracked,
        reason: str,
        message: str,
        kind: Literal["Normal", "Warning"] = "Normal",
    ) -> None:
        """An Event on the Job (``kubectl describe vcjob`` shows it), as Volcano's
        controller records them."""
        involved = {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "name": tracked.name,
            "namespace": tracked.namespace,
            "uid": tracked.uid,
        }
        body = kube.event_body(
            involved,
            reason=reason,
            message=message,
            kind=kind,
            source="vc-controller-manager",
            reporter=f"{kube.REPORTING_COMPONENT}/{self.component}",
            instance=self.instance,
        )
        try:
            await kube.request(
                self.client(), "POST", f"/api/v1/namespaces/{tracked.namespace}/events", body
            )
        except ApiException as exc:
            if exc.status != 404 and not closing(exc):
                log.warning(
                    "cannot tell job %s/%s (%s): API error %s",
                    tracked.namespace,
                    tracked.name,
                    reason,
                    exc.status,
                )

    async def warn(self, tracked: Tracked, reason: str, message: str) -> None:
        """A Warning Event, once per distinct message."""
        if message not in tracked.told:
            tracked.told.add(message)
            await self.event(tracked, reason, message, "Warning")

    # --- pods --------------------------------------------------------------------------

    async def kill_pod(self, tracked: Tracked, name: str) -> None:
        """Mark the pod as the controller's own deletion (its end is no event of the
        Job), then delete it."""
        path = f"/api/v1/namespaces/{tracked.namespace}/pods/{name}"
        try:
            await self.patch(path, {"metadata": {"annotations": {OUT_OF_SYNC: "true"}}})
            await self.delete_pod(tracked.namespace, name)
        except ApiException as exc:
            if exc.status == 404:
                return
            await self.event(
                tracked, "FailedDeletePod", f"Error deleting pod {name}: {exc.status}", "Warning"
            )
            raise

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod of a Job with the controller's grace period."""
        await kube.delete_pod(self.client(), namespace, name, grace_s=self.grace_s)

    # --- any object --------------------------------------------------------------------

    async def create(self, path: str, body: dict[str, Any]) -> bool:
        """Create ``body`` in ``path``; False when it exists already."""
        try:
            await kube.request(self.client(), "POST", path, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        return True

    async def patch(self, path: str, body: dict[str, Any]) -> None:
        """Merge ``body`` into the object at ``path``."""
        await kube.request(
            self.client(), "PATCH", path, body, content_type="application/merge-patch+json"
        )

    async def exists(self, path: str) -> bool:
        """Whether there is an object at ``path``."""
        try:
            await kube.request(self.client(), "GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def delete(self, path: str) -> None:
        """Delete the object at ``path``, if it is there."""
        try:
            await kube.request(self.client(), "DELETE", path)
        except ApiException as exc:
            if exc.status != 404:
                raise
