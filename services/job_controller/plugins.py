"""What a Volcano Job's pods and side objects look like: each pod from its task's
template, as Volcano's controller makes it, and the Job plugins (``spec.plugins``).

- ``env``: ``VC_TASK_INDEX`` and ``VK_TASK_INDEX`` in every container.
- ``svc``: a headless Service of the Job's name; each pod's ``hostname`` and
  ``subdomain``; a ConfigMap ``<job>-svc`` of every task's hosts (``<task>.host``, one
  per line; ``VC_<TASK>_HOSTS``, comma separated; ``VC_<TASK>_NUM``), mounted at
  ``/etc/volcano`` and read into the environment; a NetworkPolicy letting in only the
  Job's own pods. Arguments: ``--publish-not-ready-addresses``,
  ``--disable-network-policy``, ``--inject-hosts-env=false``.
- ``ssh``: a Secret ``<job>-ssh`` with a fresh RSA key pair, ``authorized_keys`` and an
  ssh ``config`` naming every pod, mounted at ``/root/.ssh``. Arguments:
  ``--ssh-key-file-path``, ``--ssh-private-key``/``--ssh-public-key`` (the user's own
  keys), ``--ssh-port``.
- ``pytorch``: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` (the master
  0, worker ``i`` ``i+1``) and the port opened; ``--master``, ``--worker``, ``--port``
  (23456), ``--wait-master-enabled`` (workers first wait for the master's port).
- ``mpi``: the master's ``MPI_HOST`` (the workers' hosts) and the port opened in every
  container; ``--master``, ``--worker``, ``--port`` (22).
- ``tensorflow``: ``TF_CONFIG`` (the cluster's ps, worker, chief and evaluator hosts and
  the pod's own role and index); ``--ps``, ``--worker``, ``--chief``, ``--evaluator``,
  ``--port`` (2222).

Volcano's ``ray`` and ``hcclrank`` plugins are accepted and not run (docs/compat.md).

Pure but for :func:`ssh_keys` (randomness); the service makes and deletes the objects.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from services.job_controller import lifecycle as lc
from shared.core import vcjob
from shared.core.request import GROUP_NAME

IMPLEMENTED = ("env", "svc", "ssh", "pytorch", "mpi", "tensorflow")
SSH_PATH = "/root/.ssh"
SSH_DIR = ".ssh"
SSH_FILES = ("id_rsa", "id_rsa.pub", "authorized_keys", "config")
SVC_MOUNT = "/etc/volcano"


NUMA_POLICY = "volcano.sh/numa-topology-policy"
FROM_JOB = (
    "volcano.sh/preemptable",
    "volcano.sh/cooldown-time",
    "volcano.sh/revocable-zone",
    "volcano.sh/jdb-min-available",
    "volcano.sh/jdb-max-unavailable",
)
"""Annotations a Job passes to its pods (the last two: only one, min-available first);
the first two as labels too."""


@dataclass(frozen=True)
class JobRef:
    """The Job as its objects name it (and what of its metadata its pods inherit)."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    def owner(self) -> list[dict[str, Any]]:
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


COLLECTIONS = {
    "ConfigMap": "/api/v1/namespaces/{}/configmaps",
    "Service": "/api/v1/namespaces/{}/services",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{}/networkpolicies",
    "Secret": "/api/v1/namespaces/{}/secrets",
    "PersistentVolumeClaim": "/api/v1/namespaces/{}/persistentvolumeclaims",
}
MADE = {
    "svc": (("ConfigMap", "{}-svc"), ("Service", "{}"), ("NetworkPolicy", "{}")),
    "ssh": (("Secret", "{}-ssh"),),
}
"""What each plugin may make for a Job: kind, name (``{}``: the Job's)."""


@dataclass(frozen=True)
class Made:
    """An object made for a Job (by a plugin, or a claim for its volumes)."""

    namespace: str
    body: dict[str, Any]

    @property
    def collection(self) -> str:
        return COLLECTIONS[self.body["kind"]].format(self.namespace)

    @property
    def path(self) -> str:
        return f"{self.collection}/{self.body['metadata']['name']}"


def made_paths(ref: JobRef, plugin: str) -> list[str]:
    """Where ``plugin``'s objects of the Job are (what to delete)."""
    return [
        f"{COLLECTIONS[kind].format(ref.namespace)}/{name.format(ref.name)}"
        for kind, name in MADE.get(plugin, ())
    ]


