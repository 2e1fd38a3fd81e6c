"""The webhook's mutating decision on a new pod (no I/O).

A pod that asks for a device Tessera manages and names no scheduler (or
``default-scheduler``) gets the first of ``scheduler.names`` (HAMi's webhook does the
same for its scheduler), unless ``webhook.setSchedulerName`` is off. Each container of a
pod of ``scheduler.names`` that asks a vendor's memory, memory percentage or cores but
none of its count names gets the count name (``defaultGPUNum``) in its limits and
requests, as HAMi's webhook does: the kubelet calls the node agent's ``Allocate`` only
for a registered name the container asks for (the watcher refuses the pod otherwise,
shared/core/request.py).
"""

from __future__ import annotations

import logging
from typing import Any

from shared.config import Config
from shared.core.request import RequestParser

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER = "default-scheduler"


class Mutation:
    """The JSON patch for a new pod; a part of service.py's ``Webhook``, which holds
    the config and the request parser."""

    cfg: Config
    parser: RequestParser

    def mutate(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The JSON patch for a new pod (empty: nothing to change)."""
        patch: list[dict[str, Any]] = []
        scheduler = (pod.get("spec") or {}).get("schedulerName")
        if (
            self.cfg.webhook.set_scheduler_name
            and scheduler in (None, "", DEFAULT_SCHEDULER)
            and self.parser.wants_devices(pod)
        ):
            scheduler = self.cfg.scheduler.names[0]
            patch.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler})
        if scheduler in self.cfg.scheduler.names:
            patch.extend(self.add_counts(pod))
        return patch

    def add_counts(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """The JSON patch giving each container that asks memory or cores without a
        device count the count (``RequestParser.missing_counts``). Limits and requests
        alike: the API server wants an extended resource's request equal to its limit."""
        spec = pod.get("spec") or {}
        added: dict[tuple[str, int], dict[str, str]] = {}
        for missing in self.parser.missing_counts(pod):
            where = (missing.key, missing.index)
            added.setdefault(where, {})[missing.count_name] = str(missing.count)
            log.info(
                "pod %s: container %s names no device count; adding %s: %d",
                (pod.get("metadata") or {}).get("name", "?"),
                missing.container,
                missing.count_name,
                missing.count,
            )
        patch: list[dict[str, Any]] = []
        for (key, index), counts in added.items():
            base = f"/spec/{key}/{index}/resources"
            resources = spec[key][index].get("resources")
            if not isinstance(resources, dict):
                patch.append({"op": "add", "path": base, "value": {}})
                resources = {}
            for part in ("limits", "requests"):
                if not isinstance(resources.get(part), dict):
                    patch.append({"op": "add", "path": f"{base}/{part}", "value": dict(counts)})
                    continue
                for name, value in counts.items():
                    pointer = name.replace("~", "~0").replace("/", "~1")
                    patch.append({"op": "add", "path": f"{base}/{part}/{pointer}", "value": value})
        return patch
