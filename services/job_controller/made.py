"""The objects the controller makes for a Volcano Job, as API bodies: :class:`JobRef`
(how they name and own it), :class:`Made` (one object and where it goes), and the
claims of its volumes (``volumeClaim``). The plugins' objects are
services/job_controller/plugins/'s, its PodGroup services/job_controller/podgroup.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.core import vcjob

COLLECTIONS = {
    "ConfigMap": "/api/v1/namespaces/{}/configmaps",
    "Service": "/api/v1/namespaces/{}/services",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{}/networkpolicies",
    "Secret": "/api/v1/namespaces/{}/secrets",
    "PersistentVolumeClaim": "/api/v1/namespaces/{}/persistentvolumeclaims",
}
"""Where the objects of each kind the controller makes are, by namespace."""


@dataclass(frozen=True)
class JobRef:
    """The Job as its objects name it (and what of its metadata its pods inherit)."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    def owner(self) -> list[dict[str, Any]]:
        """The ``ownerReferences`` of what is made for the Job: the Job, controlling."""
        return [
            {
                "apiVersion": "batch.volcano.sh/v1alpha1",
                "kind": "Job",
                "name": self.name,
                "uid": self.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


@dataclass(frozen=True)
class Made:
    """An object made for a Job (by a plugin, or a claim for its volumes)."""

    namespace: str
    body: dict[str, Any]

    @property
    def collection(self) -> str:
        """The path it is created in."""
        return COLLECTIONS[self.body["kind"]].format(self.namespace)

    @property
    def path(self) -> str:
        """Its own path (what to delete)."""
        return f"{self.collection}/{self.body['metadata']['name']}"


def claim_name(ref: JobRef, index: int, job: vcjob.JobSpec) -> str:
    """The claim of the Job's volume ``index``: the one it names, or the one the
    controller makes for it (named after the Job and the volume, so a restart of the
    controller finds it again)."""
    volume = job.volumes[index]
    return volume.claim_name or f"{ref.name}-pvc-{index}"


def claims(ref: JobRef, job: vcjob.JobSpec) -> list[Made]:
    """The PersistentVolumeClaims the Job asks to be made (``volumeClaim``)."""
    out = []
    for i, volume in enumerate(job.volumes):
        if volume.claim is None or volume.claim_name:
            continue
        body = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim_name(ref, i, job), "ownerReferences": ref.owner()},
            "spec": dict(volume.claim),
        }
        out.append(Made(ref.namespace, body))
    return out