def pod(
    ref: JobRef, job: vcjob.JobSpec, task: vcjob.Task, index: int, status: lc.Status
) -> dict[str, Any]:
    """The pod ``<job>-<task>-<index>`` from its task's template, with Volcano's labels
    and annotations, the Job's scheduler name, priority class and volumes, and what
    each plugin adds."""
    template = copy.deepcopy(dict(task.template))
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    name = task.pod_name(ref.name, index)
    labels = {
        **(meta.get("labels") or {}),
        lc.TASK_INDEX: str(index),
        lc.JOB_NAME: ref.name,
        lc.TASK_SPEC: task.name,
        lc.JOB_NAMESPACE: ref.namespace,
        lc.QUEUE_NAME: job.queue,
    }
    annotations = {
        **(meta.get("annotations") or {}),
        lc.TASK_INDEX: str(index),
        lc.TASK_SPEC: task.name,
        GROUP_NAME: ref.name,
        lc.JOB_NAME: ref.name,
        lc.QUEUE_NAME: job.queue,
        lc.JOB_VERSION: str(status.version),
        lc.TEMPLATE_KEY: f"{ref.name}-{task.name}",
        lc.RETRY_COUNT: str(status.retry_count),
    }
    if task.topology_policy:
        annotations[NUMA_POLICY] = task.topology_policy
    inherited = [k for k in FROM_JOB if k in ref.annotations]
    if {FROM_JOB[3], FROM_JOB[4]} <= set(inherited):
        inherited.remove(FROM_JOB[4])  # a disruption budget of one kind: min-available
    annotations |= {k: ref.annotations[k] for k in inherited}
    labels |= {k: ref.labels[k] for k in FROM_JOB[:2] if k in ref.labels}
    if not spec.get("schedulerName"):
        spec["schedulerName"] = job.scheduler_name
    if not spec.get("priorityClassName") and job.priority_class:
        spec["priorityClassName"] = job.priority_class
    for i, volume in enumerate(job.volumes):
        volume_name = f"{ref.name}-volume-{i}"
        spec.setdefault("volumes", []).append(
            {"name": volume_name, "persistentVolumeClaim": {"claimName": claim_name(ref, i, job)}}
        )
        for c in spec.get("containers") or []:
            mount = {"name": volume_name, "mountPath": volume.mount_path}
            c.setdefault("volumeMounts", []).append(mount)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": ref.owner(),
        },
        "spec": spec,
    }
    plugins = job.plugins
    if "env" in plugins:
        _env(spec, index)
    if "svc" in plugins:
        _svc_pod(spec, ref, job, name, vcjob.plugin_flags(plugins["svc"]))
    if "ssh" in plugins:
        _ssh_pod(spec, ref, vcjob.plugin_flags(plugins["ssh"]))
    if "pytorch" in plugins:
        _pytorch(spec, ref, job, task, index, vcjob.plugin_flags(plugins["pytorch"]))
    if "mpi" in plugins:
        _mpi(spec, ref, job, task, vcjob.plugin_flags(plugins["mpi"]))
    if "tensorflow" in plugins:
        _tensorflow(spec, ref, job, task, index, vcjob.plugin_flags(plugins["tensorflow"]))
    return body


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


def _env(spec: dict[str, Any], index: int) -> None:
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            c.setdefault("env", []).extend(
                [
                    {"name": "VK_TASK_INDEX", "value": str(index)},
                    {"name": "VC_TASK_INDEX", "value": str(index)},
                ]
            )


def _host_env(task: str) -> tuple[str, str]:
    key = task.replace("-", "_").upper()
    return f"VC_{key}_HOSTS", f"VC_{key}_NUM"


def _svc_pod(
    spec: dict[str, Any], ref: JobRef, job: vcjob.JobSpec, name: str, flags: Mapping[str, str]
) -> None:
    spec["hostname"] = spec.get("hostname") or name
    spec["subdomain"] = spec.get("subdomain") or ref.name
    config = f"{ref.name}-svc"
    if flags.get("inject-hosts-env", "true") != "false":
        env = [
            {"name": key, "valueFrom": {"configMapKeyRef": {"name": config, "key": key}}}
            for task in job.tasks
            for key in _host_env(task.name)
        ]
        for key in ("containers", "initContainers"):
            for c in spec.get(key) or []:
                c.setdefault("env", []).extend(copy.deepcopy(env))
    spec.setdefault("volumes", []).append({"name": config, "configMap": {"name": config}})
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            c.setdefault("volumeMounts", []).append({"name": config, "mountPath": SVC_MOUNT})


