"""What the gang-coordinator sends: the core's gang policy from the configuration, a
``GangReady`` per gang the core found ready, and ``PodWaiting`` for pods it holds back.

services/gang_coordinator/service.py calls these from its dispatch; they read nothing
but what they are given.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from shared import events as ev
from shared.config import SchedulerConfig
from shared.core.gangs import Member, Policy, ReadyGang
from shared.core.model import GangKey, PodUID
from shared.core.shards import Shards
from shared.core.status import Status
from shared.core.usage import UsageParams

log = logging.getLogger(__name__)


def policy(s: SchedulerConfig) -> Policy:
    """The core's gang policy, as the ``scheduler`` configuration sets it."""
    return Policy(
        retry_backoff_s=s.retry_backoff_s,
        starvation_guard_s=s.starvation_window(),
        preemption=s.preempts(),
        consolidation=s.consolidates(),
        queue_plugin=s.queue_plugin,
        ancestor_reclaim_level=s.ancestor_reclaim_level,
        preempt_min_runtime_s=s.preempt_min_runtime_s,
        reclaim_min_runtime_s=s.reclaim_min_runtime_s,
        usage=UsageParams(
            weight=s.usage.weight, half_life_s=s.usage.half_life_s, window_s=s.usage.window_s
        ),
    )


def gang_ready(
    gang: ReadyGang,
    announced: Mapping[PodUID, ev.PodPending],
    pools: Shards,
    group: ev.PodGroupUpdated | None,
) -> ev.GangReady:
    """The ``GangReady`` of a gang: its members as announced, its route through the
    shards, and its PodGroup's networkTopology as is."""
    key = gang.key
    members = tuple(announced[m.pod.uid] for m in gang.members)
    # Sharded: the shards its pods may run in, from the one its name hashes to (a
    # selector no shard allows: every shard, which each say why not).
    route = (
        pools.route(
            f"{key.namespace}/{key.name}",
            (m.spec.node_selector if m.spec is not None else {} for m in members),
        )
        or pools.names
    )
    return ev.GangReady(
        gang=ev.GangRef(namespace=key.namespace, name=key.name, queue=gang.queue, lone=key.lone),
        min_member=gang.min_member,
        attempt=gang.attempt,
        members=members,
        victims=gang.victims,
        budgets=dict(gang.budgets),
        hold=gang.hold,
        protected_s=gang.protected_s,
        subgroups=gang.subgroups,
        movable=gang.movable,
        network_topology=group.network_topology if group is not None else None,
        shard=route[0] if route else "",
        route=route[1:],
        offered=route,
    )


def waiting(told: Iterable[tuple[Member, Status]]) -> list[ev.PodWaiting]:
    """A ``PodWaiting`` per pod held back, logged once per gang and reason, not per pod."""
    out: list[ev.PodWaiting] = []
    said: dict[tuple[GangKey, str], int] = {}
    for m, status in told:
        said[m.key, status.message()] = said.get((m.key, status.message()), 0) + 1
        out.append(ev.PodWaiting.of((m.pod,), status, attempt=m.attempt))
    for (key, message), count in said.items():
        log.info("gang %s: %d pod(s) wait: %s", key, count, message)
    return out
