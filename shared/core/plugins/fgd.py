"""FGD: the node and devices where a pod adds least expected fragmentation.

The measure is shared/core/policy.py's (Weng et al., "Beware of Fragmentation",
ATC '23): for each node, the GPU share the workload's task types could not use, weighed
by how often each type comes. :class:`FgdSearch` walks nodes that fit and keeps the one
the pod raises least; the FGD node policy (a pod's ``fgd``) and the fragmentation guard
(shared/core/plugins/fragmentation_guard.py) both search with it, one per placer, so
they share its memo of nodes already weighed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from shared.core.framework import Choice, Chosen, NodePolicyPlugin
from shared.core.hosts import CPU, MEMORY
from shared.core.ledger import Ledger, NodeState, Statement
from shared.core.model import ContainerGrant, PodRequest
from shared.core.policy import MEMO_LIMIT, Tables, request_share
from shared.core.status import Status

PASS_SHARE = 4
"""With ``per_kind``, the nodes of kinds already weighed enough that a search passes, per
node of its window: the walk stays within a few times the window (a kind that is
scarce, or full, does not send it over the whole index)."""

if TYPE_CHECKING:
    from shared.core.families import FitContext
    from shared.core.nodefit import Prepared
    from shared.core.placement import Placer


class FGD(NodePolicyPlugin):
    """The ``fgd`` node policy: of ``fgdCandidates`` nodes that fit, drawn from both
    ends of the device index (a pod with no devices: every node in turn), the one whose
    expected fragmentation the pod raises least."""

    name = "FGD"
    policy = "fgd"

    def choose(self, choice: Choice) -> Chosen | None:
        """FGD's choice over its candidates."""
        placer = choice.placer
        request, ctx, prep = choice.request, choice.ctx, choice.prep
        if choice.primary is None:
            rotation = placer.rotation(choice.owner, prep)
            return placer.fgd.best(placer, rotation, request, ctx, prep, rotate=True)
        walk = placer.both_ends(
            choice.request, choice.primary, choice.owner, placer.config.fgd_candidates, choice.prep
        )
        return placer.fgd.best(placer, walk, request, ctx, prep)


