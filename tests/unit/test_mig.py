"""Dynamic MIG against a fake NVML layer modelling an A100-80GB (never a real card)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from services.node_agent.mig import GiProfile, Instance, MigError, changes_for, reconfigure
from shared.core.model import ContainerGrant, DeviceGrant, DeviceInfo, DeviceUUID, MigInstance
from shared.core.spec import DeviceSpecs

A100 = "NVIDIA-A100-SXM4-80GB"
CARD = "GPU-8a2b3c4d"
PROFILES = [
    GiProfile(0, 1, 9728),  # 1g.10gb
    GiProfile(9, 1, 19968),  # 1g.20gb
    GiProfile(1, 2, 19968),  # 2g.20gb
    GiProfile(2, 3, 40192),  # 3g.40gb
    GiProfile(3, 4, 40192),  # 4g.40gb
    GiProfile(4, 7, 80384),  # 7g.80gb
]
PLACEMENTS = {
    0: [(i, 1) for i in range(7)],
    9: [(0, 2), (2, 2), (4, 2), (6, 2)],
    1: [(0, 2), (2, 2), (4, 2)],
    2: [(0, 4), (4, 4)],
    3: [(0, 4)],
    4: [(0, 8)],
}


@dataclass
class FakeCard:
    """The MIG surface of one A100-80GB; ``calls`` records every change made."""

    enabled: bool = True
    running: list[Instance] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def mig_enabled(self, card: str) -> bool:
        return self.enabled

    def profiles(self, card: str) -> list[GiProfile]:
        return list(PROFILES)

    def placements(self, card: str, profile_id: int) -> list[tuple[int, int]]:
        return list(PLACEMENTS[profile_id])

    def instances(self, card: str) -> list[Instance]:
        return list(self.running)

    def create(self, card: str, profile: GiProfile, start: int) -> None:
        size = dict(PLACEMENTS[profile.id])[start]
        assert all(start + size <= i.start or i.start + i.size <= start for i in self.running)
        self.running.append(Instance(object(), profile.id, start, size))
        self.calls.append(f"create {profile.id}@{start}")

    def destroy(self, card: str, instance: Instance) -> None:
        self.running.remove(instance)
        self.calls.append(f"destroy {instance.profile_id}@{instance.start}")

    def geometry(self) -> list[tuple[int, int]]:
        return sorted((i.start, i.profile_id) for i in self.running)


SPEC = DeviceSpecs().nvidia


def card_running(*instances: tuple[int, int]) -> FakeCard:
    sizes = {pid: dict(PLACEMENTS[pid]) for pid in PLACEMENTS}
    return FakeCard(
        running=[Instance(object(), pid, start, sizes[pid][start]) for pid, start in instances]
    )


def test_a_whole_card_is_cut_into_the_granted_geometry() -> None:
    card = card_running((4, 0))  # 7g.80gb
    assert reconfigure(card, CARD, ["3g.40gb", "3g.40gb"], SPEC, A100, in_use=False)
    assert card.calls == ["destroy 4@0", "create 2@0", "create 2@4"]
    assert card.geometry() == [(0, 2), (4, 2)]


def test_mixed_profiles_take_the_lowest_free_placements() -> None:
    card = FakeCard()
    geometry = ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"]
    assert reconfigure(card, CARD, geometry, SPEC, A100, in_use=False)
    assert card.geometry() == [(0, 1), (2, 1), (4, 1), (6, 0)]


def test_a_card_already_running_the_geometry_is_left_alone() -> None:
    card = card_running((2, 4), (2, 0))
    assert not reconfigure(card, CARD, ["3g.40gb", "3g.40gb"], SPEC, A100, in_use=True)
    assert card.calls == []


def test_a_card_in_use_or_with_mig_off_is_never_touched() -> None:
    card = card_running((4, 0))
    with pytest.raises(MigError, match="holds one of its instances"):
        reconfigure(card, CARD, ["3g.40gb", "3g.40gb"], SPEC, A100, in_use=True)
    off = FakeCard(enabled=False)
    with pytest.raises(MigError, match="MIG mode is off"):
        reconfigure(off, CARD, ["7g.80gb"], SPEC, A100, in_use=False)
    assert card.calls == []
    assert off.calls == []


def test_a_geometry_that_does_not_fit_leaves_the_card_as_it_was() -> None:
    card = card_running((4, 0))
    with pytest.raises(MigError, match="does not fit"):
        reconfigure(card, CARD, ["4g.40gb", "4g.40gb"], SPEC, A100, in_use=False)
    assert card.calls == []
    assert card.geometry() == [(0, 4)]


def test_only_a_grant_whose_instance_is_missing_asks_for_a_cut() -> None:
    running = (MigInstance(profile="7g.80gb", memory_mib=80384, placement=0, uuid="MIG-whole"),)
    cards = {
        DeviceUUID(u): DeviceInfo(
            uuid=DeviceUUID(u),
            index=i,
            vendor="nvidia",
            model=A100,
            memory_mib=81920,
            mode="mig",
            mig_geometry=running,
        )
        for i, u in enumerate(("GPU-a", "GPU-b"))
    }

    def grant(card: str, profile: str, placement: int, geometry: str) -> tuple[ContainerGrant, ...]:
        d = DeviceGrant(
            uuid=DeviceUUID(card),
            mig_profile=profile,
            mig_placement=placement,
            mig_geometry=geometry,
        )
        return (ContainerGrant(container="c", devices=(d,)),)

    # The card runs 7g.80gb: a 7g.80gb grant needs nothing, a 3g.40gb one needs a cut.
    assert changes_for(grant("GPU-a", "7g.80gb", 0, "7g.80gb"), cards, []) == []
    (cut,) = changes_for(grant("GPU-a", "3g.40gb", 1, "3g.40gb,3g.40gb"), cards, [])
    assert (cut.card, cut.geometry, cut.in_use) == ("GPU-a", ("3g.40gb", "3g.40gb"), False)
    # Another pod holds the whole card: the cut is asked for, but the card is in use.
    others = [grant("GPU-a", "7g.80gb", 0, "7g.80gb")]
    (busy,) = changes_for(grant("GPU-a", "3g.40gb", 0, "3g.40gb,3g.40gb"), cards, others)
    assert busy.in_use
    with pytest.raises(MigError, match="holds one of its instances"):
        reconfigure(card_running((4, 0)), busy.card, busy.geometry, SPEC, A100, busy.in_use)
