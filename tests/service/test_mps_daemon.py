"""One MPS control daemon per card: the supervisor that runs them
(services/node_agent/mps/supervisor.py) and the agent's reader of their state
(services/node_agent/mps/reader.py), against tests/fakes/nvidia-cuda-mps-control: real
processes that daemonize per pipe directory, serve one user at a time, and record how
they were started (tests/mpsfake.py drives them)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.node_agent import metrics as m
from services.node_agent.mps import card_dirs, mps_cards
from services.node_agent.mps.control import Once
from services.node_agent.mps.reader import MpsReader, MpsReport, with_state
from services.node_agent.mps.supervisor import Supervisor
from shared.config import Config, MpsConfig, NodeAgentConfig
from shared.core.model import DeviceInfo, DeviceUUID, NodeName
from shared.metrics import Metrics
from tests.mpsfake import FAKE, FakeClient, daemon_up, need_unshare, starts, unshare_missing

A, B = DeviceUUID("GPU-aaaa1111"), DeviceUUID("GPU-bbbb2222")
NODE = NodeName("gpu-0")
INTERVAL = 0.1


def card(uuid: DeviceUUID, index: int, mode: str = "mps") -> DeviceInfo:
    return msgspec.convert(
        {"uuid": uuid, "index": index, "vendor": "nvidia", "model": "NVIDIA-H100"}
        | {"memory_mib": 81920, "mode": mode},
        DeviceInfo,
    )


CARDS = (card(A, 0), card(B, 1))


class Devices:
    """The node's devices as the supervisor reads them (an InventorySource); a test edits
    ``devices`` as an operator changes a card's mode."""

    def __init__(self, devices: tuple[DeviceInfo, ...]) -> None:
        self.devices = devices

    def read(self) -> tuple[DeviceInfo, ...]:
        return self.devices

    def usage(self) -> dict[str, tuple[int, float]]:
        return {}

    def close(self) -> None:
        return None


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[MpsConfig]:
    """The fake as the control binary, the card directories in ``tmp_path``; each daemon
    in its own mount namespace where this machine can make one. Removing the directories
    at the end ends every fake daemon and client (they watch their pipe directory)."""
    cfg = MpsConfig(
        control_command=str(FAKE),
        host_dir=str(tmp_path / "mps"),
        check_interval_s=INTERVAL,
        private_shm=unshare_missing() is None,
    )
    yield cfg
    shutil.rmtree(cfg.host_dir, ignore_errors=True)


@pytest.fixture
async def clients() -> AsyncIterator[list[FakeClient]]:
    """Fake clients a test starts (appended here), stopped at its end."""
    started: list[FakeClient] = []
    yield started
    for c in started:
        await c.stop()


def supervisor(mps: MpsConfig, devices: Devices) -> Supervisor:
    return Supervisor(Config(node_agent=NodeAgentConfig(mps=mps)), NODE, devices)


def pipe(mps: MpsConfig, uuid: DeviceUUID) -> Path:
    return card_dirs(mps, uuid).pipe


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def listed(directory: str) -> list[str] | None:
    """The names in ``directory``, sorted; None when it does not exist."""
    path = Path(directory)
    return sorted(p.name for p in path.iterdir()) if path.exists() else None


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


async def join(clients: list[FakeClient], mps: MpsConfig, uuid: DeviceUUID, uid: int) -> FakeClient:
    client = await FakeClient.start(pipe(mps, uuid), uid)
    clients.append(client)
    return client


# --- the supervisor -----------------------------------------------------------------------


async def test_each_mps_card_gets_a_daemon_of_its_own(mps: MpsConfig) -> None:
    await supervisor(mps, Devices(CARDS)).check()
    for uuid in (A, B):
        dirs = card_dirs(mps, uuid)
        (started,) = starts(dirs.pipe)
        assert started["env"] == {
            "CUDA_VISIBLE_DEVICES": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
        }
        assert daemon_up(dirs.pipe)
        # Clients of every UID reach the pipes and share the memory directory.
        assert mode_of(dirs.pipe) == 0o777
        assert mode_of(dirs.shm) == 0o1777
        assert dirs.log.is_dir()
    assert listed(mps.host_dir) == [A, B]


async def test_two_users_are_served_at_once_on_two_cards(
    mps: MpsConfig, clients: list[FakeClient]
) -> None:
    """A daemon serves one user at a time for every card it controls: with one daemon per
    card, a user on each card runs at once; a second user on one card still waits."""
    await supervisor(mps, Devices(CARDS)).check()
    first = await join(clients, mps, A, 1000)
    await first.reaches("ready")
    other_card = await join(clients, mps, B, 2000)
    await other_card.reaches("ready")
    same_card = await join(clients, mps, A, 2000)
    await same_card.reaches("pending")
    await first.stop()
    await same_card.reaches("ready")