class FgdSearch:
    """FGD's search over one placer's nodes, with its memo (see :meth:`best`); the
    placer is passed in, not kept (no cycle keeps a dropped ledger alive)."""

    def __init__(self) -> None:
        self.cache: dict[
            tuple[str, object, tuple[int, ...]], tuple[object, float | None, float]
        ] = {}
        """(node, (the pod's request, device policy), where its cpu and memory leave the
        node: ``_host_after``) → (the node's ``_stamp`` when weighed, the fragmentation
        the pod adds there or None if it does not fit, the free GPU share it leaves)."""
        self.tables_seen: object = None

    def best(
        self,
        placer: Placer,
        candidates: Iterator[NodeState],
        request: PodRequest,
        ctx: FitContext,
        prep: Prepared | None,
        *,
        rotate: bool = False,
        limit: int | None = None,
        per_kind: int = 0,
    ) -> tuple[NodeState, tuple[ContainerGrant, ...]] | None:
        """Of the first ``limit`` nodes that fit (``fgd_candidates`` unless given; every
        node: 0), the one whose expected fragmentation (shared/core/policy.py) the pod
        increases least, its free cpu and memory counted. Ties: the first in the walk's
        order for a pod with devices; for one without (``rotate``), the node with the
        least free GPU share left, then kube-scheduler's most-allocated score: cpu no
        GPU task could use anyway goes first. Such a pod cannot do better than a node
        where it strands nothing and no GPU is free: the search stops once
        ``score_window`` of those are found.

        A node's result for a pod of the same request, whose cpu and memory leave the
        node holding as many tasks of each type (``_host_after``), is kept while the
        node's usage stays the same (``_stamp``): a wide window then weighs mostly nodes
        already weighed, at a dictionary read each. The chosen node, if its result was
        kept, is fitted again, so a grant is always made on the ledger as it is.

        ``per_kind`` (the guard's, shared/core/plugins/fragmentation_guard.py): once that
        many nodes of one kind (GPU type and device count, as shared/core/ledger.py
        ``node_kind``) were offered, fitting or not, further nodes of the kind are passed
        unweighed and unfitted, up to ``PASS_SHARE`` times ``limit`` of them; then the
        walk goes on as without it."""
        if limit is None:
            limit = placer.config.fgd_candidates
        limit = limit or len(placer.ledger.nodes)
        want_cpu = want_memory = 0
        if prep is not None:
            requests = prep.pod.requests
            want_cpu, want_memory = requests.get(CPU, 0), requests.get(MEMORY, 0)
        device_fgd = ctx.device_policy == "fgd" and request.wants_devices
        kind: object = None
        if not rotate and not ctx.avoid and ctx.only is None:
            kind = (request, ctx.device_policy)
        cache = self.cache
        if len(cache) >= MEMO_LIMIT:
            cache.clear()
        workload = placer.workload
        tables = workload.tables()
        if tables is not self.tables_seen:  # the workload was re-weighed: so are nodes
            cache.clear()
            self.tables_seen = tables
        # (delta, free GPU share left, node, grants or None when kept from before)
        best: list[tuple[float, float, NodeState, tuple[ContainerGrant, ...] | None]] = []
        found = floor = 0
        kinds: dict[tuple[str, int], int] = {}
        passes = PASS_SHARE * limit if per_kind else 0
        nodekind: tuple[str, int] = ("", 0)
        for node in candidates:
            if passes:
                devs = node.devices
                nodekind = (devs[0].model_lc if devs else "", len(devs))  # node_kind, inline
                held = kinds.get(nodekind, 0)
                if held >= per_kind:
                    passes -= 1
                    continue
                kinds[nodekind] = held + 1
            if prep is not None and prep.filter(node.host) is not None:
                continue
            stamp = _stamp(node) if kind is not None else None
            key = (
                (node.name, kind, _host_after(tables, node, want_cpu, want_memory))
                if kind is not None
                else None
            )
            kept = cache.get(key) if key is not None else None
            grants: tuple[ContainerGrant, ...] | None
            if kept is not None and kept[0] == stamp:
                _, delta, left = kept
                if delta is None:
                    continue
                grants = None
            else:
                weighed = self.delta(placer, node, request, ctx, device_fgd, want_cpu, want_memory)
                if key is not None:
                    cache[key] = (
                        stamp,
                        *(weighed[:2] if weighed is not None else (None, 0.0)),
                    )
                if weighed is None:
                    continue
                delta, left, grants = weighed
            found += 1
            if not best or delta < best[0][0] - 1e-9:
                best = [(delta, left, node, grants)]
            elif rotate and delta <= best[0][0] + 1e-9:
                best.append((delta, left, node, grants))
            if found >= limit:
                break
            if rotate and delta <= 1e-9 and left <= 1e-9:
                floor += 1
                if floor >= placer.config.score_window:
                    break
        if not best:
            return None
        if len(best) > 1:
            least = min(t for _, t, _, _ in best)
            best = [b for b in best if b[1] <= least + 1e-9]
        top = 0
        if len(best) > 1 and prep is not None:
            scores = prep.score([n.host for _, _, n, _ in best], "binpack")
            top = max(range(len(best)), key=lambda i: (scores[i], -i))
        _, _, node, grants = best[top]
        if grants is None:
            refit = self.delta(placer, node, request, ctx, device_fgd, want_cpu, want_memory)
            if refit is None:
                return None  # kept by mistake (see _stamp): the full scan will look
            grants = refit[2]
        return node, grants

    def delta(
        self,
        placer: Placer,
        node: NodeState,
        request: PodRequest,
        ctx: FitContext,
        device_fgd: bool,
        want_cpu: int,
        want_memory: int,
    ) -> tuple[float, float, tuple[ContainerGrant, ...]] | None:
        """How much the pod's grants on ``node`` would raise its expected fragmentation,
        the free GPU share they leave, and the grants; None if it does not fit (the
        node's filters already passed)."""
        workload = placer.workload
        model = _model_of(node)
        cpu, memory = _host_free(node)
        cpu_after = None if cpu is None else cpu - want_cpu
        memory_after = None if memory is None else memory - want_memory
        node_ctx = ctx
        if device_fgd and isinstance(model, str):
            node_ctx = replace(ctx, workload=workload.at(model, cpu_after, memory_after))
        grants = placer.fit_node(node, request, node_ctx)
        if isinstance(grants, Status):
            return None
        if not grants and isinstance(model, str):
            tables = workload.tables()
            devices = len(node.devices)
            if not tables.crosses(model, devices, cpu, cpu_after, memory, memory_after):
                # no device taken and the host holds as many tasks of each type: no change
                return 0.0, sum(d.free_fraction() for d in node.devices), grants
        free, left = _after(placer.ledger, node, grants)
        before = workload.fragmentation(free, model, cpu, memory)
        after = workload.fragmentation(left, model, cpu_after, memory_after)
        return after - before + _over_granted(node, request, grants), sum(left), grants


