"""Volcano's ``ssh`` plugin: a Secret ``<job>-ssh`` with a fresh RSA key pair,
``authorized_keys`` and an ssh ``config`` naming every pod, mounted at ``/root/.ssh``.
Flags: ``--ssh-key-file-path``, ``--ssh-private-key``/``--ssh-public-key`` (the user's
own keys), ``--ssh-port``.

Pure but for :func:`keys` (randomness).
"""

from __future__ import annotations

from collections.abc import Mapping

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from services.job_controller.made import JobRef, Made
from services.job_controller.plugins.common import (
    EVERY_CONTAINER,
    PodDraft,
    add_mount,
    task_hosts,
)
from shared.core import vcjob

PATH = "/root/.ssh"
DIR = ".ssh"
FILES = ("id_rsa", "id_rsa.pub", "authorized_keys", "config")


def on_pod(pod: PodDraft, flags: Mapping[str, str]) -> None:
    """The Secret's files mounted at ``--ssh-key-file-path`` (``/root/.ssh``)."""
    secret = f"{pod.ref.name}-ssh"
    path = flags.get("ssh-key-file-path", PATH)
    pod.spec.setdefault("volumes", []).append(
        {
            "name": secret,
            "secret": {
                "secretName": secret,
                "items": [{"key": f, "path": f"{DIR}/{f}"} for f in FILES],
                # 0600 where ssh reads the keys as root; a user's own path is readable
                "defaultMode": 0o600 if path == PATH else 0o644,
            },
        }
    )
    add_mount(pod.spec, {"name": secret, "mountPath": path, "subPath": DIR}, EVERY_CONTAINER)


def config(ref: JobRef, job: vcjob.JobSpec, port: int) -> str:
    """The plugin's ``config``: every pod by its short name, no host key checks (the
    keys are fresh for each Job)."""
    lines = ["StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"]
    for task in job.tasks:
        for host in task_hosts(ref, task):
            short = host.split(".", 1)[0]
            lines += [f"Host {short}", f"  HostName {host}", f"  Port {port}"]
    return "\n".join(lines) + "\n"


def keys() -> tuple[str, str]:
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


def objects(ref: JobRef, job: vcjob.JobSpec, flags: Mapping[str, str]) -> list[Made]:
    """The Secret: the user's keys, else a fresh pair, and the ssh ``config``."""
    port = int(flags.get("ssh-port", "22")) if flags.get("ssh-port", "").isdigit() else 22
    port = port if 0 < port <= 65535 else 22
    private, public = flags.get("ssh-private-key", ""), flags.get("ssh-public-key", "")
    if not private:
        private, public = keys()
    data = {
        "id_rsa": private,
        "id_rsa.pub": public,
        "authorized_keys": public,
        "config": config(ref, job, port),
    }
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{ref.name}-ssh", "ownerReferences": ref.owner()},
        "stringData": data,
    }
    return [Made(ref.namespace, body)]
