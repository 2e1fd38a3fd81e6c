"""Volcano's ``svc`` plugin: a headless Service of the Job's name; each pod's
``hostname`` and ``subdomain``; a ConfigMap ``<job>-svc`` of every task's hosts
(``<task>.host``, one per line; ``VC_<TASK>_HOSTS``, comma separated; ``VC_<TASK>_NUM``),
mounted at ``/etc/volcano`` and read into the environment; a NetworkPolicy letting in
only the Job's own pods. Flags: ``--publish-not-ready-addresses``,
``--disable-network-policy``, ``--inject-hosts-env=false``.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.job_controller.made import JobRef, Made
from services.job_controller.plugins.common import (
    EVERY_CONTAINER,
    PodDraft,
    add_env,
    add_mount,
    flag,
    task_hosts,
)
from services.job_controller.podview import JOB_NAME, JOB_NAMESPACE
from shared.core import vcjob

MOUNT = "/etc/volcano"


def _host_env(task: str) -> tuple[str, str]:
    key = task.replace("-", "_").upper()
    return f"VC_{key}_HOSTS", f"VC_{key}_NUM"


def on_pod(pod: PodDraft, flags: Mapping[str, str]) -> None:
    """The pod's hostname and subdomain, and the hosts ConfigMap in its environment
    (unless ``--inject-hosts-env=false``) and at ``/etc/volcano``."""
    spec, ref = pod.spec, pod.ref
    spec["hostname"] = spec.get("hostname") or pod.name
    spec["subdomain"] = spec.get("subdomain") or ref.name
    config = f"{ref.name}-svc"
    if flags.get("inject-hosts-env", "true") != "false":
        env = [
            {"name": key, "valueFrom": {"configMapKeyRef": {"name": config, "key": key}}}
            for task in pod.job.tasks
            for key in _host_env(task.name)
        ]
        add_env(spec, env, EVERY_CONTAINER)
    spec.setdefault("volumes", []).append({"name": config, "configMap": {"name": config}})
    add_mount(spec, {"name": config, "mountPath": MOUNT}, EVERY_CONTAINER)


def hosts(ref: JobRef, job: vcjob.JobSpec) -> dict[str, str]:
    """The ConfigMap's data: each task's pods' DNS names (one when the template names
    its own hostname: all its pods share it)."""
    data: dict[str, str] = {}
    for task in job.tasks:
        names = task_hosts(ref, task)
        hosts_key, num_key = _host_env(task.name)
        data[f"{task.name.replace('-', '_')}.host"] = "\n".join(names)
        data[hosts_key] = ",".join(names)
        data[num_key] = str(len(names))
    return data


def objects(ref: JobRef, job: vcjob.JobSpec, flags: Mapping[str, str]) -> list[Made]:
    """The hosts ConfigMap, the headless Service and (unless
    ``--disable-network-policy``) the NetworkPolicy."""
    ns, meta = ref.namespace, {"ownerReferences": ref.owner()}
    selector = {JOB_NAME: ref.name, JOB_NAMESPACE: ns}
    made = [
        Made(
            ns,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"{ref.name}-svc", **meta},
                "data": hosts(ref, job),
            },
        ),
        Made(
            ns,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": ref.name, **meta},
                "spec": {
                    "clusterIP": "None",
                    "selector": selector,
                    "publishNotReadyAddresses": flag(flags, "publish-not-ready-addresses"),
                },
            },
        ),
    ]
    if not flag(flags, "disable-network-policy"):
        rule = {"from": [{"podSelector": {"matchLabels": selector}}]}
        made.append(
            Made(
                ns,
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "metadata": {"name": ref.name, **meta},
                    "spec": {
                        "podSelector": {"matchLabels": selector},
                        "ingress": [rule],
                        "policyTypes": ["Ingress"],
                    },
                },
            )
        )
    return made
