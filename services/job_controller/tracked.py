"""One Volcano Job of the controller's as it knows it (:class:`Tracked`): its spec as
written and as read with Volcano's defaults, its status, and what was last written for
it (the status, its PodGroup, the svc plugin's hosts, its warnings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.job_controller.made import JobRef
from services.job_controller.status import Status, read_status
from shared import events as ev
from shared.core import vcjob

JobKey = tuple[str, str]
"""(namespace, name) of a Job."""


@dataclass
class Tracked:
    """One Job of ours as the controller knows it."""

    namespace: str
    name: str
    uid: str
    raw: dict[str, Any]
    """Its spec as written."""
    spec: vcjob.JobSpec | None
    """Its spec with Volcano's defaults; None while it breaks a rule."""
    status: Status
    written: dict[str, Any]
    """The status as last written (a merge patch writes only what changed)."""
    podgroup: str | None = None
    """The PodGroup body last written; None: not known to exist."""
    podgroup_unsure: bool = True
    """It may exist though this replica has not written it (written before a restart)."""
    hosts: dict[str, str] = field(default_factory=dict)
    """The svc plugin's ConfigMap data as last written."""
    broken: bool = False
    """Some pods run while another cannot be placed (Volcano's PodGroup Unknown)."""
    told: set[str] = field(default_factory=set)
    """Warnings already posted (one Event per distinct one)."""
    meta: dict[str, dict[str, str]] = field(default_factory=dict)
    """Its annotations and labels when first read (some pass to its pods)."""
    expiring: bool = False
    """Its ``ttlSecondsAfterFinished`` deletion is timed."""
    retrying: bool = False
    """A sync is timed (services/job_controller/runner.py ``RETRY_S``): the last one
    left something undone."""

    @classmethod
    def read(cls, job: ev.JobUpdated, obj: dict[str, Any]) -> Tracked:
        """The Job of ``job`` as read from the API server (``obj``): its status as
        written (a restarted controller goes on from its retry count and version)."""
        written = obj.get("status") or {}
        tracked = cls(
            job.namespace, job.name, job.uid, job.spec, None, read_status(written), written
        )
        meta = obj["metadata"]
        tracked.meta = {k: dict(meta.get(k) or {}) for k in ("annotations", "labels")}
        return tracked

    @property
    def ref(self) -> JobRef:
        """The Job as the objects made for it name it."""
        return JobRef(
            self.namespace,
            self.name,
            self.uid,
            self.meta.get("annotations") or {},
            self.meta.get("labels") or {},
        )

    @property
    def key(self) -> JobKey:
        """Its (namespace, name)."""
        return (self.namespace, self.name)