async def test_each_daemon_uses_its_cards_shm_directory_as_dev_shm(mps: MpsConfig) -> None:
    """An MPS server and its clients share memory in /dev/shm: the daemon's is the card's
    shm directory, the one its client containers get at /dev/shm."""
    need_unshare()
    assert mps.private_shm
    await supervisor(mps, Devices(CARDS)).check()
    for uuid in (A, B):
        dirs = card_dirs(mps, uuid)
        (started,) = starts(dirs.pipe)
        seen = os.stat(dirs.shm)
        assert started["shm"] == [seen.st_dev, seen.st_ino]
    host = os.stat("/dev/shm")  # the supervisor's own is left alone
    assert [host.st_dev, host.st_ino] != starts(pipe(mps, A))[0]["shm"]


async def test_a_dead_daemon_is_started_again_alone(mps: MpsConfig) -> None:
    sup = supervisor(mps, Devices(CARDS))
    await sup.check()
    (dead,) = starts(pipe(mps, A))
    os.kill(dead["pid"], signal.SIGKILL)
    await sup.check()
    first, again = starts(pipe(mps, A))
    assert first["pid"] == dead["pid"] != again["pid"]
    assert daemon_up(pipe(mps, A))
    assert len(starts(pipe(mps, B))) == 1  # the other card's daemon was left alone


