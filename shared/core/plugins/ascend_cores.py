"""AscendCores: MindCluster's ``huawei.com/npu-core`` on 310P templates."""

from __future__ import annotations

from shared.core.families import DeviceFit, FitContext, Picks, template_picks
from shared.core.ledger import Dev, NodeState, PoolIndex, PoolKey
from shared.core.model import Constraints, DeviceRequest
from shared.core.spec import VnpuTemplate
from shared.core.status import UNRESOLVABLE, Reason

MINDCLUSTER_TEMPLATES: dict[str, tuple[int, int, int]] = {
    "vir01": (1, 1, 3072),
    "vir02": (2, 2, 6144),
    "vir02_1c": (2, 1, 6144),
    "vir04": (4, 4, 12288),
    "vir04_3c": (4, 3, 12288),
    "vir04_3c_ndvpp": (4, 3, 12288),
    "vir04_4c_dvpp": (4, 4, 12288),
}

# (AI cores, vnpu-dvpp, vnpu-level) -> templates in preference order (later = degraded)
MINDCLUSTER_TABLE: dict[tuple[int, str, str], tuple[str, ...]] = {
    (1, "null", "low"): ("vir01",),
    (1, "null", "high"): ("vir01",),
    (2, "null", "low"): ("vir02_1c",),
    (2, "null", "high"): ("vir02", "vir02_1c"),
    (4, "yes", "low"): ("vir04_4c_dvpp",),
    (4, "yes", "high"): ("vir04_4c_dvpp",),
    (4, "no", "low"): ("vir04_3c_ndvpp",),
    (4, "no", "high"): ("vir04_3c_ndvpp",),
    (4, "null", "low"): ("vir04_3c",),
    (4, "null", "high"): ("vir04", "vir04_3c"),
}


class AscendCores(DeviceFit):
    """Ascend MindCluster (``huawei.com/npu-core``): AI cores, ``vnpu-level`` and
    ``vnpu-dvpp`` pick a 310P template; ``high`` degrades to the lighter template when
    AI CPUs are scarce; multiples of 8 cores are whole cards."""

    name = "AscendCores"
    kinds = frozenset({"npu-core"})

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """The Ascend vNPU pool of the request's chip (310P3 when it names none)."""
        return (("ascend", "vnpu", request.chip or "310P3"),)

    @staticmethod
    def templates(request: DeviceRequest, constraints: Constraints) -> tuple[VnpuTemplate, ...]:
        """The 310P templates for the request's AI cores, ``vnpu-dvpp`` and ``vnpu-level``, in
        preference order (a later one is the degraded choice); none for a combination MindCluster
        does not offer."""
        key = (
            request.npu_cores or 0,
            constraints.vnpu_dvpp or "null",
            constraints.vnpu_level or "low",
        )
        names = MINDCLUSTER_TABLE.get(key, ())
        return tuple(
            VnpuTemplate(
                name=n,
                ai_core=MINDCLUSTER_TEMPLATES[n][0],
                ai_cpu=MINDCLUSTER_TEMPLATES[n][1],
                memory=MINDCLUSTER_TEMPLATES[n][2],
            )
            for n in names
        )

    def demand(self, request: DeviceRequest, index: PoolIndex) -> tuple[int, int]:
        """The smallest memory of the templates for the request's cores; the smallest card's whole
        memory when exclusive."""
        if request.exclusive:
            return index.min_total, 0
        found = self.templates(request, Constraints())
        return min((t.memory for t in found), default=0), 0

    def filter(
        self, node: NodeState, request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """An unresolvable reason when no template serves the request's cores, ``vnpu-dvpp`` and
        ``vnpu-level`` (and it does not ask whole cards); else the pool's devices fitted."""
        templates = self.templates(request, constraints)
        if not templates and not request.exclusive:
            return Reason(
                kind="no-template-for",
                code=UNRESOLVABLE,
                detail=f"{request.npu_cores} AI cores with "
                f"vnpu-dvpp={constraints.vnpu_dvpp or 'null'}, "
                f"vnpu-level={constraints.vnpu_level or 'low'}",
            )
        return super().filter(node, request, constraints, ctx)

    def fit(
        self, devs: list[Dev], request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """Cards with room for one of the request's templates, the first preferred."""
        templates = self.templates(request, constraints)
        return template_picks(devs, request, constraints, ctx, templates)
