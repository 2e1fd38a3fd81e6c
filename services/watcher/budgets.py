"""The watcher's PodDisruptionBudgets: what each allows now, published as it changes.

The watcher lists and watches ``policy/v1`` PodDisruptionBudgets beside every pod, and
tells the gang-coordinator (which offers preemption victims) each budget's reading as
``PdbUpdated``: its selector and the disruptions it allows, from a current status
when kube-controller-manager writes one, otherwise computed from its spec and the
readiness of the pods it matches (shared/core/disruption.py ``Budgets``). A pod event
changes a budget's reading only through the budgets of its namespace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from services.watcher.translate import TERMINAL
from shared import events as ev
from shared import kube
from shared.core.disruption import Budgets, counted, read_budget
from shared.core.model import PodUID

log = logging.getLogger(__name__)

UNREADABLE = (KeyError, TypeError, ValueError, AttributeError)
"""What reading an object that is not shaped as its schema says raises."""


class BudgetWatch:
    """Owns the watcher's view of PodDisruptionBudgets and the pods they count."""

    PATH = "/apis/policy/v1/poddisruptionbudgets"

    def __init__(self, publish: Callable[[ev.Event], Coroutine[Any, Any, None]]) -> None:
        self.publish = publish
        self.budgets = Budgets()

    def watch(self, api: kube.Client) -> Coroutine[Any, Any, None]:
        """List and watch every PodDisruptionBudget (the watcher runs it as a task)."""
        return kube.list_watch(api, self.PATH, self.on_event, on_relist=self.on_relist)

    async def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """One PodDisruptionBudget added, changed or deleted; one that cannot be read is
        logged and skipped until it changes."""
        try:
            meta = obj["metadata"]
            namespace, name = str(meta["namespace"]), str(meta["name"])
            spec = None if kind == "DELETED" else read_budget(obj)
        except UNREADABLE as exc:
            log.warning("PodDisruptionBudget cannot be read (%r); skipped until it changes", exc)
            return
        if spec is None:
            if self.budgets.remove_budget(namespace, name):
                await self.publish(ev.PdbDeleted(namespace=namespace, name=name))
            return
        if (budget := self.budgets.set_budget(spec)) is not None:
            await self.publish(ev.PdbUpdated(budget=budget))

    async def on_relist(self, items: list[dict[str, Any]]) -> None:
        """A full list: budgets known here that it lacks were deleted meanwhile."""
        present = {
            (str(o["metadata"].get("namespace")), str(o["metadata"].get("name"))) for o in items
        }
        for namespace, name in [k for k in self.budgets.specs if k not in present]:
            await self.on_event("DELETED", {"metadata": {"namespace": namespace, "name": name}})
        for obj in items:
            await self.on_event("ADDED", obj)

    async def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        """A pod changed: the budgets of its namespace count it again. A pod that cannot
        be read is not counted (the watcher tells it why)."""
        try:
            meta = obj["metadata"]
            phase = (obj.get("status") or {}).get("phase")
            gone = kind == "DELETED" or phase in TERMINAL
            namespace, uid = str(meta["namespace"]), PodUID(meta["uid"])
            pod = None if gone else counted(obj)
        except UNREADABLE:
            return
        for budget in self.budgets.set_pod(namespace, uid, pod):
            await self.publish(ev.PdbUpdated(budget=budget))

    async def on_pods_listed(self, present: Iterable[PodUID]) -> None:
        """A full list of pods read (each through ``on_pod``): those it lacks are gone."""
        for budget in self.budgets.keep_only(present):
            await self.publish(ev.PdbUpdated(budget=budget))

    def known(self) -> list[ev.Event]:
        """Every budget's reading, for a resync (a restarted coordinator learns them)."""
        return [ev.PdbUpdated(budget=b) for b in self.budgets.current.values()]
