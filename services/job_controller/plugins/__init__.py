"""The Volcano Job plugins (``spec.plugins``) Tessera's job-controller runs, one module
a plugin or family: ``env`` (env.py), ``svc`` (svc.py), ``ssh`` (ssh.py), ``pytorch``,
``mpi`` and ``tensorflow`` (frameworks.py). Each adds to the pods it is run for
(:func:`on_pod`); ``svc`` and ``ssh`` also make objects before the Job's pods
(:func:`objects`), which go when the Job is killed or deleted (:func:`made_paths`).

Volcano's ``ray`` and ``hcclrank`` plugins are accepted and not run (docs/compat.md).
Pure but for the ssh plugin's fresh keys; services/job_controller/resources.py makes
and deletes the objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from services.job_controller.made import COLLECTIONS, JobRef, Made
from services.job_controller.plugins import env, frameworks, ssh, svc
from services.job_controller.plugins.common import PodDraft
from shared.core import vcjob

ON_POD: dict[str, Callable[[PodDraft, Mapping[str, str]], None]] = {
    "env": env.on_pod,
    "svc": svc.on_pod,
    "ssh": ssh.on_pod,
    "pytorch": frameworks.pytorch,
    "mpi": frameworks.mpi,
    "tensorflow": frameworks.tensorflow,
}
"""What each plugin adds to a pod, in the order they add it."""
IMPLEMENTED = tuple(ON_POD)
OBJECTS: dict[str, Callable[[JobRef, vcjob.JobSpec, Mapping[str, str]], list[Made]]] = {
    "svc": svc.objects,
    "ssh": ssh.objects,
}
"""The plugins that make objects for a Job."""
MADE = {
    "svc": (("ConfigMap", "{}-svc"), ("Service", "{}"), ("NetworkPolicy", "{}")),
    "ssh": (("Secret", "{}-ssh"),),
}
"""What each plugin may make for a Job: kind, name (``{}``: the Job's)."""


def on_pod(pod: PodDraft) -> None:
    """What the Job's plugins add to ``pod``, each with its flags."""
    plugins = pod.job.plugins
    for plugin, add in ON_POD.items():
        if plugin in plugins:
            add(pod, vcjob.plugin_flags(plugins[plugin]))


def objects(ref: JobRef, job: vcjob.JobSpec, plugin: str) -> list[Made]:
    """What ``plugin`` makes for the Job before its pods (nothing for most)."""
    make = OBJECTS.get(plugin)
    if make is None:
        return []
    return make(ref, job, vcjob.plugin_flags(job.plugins.get(plugin, ())))


def made_paths(ref: JobRef, plugin: str) -> list[str]:
    """Where ``plugin``'s objects of the Job are (what to delete)."""
    return [
        f"{COLLECTIONS[kind].format(ref.namespace)}/{name.format(ref.name)}"
        for kind, name in MADE.get(plugin, ())
    ]
