"""MIGInstances: NVIDIA MIG instances, cut to the geometry that wastes least."""

from __future__ import annotations

from shared.core.families import (
    BUSY,
    MIG_NONE_FREE,
    MIG_TOO_SMALL,
    DeviceFit,
    FitContext,
    Picks,
    screen,
    usable,
)
from shared.core.ledger import Dev, MigSlot, PoolIndex, PoolKey, geometry_id
from shared.core.model import Constraints, DeviceRequest
from shared.core.status import UNRESOLVABLE, Reason

# --- MIG --------------------------------------------------------------------------------


class MIGInstances(DeviceFit):
    """MIG instances: a card keeps one geometry while any instance is used; the smallest
    instance that fits is taken; an idle card is (re)configured to the geometry that
    wastes least (smallest fitting instance, then most instances), preferring the one it
    already runs. Each device of the request is one instance; instances of one card may
    serve one container (upstream allows more devices than cards in MIG mode). A request
    through ``nvidia.com/mig-<profile>`` takes existing instances of that profile only,
    never recutting a card (NVIDIA's plugin in ``migStrategy: mixed`` hands what exists)."""

    name = "MIGInstances"
    kinds = frozenset({"vgpu"})

    def pools(self, request: DeviceRequest, constraints: Constraints) -> tuple[PoolKey, ...]:
        """The NVIDIA MIG pool, for a vGPU request not pinned to another mode."""
        if request.vendor != "nvidia" or request.kind != "vgpu":
            return ()
        if constraints.mode not in (None, "mig"):
            return ()
        return (("nvidia", "mig", ""),)

    def demand(self, request: DeviceRequest, index: PoolIndex) -> tuple[int, int]:
        """The request's memory (no cores: an instance's compute comes with its profile)."""
        return request.memory_mib or 0, 0

    def fit(
        self, devs: list[Dev], request: DeviceRequest, constraints: Constraints, ctx: FitContext
    ) -> Picks | Reason:
        """One instance per device asked, the smallest that fits on a card whose geometry (in use,
        or chosen now for an idle card) holds it; a reason when no geometry has one free."""

        def static(d: Dev) -> Reason | None:
            if d.mig is None:
                return Reason(kind="no-mig-geometry", code=UNRESOLVABLE, detail=d.model)
            if request.mig_profile is not None:
                return None  # whether the card holds one is a matter of its geometry now
            return MIG_TOO_SMALL if self._need(request, d) > d.mig.largest else None

        def dynamic(d: Dev) -> Reason | None:
            return usable(d) or (BUSY if request.exclusive and d.mig_used else None)

        screened = screen(devs, constraints, static, dynamic)
        cards = screened.ok
        if not cards:
            return screened.failure()
        # tentative state per card: geometry chosen and placements taken
        alt = {d.uuid: d.mig_alt if d.mig_used else -1 for d in cards}
        taken: dict[str, set[int]] = {d.uuid: set(d.mig_used) for d in cards}
        picks: Picks = []
        for _ in range(request.count):
            best: tuple[tuple[float, ...], Dev, int, MigSlot] | None = None
            for d in cards:
                for a, slot in self._options(d, alt[d.uuid], taken[d.uuid], request):
                    used = len(taken[d.uuid])
                    fill = -used if ctx.device_policy == "spread" else used
                    rank = (slot.memory_mib, 0 if a == d.mig_reported else 1, -fill)
                    if best is None or rank < best[0]:
                        best = (rank, d, a, slot)
            if best is None:
                if request.mig_profile is not None:
                    return Reason(
                        kind="mig-profile-none-free",
                        detail=f"no free MIG {request.mig_profile} instance",
                    )
                return MIG_NONE_FREE
            _, d, a, slot = best
            assert d.mig is not None
            alt[d.uuid] = a
            taken[d.uuid].add(slot.placement)
            picks.append(
                (
                    d,
                    d.grant(
                        memory_mib=slot.memory_mib,
                        mig_profile=slot.profile,
                        mig_placement=slot.placement,
                        mig_geometry=geometry_id(d.mig.alternatives[a]),
                        exclusive=False,
                        external=request.mig_profile is not None,
                    ),
                )
            )
        return picks

    @staticmethod
    def _need(request: DeviceRequest, d: Dev) -> int:
        """MiB asked; a percentage is of the largest instance (100 % = the whole card)."""
        if request.memory_mib is not None:
            return request.memory_mib
        largest = d.mig.largest if d.mig is not None else d.phys_mem
        return largest * (request.memory_percent or 100) // 100

    def _options(
        self, d: Dev, alt: int, taken: set[int], request: DeviceRequest
    ) -> list[tuple[int, MigSlot]]:
        """(geometry, instance) pairs that could take the request: the smallest per geometry.

        A ``nvidia.com/mig-<profile>`` request takes an instance of that profile that
        exists now (the geometry the card runs: in use, else as reported), as NVIDIA's
        device plugin in ``migStrategy: mixed`` hands only existing instances."""
        assert d.mig is not None
        profile = request.mig_profile
        if profile is not None:
            now = alt if alt >= 0 else d.mig_reported
            if now < 0:
                return []
            same = [
                s
                for s in d.mig.alternatives[now]
                if s.profile == profile and s.placement not in taken
            ]
            return [(now, min(same, key=lambda s: s.placement))] if same else []
        need = self._need(request, d)
        alts = [alt] if alt >= 0 else range(len(d.mig.alternatives))
        found = []
        for a in alts:
            free = [
                s
                for s in d.mig.alternatives[a]
                if s.placement not in taken and s.memory_mib >= need
            ]
            if free:
                found.append((a, min(free, key=lambda s: (s.memory_mib, s.placement))))
        if alt < 0 and found:
            smallest = min(s.memory_mib for _, s in found)
            found = [(a, s) for a, s in found if s.memory_mib == smallest]
            # among equals, the geometry with most instances leaves most room
            most = max(len(d.mig.alternatives[a]) for a, _ in found)
            found = [
                (a, s)
                for a, s in found
                if len(d.mig.alternatives[a]) == most or a == d.mig_reported
            ]
        return found
