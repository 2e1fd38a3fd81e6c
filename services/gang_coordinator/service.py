"""The gang-coordinator: decides which pods go to the allocator, and when again.

A pod is pending until the allocator decides; a lone pod is a gang of one and goes at
once. Pods of a PodGroup (``scheduling.k8s.io/group-name``) go together once
``min_member`` of them are pending (the PodGroup's value when known, else 1).

A pod the allocator could not place is parked. It is retried when something that could
help happens (a node's inventory or cordons changed, a grant was released, a bind
failed) and otherwise after a backoff that doubles up to a minute. An unresolvable
failure (no node could ever fit as the cluster is built) waits for a node change only.

State is rebuilt at start from the watcher (``tessera.ctl.resync``), so a restarted
coordinator forgets nothing.

Per pod::

    pending --GangReady--> in flight --decided--> placed --bound / deleted--> (gone)
       ^                      |  failed                 |  bind failed
       +------ retry ------ parked <--------------------+
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from shared import events as ev
from shared.bus import Delivery
from shared.core.model import PodUID
from shared.runtime import Runtime

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
INFLIGHT_TIMEOUT_S = 20.0
"""A gang the allocator has not answered in this time is sent again (it may have been
published before the allocator's consumer existed); the allocator answers a pod it
already placed by repeating its decision, so a resend never places twice."""


@dataclass
class PodState:
    pending: ev.PodPending
    attempt: int = 0
    state: str = "pending"  # pending | inflight | placed | parked
    retry_at: float = 0.0
    sent_at: float = 0.0
    unresolvable: bool = False


@dataclass
class Coordinator:
    rt: Runtime
    pods: dict[PodUID, PodState] = field(default_factory=dict)
    min_members: dict[tuple[str, str], int] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, event: ev.AnyEvent, _delivery: Delivery) -> None:
        match event:
            case ev.PodPending():
                self._pending(event)
            case ev.AllocationDecided():
                st = self.pods.get(event.pod.uid)
                if st is not None:
                    st.state = "placed"
            case ev.AllocationFailed():
                self._failed(event)
            case ev.BindFailed():
                st = self.pods.get(event.pod.uid)
                if st is not None:
                    self._park(st, unresolvable=False, delay=0.0)
            case ev.PodUpdated() | ev.PodDeleted() | ev.PodRejected():
                self.pods.pop(event.pod.uid, None)
            case ev.NodeInventory() | ev.NodeUpdated() | ev.AllocationReleased():
                self._helpful(node_changed=not isinstance(event, ev.AllocationReleased))
            case _:
                return
        await self.dispatch()

    def _pending(self, event: ev.PodPending) -> None:
        st = self.pods.get(event.pod.uid)
        if st is None:
            self.pods[event.pod.uid] = PodState(pending=event)
            return
        changed = st.pending.request != event.request
        st.pending = event
        if changed and st.state == "parked":
            st.state, st.unresolvable = "pending", False

    def _failed(self, event: ev.AllocationFailed) -> None:
        for ref in event.pods:
            st = self.pods.get(ref.uid)
            if st is None or st.attempt != event.attempt:
                continue  # a stale answer to an earlier attempt
            backoff = min(
                self.rt.cfg.scheduler.retry_backoff_s * 2 ** (st.attempt - 1), MAX_BACKOFF_S
            )
            self._park(st, unresolvable=event.unresolvable, delay=backoff)

    def _park(self, st: PodState, *, unresolvable: bool, delay: float) -> None:
        st.state = "parked"
        st.unresolvable = unresolvable
        st.retry_at = float("inf") if unresolvable else time.monotonic() + delay
        if delay <= 0:
            self.wake.set()

    def _helpful(self, *, node_changed: bool) -> None:
        """Capacity may have appeared: retry parked pods now (unresolvable ones only when
        a node changed, since only a node can make them fit)."""
        for st in self.pods.values():
            if st.state == "parked" and (node_changed or not st.unresolvable):
                st.retry_at = 0.0
        self.wake.set()

    async def dispatch(self) -> None:
        """Send every gang that is ready to the allocator."""
        now = time.monotonic()
        groups: dict[tuple[str, str], list[PodState]] = {}
        for st in self.pods.values():
            if st.state == "parked" and st.retry_at <= now:
                st.state = "pending"
            elif st.state == "inflight" and now - st.sent_at > INFLIGHT_TIMEOUT_S:
                log.info(
                    "no answer for %s in %.0fs; sending it again",
                    st.pending.pod,
                    INFLIGHT_TIMEOUT_S,
                )
                st.state = "pending"
            if st.state != "pending":
                continue
            p = st.pending
            key = (p.pod.namespace, p.group or f"pod:{p.pod.name}")
            groups.setdefault(key, []).append(st)
        ready = []
        for (namespace, name), members in groups.items():
            lone = name.startswith("pod:")
            min_member = 1 if lone else self.min_members.get((namespace, name), 1)
            if len(members) < min_member:
                continue
            members.sort(key=lambda s: (-s.pending.priority, s.pending.created_at))
            attempt = max(s.attempt for s in members) + 1
            for st in members:
                st.state, st.attempt, st.sent_at = "inflight", attempt, now
            gang = ev.GangRef(namespace=namespace, name=name.removeprefix("pod:"))
            ready.append(
                ev.GangReady(
                    gang=gang,
                    min_member=min_member,
                    attempt=attempt,
                    members=tuple(s.pending for s in members),
                )
            )
        if ready:
            await self.rt.bus.publish_many(ready)

    async def retry_loop(self) -> None:
        while True:
            parked = [s.retry_at for s in self.pods.values() if s.state == "parked"]
            delay = max(0.05, min(parked, default=1.0) - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=min(delay, 1.0))

            self.wake.clear()
            await self.dispatch()

    async def request_resync(self) -> None:
        """Ask the watcher to re-announce pending pods (it answers once it has)."""
        try:
            await self.rt.bus.nc.request(ev.CONTROL_RESYNC_SUBJECT, b"", timeout=5)
        except Exception as exc:  # the watcher may not be up yet; its resync loop covers it
            log.info("resync request not answered (%s); the periodic resync will cover it", exc)


SUBJECTS = [
    "tessera.v1.pod.>",
    "tessera.v1.gang.>",
    "tessera.v1.allocation.>",
    "tessera.v1.node.>",
]


async def main(rt: Runtime) -> None:
    coordinator = Coordinator(rt)
    # The consumer first, so the pods the watcher re-announces for us are all kept.
    await rt.bus.ensure_consumer("gang-coordinator", SUBJECTS, deliver="new")
    rt.adopt(rt.bus.consume("gang-coordinator", SUBJECTS, coordinator.handle, deliver="new"))
    rt.spawn(coordinator.retry_loop(), "retry")
    rt.spawn(coordinator.request_resync(), "resync-once", finite=True)
