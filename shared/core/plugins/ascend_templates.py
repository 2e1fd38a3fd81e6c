"""AscendTemplates: Ascend hard slicing by vNPU template (HAMi's Ascend mode)."""

from __future__ import annotations

from shared.core.families import DeviceFit, FitContext, Picks, template_picks
from shared.core.ledger import Dev, PoolIndex, PoolKey
from shared.core.model import Constraints, DeviceRequest
from shared.core.spec import DeviceSpecs, VnpuChip, VnpuTemplate
from shared.core.status import Reason


class AscendTemplates(DeviceFit):
    """Ascend hard slicing (HAMi mode): memory rounds UP to the smallest template that fits;
    when no template fits but the card does, the whole card; several cards only whole."""

    name = "AscendTemplates"
    kinds = frozenset({"npu-template"})

    def __init__(self, specs: DeviceSpecs) -> None:
        super().__init__(specs)
        self.chips: dict[str, VnpuChip] = {c.chip_name: c for c in specs.vnpus}

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """The Ascend vNPU pool of the request's chip."""
        return (("ascend", "vnpu", request.chip or ""),)

    def template(self, request: DeviceRequest) -> VnpuTemplate | None:
        """The template a request rounds up to; None means the whole card."""
        chip = self.chips.get(request.chip or "")
        if chip is None or request.exclusive or request.memory_mib is None:
            return None
        fitting = [t for t in chip.templates if t.memory >= request.memory_mib]
        return min(fitting, key=lambda t: t.memory) if fitting else None

    def demand(self, request: DeviceRequest, index: PoolIndex) -> tuple[int, int]:
        """The memory of the template the request rounds up to, else the smallest card's whole
        memory."""
        t = self.template(request)
        return (t.memory if t is not None else index.min_total), 0

    def fit(
        self, devs: list[Dev], request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """Cards holding the request's template; without a fitting template, whole cards
        (exclusive)."""
        t = self.template(request)
        if t is None and not request.exclusive:
            whole = DeviceRequest(
                vendor="ascend",
                kind="npu-template",
                resource=request.resource,
                count=request.count,
                memory_percent=100,
                exclusive=True,
                chip=request.chip,
            )
            return template_picks(devs, whole, constraints, ctx, ())
        return template_picks(devs, request, constraints, ctx, (t,) if t else ())


# MindCluster 310P templates: name -> (AI cores, AI CPUs, MiB)
