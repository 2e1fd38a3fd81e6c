"""Volcano's ``env`` plugin: ``VC_TASK_INDEX`` and ``VK_TASK_INDEX``, the pod's index in
its task, in every container."""

from __future__ import annotations

from collections.abc import Mapping

from services.job_controller.plugins.common import EVERY_CONTAINER, PodDraft, add_env


def on_pod(pod: PodDraft, flags: Mapping[str, str]) -> None:
    """The task index in every container's environment (the plugin takes no flags)."""
    index = str(pod.index)
    env = [{"name": "VK_TASK_INDEX", "value": index}, {"name": "VC_TASK_INDEX", "value": index}]
    add_env(pod.spec, env, EVERY_CONTAINER)