def _ssh_pod(spec: dict[str, Any], ref: JobRef, flags: Mapping[str, str]) -> None:
    secret = f"{ref.name}-ssh"
    path = flags.get("ssh-key-file-path", SSH_PATH)
    spec.setdefault("volumes", []).append(
        {
            "name": secret,
            "secret": {
                "secretName": secret,
                "items": [{"key": f, "path": f"{SSH_DIR}/{f}"} for f in SSH_FILES],
                # 0600 where ssh reads the keys as root; a user's own path is readable
                "defaultMode": 0o600 if path == SSH_PATH else 0o644,
            },
        }
    )
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            mount = {"name": secret, "mountPath": path, "subPath": SSH_DIR}
            c.setdefault("volumeMounts", []).append(mount)


def _port(flags: Mapping[str, str], default: int) -> int:
    text = flags.get("port", "")
    return int(text) if text.isdigit() and 0 < int(text) <= 65535 else default


def _open_port(spec: dict[str, Any], name: str, port: int, keys: tuple[str, ...]) -> None:
    for key in keys:
        for c in spec.get(key) or []:
            ports = c.setdefault("ports", [])
            if not any(p.get("containerPort") == port for p in ports):
                ports.append({"name": name, "containerPort": port})


def _add_env(spec: dict[str, Any], env: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    for key in keys:
        for c in spec.get(key) or []:
            c.setdefault("env", []).extend(copy.deepcopy(env))


def _pytorch(
    spec: dict[str, Any],
    ref: JobRef,
    job: vcjob.JobSpec,
    task: vcjob.Task,
    index: int,
    flags: Mapping[str, str],
) -> None:
    master_name, worker_name = flags.get("master", "master"), flags.get("worker", "worker")
    master = job.task(master_name)
    if master is None:
        return  # Volcano does nothing without the master task
    port = _port(flags, 23456)
    address = _domain(ref, master, 0)
    world = sum(t.replicas for t in job.tasks if t.name in (master_name, worker_name))
    env = [
        {"name": "MASTER_ADDR", "value": address},
        {"name": "MASTER_PORT", "value": str(port)},
        {"name": "WORLD_SIZE", "value": str(world)},
    ]
    if task.name == master_name:
        env.append({"name": "RANK", "value": "0"})
    elif task.name == worker_name:
        env.append({"name": "RANK", "value": str(index + 1)})
        if _flag(flags, "wait-master-enabled"):
            timeout = flags.get("wait-master-timeout", "300")
            timeout = timeout if timeout.isdigit() else "300"
            wait = (
                f"end=$(( $(date +%s) + {timeout} )); "
                f"until nc -z {address} {port}; do "
                f'[ "$(date +%s)" -ge "$end" ] && echo "no master at {address}:{port}" && exit 1; '
                "sleep 2; done"
            )
            image = flags.get("wait-master-image", "busybox:1.36.1")
            inits = spec.setdefault("initContainers", [])
            if not any(c.get("name") == "wait-for-master" for c in inits):
                inits.append(
                    {"name": "wait-for-master", "image": image, "command": ["sh", "-c", wait]}
                )
    _open_port(spec, "pytorchjob-port", port, ("containers",))
    _add_env(spec, env, ("containers",))


def _mpi(
    spec: dict[str, Any],
    ref: JobRef,
    job: vcjob.JobSpec,
    task: vcjob.Task,
    flags: Mapping[str, str],
) -> None:
    _open_port(spec, "mpijob-port", _port(flags, 22), ("initContainers", "containers"))
    if task.name != flags.get("master", "master"):
        return
    workers = job.task(flags.get("worker", "worker"))
    if workers is None:
        return
    env = [{"name": "MPI_HOST", "value": ",".join(_task_hosts(ref, workers))}]
    _add_env(spec, env, ("initContainers", "containers"))


def _tensorflow(
    spec: dict[str, Any],
    ref: JobRef,
    job: vcjob.JobSpec,
    task: vcjob.Task,
    index: int,
    flags: Mapping[str, str],
) -> None:
    if len(job.tasks) == 1 and job.tasks[0].replicas == 1:
        return  # a lone TensorFlow pod needs no cluster
    port = _port(flags, 2222)
    roles = {flags.get(r, r): r for r in ("ps", "worker", "chief", "evaluator")}
    cluster = {
        roles[t.name]: [f"{_domain(ref, t, i)}:{port}" for i in range(t.replicas)]
        for t in job.tasks
        if t.name in roles and t.replicas
    }
    config = {"cluster": cluster, "task": {"type": roles.get(task.name, task.name), "index": index}}
    _add_env(spec, [{"name": "TF_CONFIG", "value": json.dumps(config)}], ("containers",))


def _domain(ref: JobRef, task: vcjob.Task, index: int) -> str:
    """The DNS name of a task's pod ``index`` (its template's own hostname and
    subdomain, else the pod's name and the Job's)."""
    spec = task.template.get("spec") or {}
    host = spec.get("hostname") or task.pod_name(ref.name, index)
    return f"{host}.{spec.get('subdomain') or ref.name}"


def hosts(ref: JobRef, job: vcjob.JobSpec) -> dict[str, str]:
    """The svc plugin's ConfigMap data: each task's pods' DNS names (one when the
    template names its own hostname: all its pods share it)."""
    data: dict[str, str] = {}
    for task in job.tasks:
        names = _task_hosts(ref, task)
        hosts_key, num_key = _host_env(task.name)
        data[f"{task.name.replace('-', '_')}.host"] = "\n".join(names)
        data[hosts_key] = ",".join(names)
        data[num_key] = str(len(names))
    return data


def _task_hosts(ref: JobRef, task: vcjob.Task) -> list[str]:
    """A task's pods' DNS names: one when its template names a hostname of its own
    (every pod of the task has it)."""
    own = (task.template.get("spec") or {}).get("hostname")
    count = min(task.replicas, 1) if own else task.replicas
    return [_domain(ref, task, i) for i in range(count)]


def ssh_config(ref: JobRef, job: vcjob.JobSpec, port: int) -> str:
    """The ssh plugin's ``config``: every pod by its short name, no host key checks
    (the keys are fresh for each Job)."""
    lines = ["StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"]
    for task in job.tasks:
        for host in _task_hosts(ref, task):
            short = host.split(".", 1)[0]
            lines += [f"Host {short}", f"  HostName {host}", f"  Port {port}"]
    return "\n".join(lines) + "\n"


def ssh_keys() -> tuple[str, str]:
    """A fresh RSA key pair: the PEM private key, the ``authorized_keys`` line."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private.decode(), public.decode() + "\n"


def objects(ref: JobRef, job: vcjob.JobSpec, plugin: str) -> list[Made]:
    """What ``plugin`` makes for the Job before its pods (nothing for ``env``)."""
    ns, flags = ref.namespace, vcjob.plugin_flags(job.plugins.get(plugin, ()))
    meta = {"ownerReferences": ref.owner()}
    if plugin == "svc":
        selector = {lc.JOB_NAME: ref.name, lc.JOB_NAMESPACE: ns}
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
                        "publishNotReadyAddresses": _flag(flags, "publish-not-ready-addresses"),
                    },
                },
            ),
        ]
        if not _flag(flags, "disable-network-policy"):
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
    if plugin == "ssh":
        port = int(flags.get("ssh-port", "22")) if flags.get("ssh-port", "").isdigit() else 22
        port = port if 0 < port <= 65535 else 22
        private, public = flags.get("ssh-private-key", ""), flags.get("ssh-public-key", "")
        if not private:
            private, public = ssh_keys()
        data = {
            "id_rsa": private,
            "id_rsa.pub": public,
            "authorized_keys": public,
            "config": ssh_config(ref, job, port),
        }
        return [
            Made(
                ns,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": f"{ref.name}-ssh", **meta},
                    "stringData": data,
                },
            )
        ]
    return []


def _flag(flags: Mapping[str, str], name: str) -> bool:
    return flags.get(name, "false").lower() in ("true", "1", "t")


def podgroup(ref: JobRef, job: vcjob.JobSpec) -> dict[str, Any]:
    """The Job's PodGroup: its name, ``minMember`` = ``minAvailable``, the queue and
    priority class, and each task's ``minAvailable`` as ``minTaskMember`` where
    Volcano's scheduler holds a gang to it: when the Job's ``minAvailable`` is at least
    the tasks' together (below, Volcano checks no task's, and a task that ``dependsOn``
    another could never start beside it)."""
    spec: dict[str, Any] = {
        "minMember": job.min_available,
        "queue": job.queue,
        "priorityClassName": job.priority_class,
    }
    if job.min_available >= job.task_min_available:
        spec["minTaskMember"] = {t.name: t.min_available for t in job.tasks}
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": ref.name, "ownerReferences": ref.owner()},
        "spec": spec,
    }


def digest(body: Mapping[str, Any]) -> str:
    """A stable text of an object's body (what changed since it was written)."""
    return json.dumps(body, sort_keys=True)
