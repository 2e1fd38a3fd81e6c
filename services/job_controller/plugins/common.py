"""What the Job plugins share: :class:`PodDraft` (the pod a plugin adds to), the edits
they make to its containers (environment, mounts, ports), their flags, and the DNS
names of a Job's pods.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.job_controller.made import JobRef
from shared.core import vcjob

EVERY_CONTAINER = ("initContainers", "containers")
"""The pod spec's container lists, init containers first."""


@dataclass(frozen=True)
class PodDraft:
    """A pod being made for a task replica: its ``spec`` (plugins change it in place),
    its Job, task and index, and its name."""

    spec: dict[str, Any]
    ref: JobRef
    job: vcjob.JobSpec
    task: vcjob.Task
    index: int
    name: str


def add_env(spec: dict[str, Any], env: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """Append ``env`` to each container of the lists ``keys`` names."""
    for key in keys:
        for c in spec.get(key) or []:
            c.setdefault("env", []).extend(copy.deepcopy(env))


def add_mount(spec: dict[str, Any], mount: Mapping[str, str], keys: tuple[str, ...]) -> None:
    """Append the volume mount ``mount`` to each container of the lists ``keys`` names."""
    for key in keys:
        for c in spec.get(key) or []:
            c.setdefault("volumeMounts", []).append(dict(mount))


def open_port(spec: dict[str, Any], name: str, port: int, keys: tuple[str, ...]) -> None:
    """Declare ``port`` on each container of the lists ``keys`` names (once)."""
    for key in keys:
        for c in spec.get(key) or []:
            ports = c.setdefault("ports", [])
            if not any(p.get("containerPort") == port for p in ports):
                ports.append({"name": name, "containerPort": port})


def port(flags: Mapping[str, str], default: int) -> int:
    """The plugin's ``--port``, ``default`` when it is none or out of range."""
    text = flags.get("port", "")
    return int(text) if text.isdigit() and 0 < int(text) <= 65535 else default


def flag(flags: Mapping[str, str], name: str) -> bool:
    """A boolean flag of the plugin, as Go's flag package reads one."""
    return flags.get(name, "false").lower() in ("true", "1", "t")


def domain(ref: JobRef, task: vcjob.Task, index: int) -> str:
    """The DNS name of a task's pod ``index`` (its template's own hostname and
    subdomain, else the pod's name and the Job's)."""
    spec = task.template.get("spec") or {}
    host = spec.get("hostname") or task.pod_name(ref.name, index)
    return f"{host}.{spec.get('subdomain') or ref.name}"


def task_hosts(ref: JobRef, task: vcjob.Task) -> list[str]:
    """A task's pods' DNS names: one when its template names a hostname of its own
    (every pod of the task has it)."""
    own = (task.template.get("spec") or {}).get("hostname")
    count = min(task.replicas, 1) if own else task.replicas
    return [domain(ref, task, i) for i in range(count)]
