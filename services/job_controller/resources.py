"""What a Volcano Job's pods need before they are made, and what goes with the Job
(Volcano's ``controlledResources``): the claims of its volumes, its PodGroup
(services/job_controller/podgroup.py), its plugins' objects
(services/job_controller/plugins/). Made in :func:`setup` (each recorded in the
status once made), taken down by :func:`teardown` when the Job is killed whole, deleted
with its pods by :func:`remove` when the Job is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from services.job_controller import made, plugins, podgroup
from services.job_controller.api import JobApi
from services.job_controller.plugins import svc
from services.job_controller.status import Status
from services.job_controller.tracked import Tracked


async def setup(api: JobApi, tracked: Tracked, status: Status) -> tuple[Status, bool]:
    """What the Job's pods need first: its claims, its PodGroup, its plugins'
    objects. False when its pods must wait (a claim it names does not exist)."""
    spec, ref = tracked.spec, tracked.ref
    assert spec is not None
    controlled = dict(status.controlled)
    for claim in made.claims(ref, spec):  # recorded once made, as Volcano does
        name = claim.body["metadata"]["name"]
        if f"volume-pvc-{name}" not in controlled:
            await api.create(claim.collection, claim.body)
            controlled[f"volume-pvc-{name}"] = name
    for i, volume in enumerate(spec.volumes):
        name = volume.claim_name
        if not name or f"volume-pvc-{name}" in controlled:
            continue
        if not await api.exists(
            f"/api/v1/namespaces/{ref.namespace}/persistentvolumeclaims/{name}"
        ):
            await api.warn(
                tracked,
                "PVCError",
                f"pvc {name} (spec.volumes[{i}]) is not found: the Job stays Pending "
                "until it is created",
            )
            return replace(status, controlled=controlled), False
        controlled[f"volume-pvc-{name}"] = name
    await podgroup.write(api, tracked)
    for plugin in spec.plugins:
        mark = f"plugin-{plugin}"
        if plugin not in plugins.IMPLEMENTED:
            await api.warn(
                tracked,
                "PluginError",
                f"plugin {plugin} is not run by Tessera's job-controller: its pods get "
                "nothing from it (docs/compat.md, Job)",
            )
        elif controlled.get(mark) != plugin:
            for obj in plugins.objects(ref, spec, plugin):
                await api.create(obj.collection, obj.body)
            if plugin == "svc":
                tracked.hosts = svc.hosts(ref, spec)
        elif plugin == "svc" and tracked.hosts != svc.hosts(ref, spec):
            tracked.hosts = svc.hosts(ref, spec)  # scaled: the hosts change
            await api.patch(
                f"/api/v1/namespaces/{ref.namespace}/configmaps/{ref.name}-svc",
                {"data": tracked.hosts},
            )
        controlled[mark] = plugin
    return replace(status, controlled=controlled), True


async def teardown(api: JobApi, tracked: Tracked, status: Status) -> Status:
    """Volcano's KillJob takes the PodGroup and the plugins' objects down (they are
    made again when the Job starts over)."""
    spec, ref = tracked.spec, tracked.ref
    assert spec is not None
    await podgroup.take_down(api, tracked)
    controlled = dict(status.controlled)
    for plugin in spec.plugins:
        if controlled.pop(f"plugin-{plugin}", None) is None:
            continue
        for path in plugins.made_paths(ref, plugin):
            await api.delete(path)
    tracked.hosts = {}
    return replace(status, controlled=controlled)


async def remove(
    api: JobApi, namespace: str, name: str, tracked: Tracked | None, pods: Iterable[str]
) -> None:
    """The Job ``name`` is deleted: delete its ``pods``, its PodGroup and, where its
    spec is known (``tracked``), its plugins' objects and the claims made for it."""
    for pod in pods:
        await api.delete_pod(namespace, pod)
    await api.delete(podgroup.path(namespace, name))
    if tracked is not None and tracked.spec is not None:
        for plugin in tracked.spec.plugins:
            for path in plugins.made_paths(tracked.ref, plugin):
                await api.delete(path)
        for claim in made.claims(tracked.ref, tracked.spec):
            await api.delete(claim.path)