def _model_of(node: NodeState) -> str | tuple[str, ...]:
    """The GPU type of a node's devices (lower case): one, or one per device if mixed."""
    devs = node.devices
    if not devs:
        return ""
    first = devs[0].model_lc
    for d in devs:
        if d.model_lc != first:
            return tuple(d.model_lc for d in devs)
    return first


def _after(
    ledger: Ledger, node: NodeState, grants: tuple[ContainerGrant, ...]
) -> tuple[list[float], list[float]]:
    """The free share of each of the node's devices now, and once ``grants`` are made
    (tried in a statement, undone at once)."""
    devs = node.devices
    free = [d.free_fraction() for d in devs]
    touched = [node.by_uuid[g.uuid] for c in grants for g in c.devices]
    if not touched:
        return free, free
    left = list(free)
    with Statement(ledger) as trial:
        for c in grants:
            for g in c.devices:
                trial.use(node.by_uuid[g.uuid], g)
        for d in touched:
            left[devs.index(d)] = d.free_fraction()
    return free, left


def _over_granted(
    node: NodeState, request: PodRequest, grants: tuple[ContainerGrant, ...]
) -> float:
    """The GPU share granted beyond what was asked, lost to every task: a MIG instance
    or a vNPU template larger than the request. FGD's measure assumes a grant is the
    request; without this, a whole-card MIG instance for a quarter-card request adds
    no fragmentation at all and wins every comparison."""
    asked = {c.name: c.devices for c in request.containers}
    lost = 0.0
    for c in grants:
        wanted = asked.get(c.container)
        if not wanted:
            continue
        r = wanted[0]
        for g in c.devices:
            d = node.by_uuid.get(g.uuid)
            if d is None or not d.total_mem or not (g.mig_profile or g.vnpu_template):
                continue  # a slice is granted exactly as asked
            lost += max(0.0, min(1.0, g.memory_mib / d.total_mem) - request_share(r, d.total_mem))
    return lost


def _stamp(node: NodeState) -> tuple[int, ...]:
    """What a node's fit and fragmentation follow from, summed: its devices' usage and
    health, its pods and their cpu and memory. Two states with the same sums are taken
    for the same (a pod released and another of the same size granted on the same node
    between two looks): FGD may then weigh that node by its old state, and the node it
    chooses is fitted again before any grant."""
    mem = cores = slots = 0
    for d in node.devices:
        mem += d.used_mem
        cores += d.used_cores
        slots += d.used_slots if d.healthy and not d.cordoned else 1 << 20
    host = node.host
    used = host.requested
    return (
        mem,
        cores,
        slots,
        len(node.devices),
        host.count,
        used.get(CPU, 0),
        used.get(MEMORY, 0),
    )


def _host_after(
    tables: Tables, node: NodeState, want_cpu: int, want_memory: int
) -> tuple[int, ...]:
    """What of a pod's cpu and memory FGD's result on ``node`` depends on, the node's
    own state aside (``_stamp``): where the node's free cpu and memory after it fall
    among the figures at which it holds one task fewer of some type (``host_key``).
    Pods whose cpu and memory differ but fall alike share the node's kept result (the
    guard weighed about a quarter of its window from memory when the exact figures were
    the key: bench/RESULTS.md). A node of mixed GPU types keys by the exact figures."""
    model = _model_of(node)
    cpu, memory = _host_free(node)
    if not isinstance(model, str):
        return (want_cpu, want_memory)
    return tables.host_key(
        model,
        len(node.devices),
        None if cpu is None else cpu - want_cpu,
        None if memory is None else memory - want_memory,
    )


def _host_free(node: NodeState) -> tuple[int | None, int | None]:
    """The node's free cpu (milli) and memory (bytes); None while its Node is unknown."""
    spec = node.host.spec
    if spec is None:
        return None, None
    alloc, used = spec.allocatable, node.host.requested
    return alloc.get(CPU, 0) - used.get(CPU, 0), alloc.get(MEMORY, 0) - used.get(MEMORY, 0)


def node_fragmentation(placer: Placer, node: NodeState) -> float:
    """The expected fragmentation (in GPUs) of ``node`` as it is now, by the placer's
    workload: what a consolidation plan (shared/core/consolidation.py) sums over the
    nodes it touches, before and after."""
    cpu, memory = _host_free(node)
    free = [d.free_fraction() for d in node.devices]
    return placer.workload.fragmentation(free, _model_of(node), cpu, memory)
