"""One user per MPS card: an MPS daemon serves one Linux user at a time (a second user's
client hangs at CUDA initialisation until the first user's clients end), so two pods
share an MPS card only when their device containers run as the same UID
(shared/core/families.py ``mps_refusal``, shared/core/request.py ``_run_as``). A client
reaches one card's daemon, so a container shares one MPS card at most
(``MPS_MULTI_CARD``, ``_mps_one_card``); a card whose daemon is not reported running is
offered to no MPS pod (shared/core/ledger.py ``mps_ready``)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.model import MPS_ALONE, MpsState, PodRequest, RequestError
from shared.core.placement import Failure, Placement, Placer
from shared.core.request import RequestParser, rejection
from tests.unit.corekit import PARSER, SPECS, gpu, gpus, placer, pod_json, ref

SLICE = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000, "nvidia.com/gpucores": 30}
MPS = {"nvidia.com/vgpu-mode": "mps"}


def parse(limits: dict[str, Any] = SLICE, parser: RequestParser = PARSER, **kw: Any) -> PodRequest:
    parsed = parser.parse(pod_json(limits, **kw))
    assert isinstance(parsed, PodRequest), parsed
    return parsed


def attempt(pl: Placer, request: PodRequest, name: str) -> Placement | Failure:
    return pl.place(ref(name), request, None)


def card_of(result: Placement | Failure) -> str:
    assert isinstance(result, Placement), result
    return result.grants[0].devices[0].uuid


def test_the_uid_comes_from_the_container_then_the_pod() -> None:
    assert parse(run_as=1000).constraints.run_as == 1000
    own = [
        {
            "name": "main",
            "resources": {"limits": SLICE},
            "securityContext": {"runAsUser": 2000},
        },
        {"name": "sidecar"},  # asks for no device: its user does not matter
    ]
    assert parse(containers=own, run_as=1000).constraints.run_as == 2000
    # Not set anywhere: no MPS card (the default rule), or one of its own.
    assert parse().constraints.run_as is None
    alone = RequestParser(SPECS, mps_unset_user="exclusive")
    assert parse(parser=alone).constraints.run_as == MPS_ALONE


def test_an_mps_pod_without_a_user_is_refused_with_the_reason() -> None:
    errors = RequestParser(SPECS).parse(pod_json(SLICE, annotations=MPS))
    assert isinstance(errors, tuple)
    [error] = errors
    assert isinstance(error, RequestError)
    assert error.field == "securityContext.runAsUser"
    assert "must set runAsUser" in error.message
    assert "unsetUser: exclusive" in error.message
    two = [
        {"name": n, "resources": {"limits": SLICE}, "securityContext": {"runAsUser": u}}
        for n, u in (("a", 1000), ("b", 2000))
    ]
    errors = RequestParser(SPECS).parse(pod_json(SLICE, annotations=MPS, containers=two))
    assert isinstance(errors, tuple)
    assert "different users [1000, 2000]" in errors[0].message


def test_two_users_never_share_an_mps_card_and_the_same_user_joins() -> None:
    pl = placer({"mps-0": [gpu(mode="mps")]})
    first = card_of(attempt(pl, parse(annotations=MPS, run_as=1000), "a"))
    other = attempt(pl, parse(annotations=MPS, run_as=2000), "b")
    assert isinstance(other, Failure)
    assert other.message == (
        "0/1 nodes are available: 1 device(s) serve another user's MPS clients."
    )
    assert not other.status.unresolvable  # it fits once the first user's pods end
    assert card_of(attempt(pl, parse(annotations=MPS, run_as=1000), "c")) == first
    # Once the first user's clients are gone, the card serves whoever comes next.
    pl.release(ref("a"))
    pl.release(ref("c"))
    assert card_of(attempt(pl, parse(annotations=MPS, run_as=2000), "b")) == first


def test_a_pod_without_a_user_takes_no_mps_card_by_default() -> None:
    pl = placer({"mps-0": gpus(2, mode="mps"), "soft-0": [gpu()]})
    # No mode asked: it goes to the software-sliced card.
    assert attempt(pl, parse(), "a").node == "soft-0"  # type: ignore[union-attr]
    only_mps = placer({"mps-0": gpus(2, mode="mps")})
    failure = attempt(only_mps, parse(), "b")
    assert isinstance(failure, Failure)
    assert "1 device(s) in MPS mode serve only pods that set runAsUser" in failure.message
    assert failure.status.unresolvable  # no preemption makes it fit


def test_exclusive_rule_gives_a_pod_without_a_user_an_mps_card_of_its_own() -> None:
    alone = RequestParser(SPECS, mps_unset_user="exclusive")
    pl = placer({"mps-0": gpus(2, mode="mps")})
    first = card_of(attempt(pl, parse(parser=alone, annotations=MPS), "a"))
    second = card_of(attempt(pl, parse(parser=alone, annotations=MPS), "b"))
    assert first != second  # two pods without a user never share
    blocked = attempt(pl, parse(parser=alone, annotations=MPS, run_as=1000), "c")
    assert isinstance(blocked, Failure)
    assert "serve another user's MPS clients" in blocked.message


@pytest.mark.parametrize("state", ["unavailable", ""])
def test_an_mps_card_whose_daemon_is_not_reported_running_is_offered_to_no_one(
    state: MpsState,
) -> None:
    """``""``: its agent never read the card's daemon (or runs an older agent): the card
    fails closed, as a pod there would run without its limits or hang."""
    down = gpu(mode="mps", mps=state)
    pl = placer({"mps-0": [down]})
    failure = attempt(pl, parse(annotations=MPS, run_as=1000), "a")
    assert isinstance(failure, Failure)
    assert "device(s) in MPS mode have no MPS daemon running" in failure.message
    assert not failure.status.unresolvable  # it fits once the daemon runs


TWO = {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 10000, "nvidia.com/gpucores": 30}


def test_a_container_asking_two_mps_cards_is_refused_with_the_reason() -> None:
    """An MPS client reaches one card's daemon (one daemon per card), so a container
    never shares two MPS cards."""
    # In MPS mode: invalid, as the webhook and the watcher report it.
    errors = PARSER.parse(pod_json(TWO, annotations=MPS, run_as=1000))
    assert isinstance(errors, tuple)
    assert rejection(errors) == (
        "invalid device request: nvidia.com/gpu (container main): 2 cards asked in MPS "
        "mode: an MPS client reaches one card's MPS daemon, so a container shares one "
        "card (ask for 1, or for whole cards, or another vgpu-mode)"
    )
    # No mode named: never on MPS cards, with the reason where no other card serves.
    only_mps = placer({"mps-0": gpus(4, mode="mps")})
    failure = attempt(only_mps, parse(TWO, run_as=1000), "a")
    assert isinstance(failure, Failure)
    assert failure.message == (
        "0/1 nodes are available: 1 device(s) in MPS mode serve one card per container."
    )
    assert failure.status.unresolvable  # no change of load helps
    mixed = placer({"mps-0": gpus(4, mode="mps"), "soft-0": gpus(2)})
    assert attempt(mixed, parse(TWO, run_as=1000), "b").node == "soft-0"  # type: ignore[union-attr]
    # Whole cards are no MPS clients: two of them are fine.
    whole = attempt(only_mps, parse({"nvidia.com/gpu": 2}, annotations=MPS), "c")
    assert isinstance(whole, Placement)
    assert all(d.exclusive for d in whole.grants[0].devices)
    # One card per container, two containers: each its own client.
    two_containers = [
        {"name": n, "resources": {"limits": SLICE}, "securityContext": {"runAsUser": 1000}}
        for n in ("a", "b")
    ]
    assert isinstance(attempt(only_mps, parse(containers=two_containers), "d"), Placement)


def test_software_sliced_cards_ignore_users() -> None:
    pl = placer({"soft-0": [gpu()]})
    one = card_of(attempt(pl, parse(run_as=1000), "a"))
    assert card_of(attempt(pl, parse(run_as=2000), "b")) == one
