"""Volcano's framework plugins, each the environment and port of one distributed
training framework:

- ``pytorch``: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` (the master
  0, worker ``i`` ``i+1``) and the port opened; ``--master``, ``--worker``, ``--port``
  (23456), ``--wait-master-enabled`` (workers first wait for the master's port).
- ``mpi``: the master's ``MPI_HOST`` (the workers' hosts) and the port opened in every
  container; ``--master``, ``--worker``, ``--port`` (22).
- ``tensorflow``: ``TF_CONFIG`` (the cluster's ps, worker, chief and evaluator hosts and
  the pod's own role and index); ``--ps``, ``--worker``, ``--chief``, ``--evaluator``,
  ``--port`` (2222).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from services.job_controller.plugins.common import (
    EVERY_CONTAINER,
    PodDraft,
    add_env,
    domain,
    flag,
    open_port,
    port,
    task_hosts,
)


def pytorch(pod: PodDraft, flags: Mapping[str, str]) -> None:
    """The master's address and port, the world size and the pod's rank; a worker
    first waits for the master's port with ``--wait-master-enabled``."""
    job, task, spec = pod.job, pod.task, pod.spec
    master_name, worker_name = flags.get("master", "master"), flags.get("worker", "worker")
    master = job.task(master_name)
    if master is None:
        return  # Volcano does nothing without the master task
    master_port = port(flags, 23456)
    address = domain(pod.ref, master, 0)
    world = sum(t.replicas for t in job.tasks if t.name in (master_name, worker_name))
    env = [
        {"name": "MASTER_ADDR", "value": address},
        {"name": "MASTER_PORT", "value": str(master_port)},
        {"name": "WORLD_SIZE", "value": str(world)},
    ]
    if task.name == master_name:
        env.append({"name": "RANK", "value": "0"})
    elif task.name == worker_name:
        env.append({"name": "RANK", "value": str(pod.index + 1)})
        if flag(flags, "wait-master-enabled"):
            timeout = flags.get("wait-master-timeout", "300")
            timeout = timeout if timeout.isdigit() else "300"
            wait = (
                f"end=$(( $(date +%s) + {timeout} )); "
                f"until nc -z {address} {master_port}; do "
                f'[ "$(date +%s)" -ge "$end" ] && echo "no master at {address}:{master_port}" '
                "&& exit 1; sleep 2; done"
            )
            image = flags.get("wait-master-image", "busybox:1.36.1")
            inits = spec.setdefault("initContainers", [])
            if not any(c.get("name") == "wait-for-master" for c in inits):
                inits.append(
                    {"name": "wait-for-master", "image": image, "command": ["sh", "-c", wait]}
                )
    open_port(spec, "pytorchjob-port", master_port, ("containers",))
    add_env(spec, env, ("containers",))


def mpi(pod: PodDraft, flags: Mapping[str, str]) -> None:
    """The port opened in every container; on the master, ``MPI_HOST``."""
    open_port(pod.spec, "mpijob-port", port(flags, 22), EVERY_CONTAINER)
    if pod.task.name != flags.get("master", "master"):
        return
    workers = pod.job.task(flags.get("worker", "worker"))
    if workers is None:
        return
    env = [{"name": "MPI_HOST", "value": ",".join(task_hosts(pod.ref, workers))}]
    add_env(pod.spec, env, EVERY_CONTAINER)


def tensorflow(pod: PodDraft, flags: Mapping[str, str]) -> None:
    """``TF_CONFIG``: the cluster by role and the pod's own role and index (none for a
    lone pod)."""
    job = pod.job
    if len(job.tasks) == 1 and job.tasks[0].replicas == 1:
        return  # a lone TensorFlow pod needs no cluster
    server_port = port(flags, 2222)
    roles = {flags.get(r, r): r for r in ("ps", "worker", "chief", "evaluator")}
    cluster = {
        roles[t.name]: [f"{domain(pod.ref, t, i)}:{server_port}" for i in range(t.replicas)]
        for t in job.tasks
        if t.name in roles and t.replicas
    }
    task = {"type": roles.get(pod.task.name, pod.task.name), "index": pod.index}
    config = {"cluster": cluster, "task": task}
    add_env(pod.spec, [{"name": "TF_CONFIG", "value": json.dumps(config)}], ("containers",))