async def test_a_restarted_supervisor_adopts_the_running_daemons(
    mps: MpsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    await supervisor(mps, Devices(CARDS)).check()
    caplog.set_level(logging.INFO)
    await supervisor(mps, Devices(CARDS)).check()  # the next run of the supervisor
    assert [len(starts(pipe(mps, u))) for u in (A, B)] == [1, 1]
    adopted = [r.getMessage() for r in caplog.records if "adopted" in r.getMessage()]
    assert len(adopted) == 2


async def test_a_card_leaving_mps_mode_stops_its_daemon_once_idle(
    mps: MpsConfig, clients: list[FakeClient], caplog: pytest.LogCaptureFixture
) -> None:
    devices = Devices(CARDS)
    sup = supervisor(mps, devices)
    await sup.check()
    client = await join(clients, mps, A, 1000)
    await client.reaches("ready")
    devices.devices = (card(A, 0, mode="hami-core"), CARDS[1])
    for _ in range(2):
        await sup.check()
    assert daemon_up(pipe(mps, A))  # a client runs: kept
    assert len(warnings(caplog, "stops once its clients are gone")) == 1
    await client.stop()
    await sup.check()
    assert not daemon_up(pipe(mps, A))
    assert daemon_up(pipe(mps, B))
    await sup.check()  # nothing left to do for A: no new start
    assert len(starts(pipe(mps, A))) == 1
    assert list(sup.daemons) == [B]


async def test_a_daemon_left_by_a_previous_run_stops_when_idle(mps: MpsConfig) -> None:
    await supervisor(mps, Devices(CARDS)).check()
    await supervisor(mps, Devices(())).check()  # the node is in another mode now
    assert not daemon_up(pipe(mps, A))
    assert not daemon_up(pipe(mps, B))


async def test_devices_that_cannot_be_read_stop_no_daemon(
    mps: MpsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    devices = Devices(CARDS[:1])
    sup = supervisor(mps, devices)
    await sup.check()

    def broken() -> tuple[DeviceInfo, ...]:
        raise RuntimeError("NVML: driver/library version mismatch")

    devices.read = broken  # type: ignore[method-assign]
    for _ in range(3):
        await sup.check()
    assert daemon_up(pipe(mps, A))
    assert len(starts(pipe(mps, A))) == 1
    assert len(warnings(caplog, "cannot read the devices")) == 1


async def test_no_binary_warns_once_and_makes_no_directory(
    mps: MpsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = msgspec.structs.replace(mps, control_command="tessera-no-such-mps-control")
    sup = supervisor(cfg, Devices(CARDS))
    reader = MpsReader(cfg, NODE, [A, B])
    for _ in range(3):
        await sup.check()
        await reader.check()
    assert reader.state() == MpsReport({A: "unavailable", B: "unavailable"}, {A: 0, B: 0})
    assert warnings(caplog, "no tessera-no-such-mps-control") == [
        "node gpu-0: 2 card(s) set to mps but no tessera-no-such-mps-control on the PATH: no "
        "MPS daemon runs",
        "node gpu-0: 2 card(s) set to mps but no tessera-no-such-mps-control on the agent's "
        "PATH: they are offered to no MPS pod",
    ]
    assert listed(cfg.host_dir) is None


async def test_a_daemon_that_will_not_start_is_unavailable(
    mps: MpsConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "nvidia-cuda-mps-control"
    broken.write_text("#!/bin/sh\necho 'no GPU here' >&2\nexit 3\n")
    broken.chmod(0o755)
    cfg = msgspec.structs.replace(mps, control_command=str(broken))
    sup = supervisor(cfg, Devices(CARDS[:1]))
    for _ in range(2):
        await sup.check()
    (line,) = warnings(caplog, "cannot start the MPS control daemon")
    assert "exit 3: no GPU here" in line
    reader = MpsReader(cfg, NODE, [A])
    await reader.check()
    assert reader.state().states == {A: "unavailable"}


# --- the agent's reader ----------------------------------------------------------------


async def test_the_agent_reads_each_cards_state_and_clients(
    mps: MpsConfig, clients: list[FakeClient]
) -> None:
    await supervisor(mps, Devices(CARDS)).check()
    reader = MpsReader(mps, NODE, [A, B])
    await reader.start()
    assert reader.state() == MpsReport({A: "running", B: "running"}, {A: 0, B: 0})
    for uuid, uid in ((A, 1000), (A, 1000), (B, 1000)):
        await (await join(clients, mps, uuid, uid)).reaches("ready")
    await (await join(clients, mps, B, 2000)).reaches("pending")  # not served yet
    assert await reader.check()
    assert reader.state() == MpsReport({A: "running", B: "running"}, {A: 2, B: 1})
    assert not await reader.check()
    reader.set_cards([B])  # A left mps mode: not reported any more
    assert reader.state() == MpsReport({B: "running"}, {B: 1})


async def test_the_agent_never_starts_a_daemon(
    mps: MpsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """No supervisor on the node: the agent reports the card unavailable, says where the
    daemon should come from, and starts none (a daemon it started would die with it)."""
    reader = MpsReader(mps, NODE, [A])
    for _ in range(3):
        await reader.check()
    assert reader.state() == MpsReport({A: "unavailable"}, {A: 0})
    assert not starts(pipe(mps, A))
    (line,) = warnings(caplog, "no MPS control daemon answers")
    assert "tessera-mps-control" in line
    # Once the supervisor runs it, the next reading says so.
    await supervisor(mps, Devices(CARDS[:1])).check()
    assert await reader.check()
    assert reader.state().states == {A: "running"}


async def test_unreadable_client_lists_count_zero_and_keep_a_leaving_cards_daemon(
    mps: MpsConfig, clients: list[FakeClient], caplog: pytest.LogCaptureFixture
) -> None:
    devices = Devices(CARDS[:1])
    sup = supervisor(mps, devices)
    await sup.check()
    await (await join(clients, mps, A, 1000)).reaches("ready")
    (pipe(mps, A) / "fake-setup.json").write_text('{"client_list": "garbage"}')
    reader = MpsReader(mps, NODE, [A])
    for _ in range(3):
        await reader.check()
    assert reader.state() == MpsReport({A: "running"}, {A: 0})
    assert len(warnings(caplog, "cannot read the clients")) == 1
    # Clients it cannot count keep the daemon when the card leaves mps mode.
    devices.devices = ()
    await sup.check()
    assert daemon_up(pipe(mps, A))


async def test_a_failing_look_is_logged_once_and_made_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in one look (the supervisor's or the agent's) neither ends its loop nor
    floods the log."""
    once = Once()

    async def look(fail: bool) -> int:
        if fail:
            raise RuntimeError("a bug")
        return 7

    for _ in range(3):
        assert await once.guarded("bug", "gpu-0: looking", look(True)) is None
    assert await once.guarded("bug", "gpu-0: looking", look(False)) == 7
    assert await once.guarded("bug", "gpu-0: looking", look(True)) is None
    logged = [r for r in caplog.records if r.getMessage() == "node gpu-0: looking failed"]
    assert len(logged) == 2  # once, and once more after it had recovered
    assert logged[0].exc_info is not None


# --- what the inventory and the metrics carry ----------------------------------------------


def test_the_inventory_carries_each_cards_state_on_the_mps_cards_only() -> None:
    soft = (card(A, 0, mode="hami-core"), card(B, 1, mode="hami-core"))
    cfg = msgspec.convert({"nodeConfigs": [{"name": "gpu-0", "operatingMode": "mps"}]}, Config)
    assert mps_cards(cfg, "gpu-0", soft) == (A, B)
    assert mps_cards(cfg, "gpu-1", soft) == ()
    odd = card(DeviceUUID("../GPU-x"), 2)  # no directory can be named after it: no daemon
    assert mps_cards(Config(), "gpu-1", (*CARDS, odd)) == (A, B)
    out = with_state(soft, MpsReport({A: "running", B: "unavailable"}, {A: 2}))
    assert [(d.mps, d.mps_clients) for d in out] == [("running", 2), ("unavailable", 0)]
    assert with_state(soft, MpsReport({A: "running"}))[1] == soft[1]
    assert with_state(soft, MpsReport()) == soft


def test_the_metrics_report_each_cards_daemon_and_clients(tmp_path: Path) -> None:
    base = card(A, 0)
    other = card(B, 1)
    devices = with_state((base, other), MpsReport({A: "running", B: "unavailable"}, {A: 3}))
    node = m.NodeMetrics(Metrics("test"), "gpu-0", lambda: devices, dict, tmp_path, dict, lambda: 0)

    def samples() -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(node.metrics.text().decode()):
            for s in family.samples:
                if s.name.startswith("tessera_mps"):
                    out.setdefault(s.name, {})[s.labels["deviceuuid"]] = s.value
        return out

    assert samples() == {
        "tessera_mps_daemon_up": {A: 1, B: 0},
        "tessera_mps_clients": {A: 3, B: 0},
    }
    devices = (base,)  # no state read for any card: no sample
    assert samples() == {}
