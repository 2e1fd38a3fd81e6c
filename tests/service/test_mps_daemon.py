"""The node agent's MPS control daemon supervisor (services/node_agent/mps.py), run
against tests/fakes/nvidia-cuda-mps-control: a real process that daemonizes, answers the
control commands from a file the test writes, and records how it was started."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.node_agent import metrics as m
from services.node_agent.mps import (
    MpsDaemon,
    MpsReport,
    mps_cards,
    parse_device_clients,
    with_state,
)
from shared.config import Config, MpsConfig
from shared.core.model import DeviceInfo, DeviceUUID
from shared.metrics import Metrics
from tests.helpers import eventually

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "nvidia-cuda-mps-control"
A, B = DeviceUUID("GPU-aaaa1111"), DeviceUUID("GPU-bbbb2222")
INTERVAL = 0.1
CARDS = tuple(
    DeviceInfo(uuid=u, index=i, vendor="nvidia", model="NVIDIA-H100", memory_mib=81920)
    for i, u in enumerate((A, B))
)


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[MpsConfig]:
    """The fake as the control binary, pipe and log directories in ``tmp_path``; any
    fake daemon still running at the end is killed."""
    cfg = MpsConfig(
        control_command=str(FAKE),
        pipe_host_dir=str(tmp_path / "mps" / "pipe"),
        log_host_dir=str(tmp_path / "mps" / "log"),
        check_interval_s=INTERVAL,
    )
    yield cfg
    pid = daemon_pid(cfg)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def daemon_pid(cfg: MpsConfig) -> int | None:
    """The fake daemon's PID while it runs (a zombie counts as gone)."""
    try:
        pid = int((Path(cfg.pipe_host_dir) / "fake-daemon.pid").read_text())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError):
        return None
    return None if state in ("Z", "X") else pid


def starts(cfg: MpsConfig) -> list[dict[str, object]]:
    """Every start of the fake daemon: its PID and environment."""
    path = Path(cfg.pipe_host_dir) / "fake-daemon.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def mode_of(path: str) -> int | None:
    """A directory's permission bits, or None when it does not exist."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def clients(cfg: MpsConfig, servers: dict[str, dict[str, list[int]]], **modes: str) -> None:
    (Path(cfg.pipe_host_dir) / "fake-clients.json").write_text(
        json.dumps({"servers": servers, **modes})
    )


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


async def test_it_starts_the_daemon_for_the_mps_cards_with_its_directories(
    mps: MpsConfig,
) -> None:
    daemon = MpsDaemon(mps, "gpu-0", [A, B])
    await daemon.start()
    assert daemon.state() == MpsReport("running", {A: 0, B: 0})
    assert daemon.up
    (started,) = starts(mps)
    assert started["env"] == {
        "CUDA_VISIBLE_DEVICES": f"{A},{B}",
        "CUDA_MPS_PIPE_DIRECTORY": mps.pipe_host_dir,
        "CUDA_MPS_LOG_DIRECTORY": mps.log_host_dir,
    }
    assert started["pid"] == daemon_pid(mps)
    # Clients of every UID reach the pipes.
    assert mode_of(mps.pipe_host_dir) == 0o777
    assert mode_of(mps.log_host_dir) is not None
    assert (Path(mps.pipe_host_dir) / "tessera-cards").read_text().split() == [A, B]


async def killed_daemon(mps: MpsConfig) -> tuple[MpsDaemon, int]:
    """A supervisor whose daemon was started, then SIGKILLed; and the dead one's pid."""
    daemon = MpsDaemon(mps, "gpu-0", [A])
    await daemon.start()
    first = daemon_pid(mps)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    return daemon, first


async def test_a_dead_daemon_is_started_again(mps: MpsConfig) -> None:
    daemon, first = await killed_daemon(mps)
    changes = 0

    async def changed() -> None:
        nonlocal changes
        changes += 1

    async def restarted() -> int | None:
        pid = daemon_pid(mps)
        return pid if pid != first else None

    loop = asyncio.create_task(daemon.supervise(changed))
    try:  # generous for a loaded machine: test_one_round_is_enough_to_restart counts rounds
        again = await eventually(restarted, timeout_s=10, interval_s=INTERVAL / 2, what="restart")
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
    assert again != first
    assert [s["pid"] for s in starts(mps)] == [first, again]
    assert daemon.state() == MpsReport("running", {A: 0})
    assert changes == 0  # it was running before and after


async def test_one_round_is_enough_to_restart(mps: MpsConfig) -> None:
    daemon, first = await killed_daemon(mps)
    await daemon.check()
    assert daemon_pid(mps) not in (None, first)
    assert len(starts(mps)) == 2


async def test_a_restarted_agent_adopts_the_running_daemon(
    mps: MpsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    await MpsDaemon(mps, "gpu-0", [A]).start()
    pid = daemon_pid(mps)
    clients(mps, {"4242": {A: [101]}})
    caplog.set_level(logging.INFO)
    again = MpsDaemon(mps, "gpu-0", [A])  # the next run of the agent
    await again.start()
    assert daemon_pid(mps) == pid
    assert len(starts(mps)) == 1
    assert again.state() == MpsReport("running", {A: 1})
    assert any("adopted the running MPS control daemon" in r.getMessage() for r in caplog.records)


async def test_an_adopted_daemon_for_other_cards_is_restarted_only_when_idle(
    mps: MpsConfig,
) -> None:
    await MpsDaemon(mps, "gpu-0", [A]).start()
    pid = daemon_pid(mps)
    clients(mps, {"4242": {A: [101]}})
    daemon = MpsDaemon(mps, "gpu-0", [A, B])  # B was set to mps since
    await daemon.start()
    assert daemon_pid(mps) == pid  # a client runs: kept
    assert daemon.state().waiting == {B}  # B is offered to no MPS pod meanwhile
    assert [d.mps for d in with_state(CARDS, daemon.state())] == ["running", "unavailable"]
    clients(mps, {})
    await daemon.check()
    assert daemon_pid(mps) not in (None, pid)
    assert starts(mps)[-1]["env"]["CUDA_VISIBLE_DEVICES"] == f"{A},{B}"  # type: ignore[index]
    assert daemon.state() == MpsReport("running", {A: 0, B: 0})
    assert [d.mps for d in with_state(CARDS, daemon.state())] == ["running", "running"]


async def test_no_binary_makes_the_cards_unavailable_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = MpsConfig(
        control_command="tessera-no-such-mps-control",
        pipe_host_dir=str(tmp_path / "pipe"),
        log_host_dir=str(tmp_path / "log"),
        check_interval_s=INTERVAL,
    )
    daemon = MpsDaemon(cfg, "gpu-0", [A, B])
    await daemon.start()
    for _ in range(3):
        assert not await daemon.check()
    assert daemon.state() == MpsReport("unavailable", {A: 0, B: 0})
    assert not daemon.up
    assert warnings(caplog, "set to mps") == [
        "node gpu-0: 2 card(s) set to mps but no tessera-no-such-mps-control on the PATH: "
        "they are offered to no MPS pod"
    ]
    assert mode_of(cfg.pipe_host_dir) is None


async def test_the_daemon_stops_when_no_card_is_in_mps_mode_and_no_client_is_left(
    mps: MpsConfig,
) -> None:
    daemon = MpsDaemon(mps, "gpu-0", [A])
    await daemon.start()
    pid = daemon_pid(mps)
    clients(mps, {"4242": {A: [101, 102]}})
    assert not await daemon.stop_if_idle()  # a card is still in mps mode
    daemon.set_cards([])
    assert not await daemon.stop_if_idle()  # clients remain
    await daemon.check()
    assert daemon_pid(mps) == pid
    clients(mps, {"4242": {A: []}})  # the server is idle
    await daemon.check()
    assert daemon_pid(mps) is None
    assert daemon.state() == MpsReport()
    assert not daemon.up
    await daemon.check()  # nothing left to do: no new start
    assert len(starts(mps)) == 1


async def test_a_daemon_left_by_a_previous_run_stops_when_idle(mps: MpsConfig) -> None:
    await MpsDaemon(mps, "gpu-0", [A]).start()
    assert daemon_pid(mps) is not None
    await MpsDaemon(mps, "gpu-0", []).start()  # the node is in another mode now
    assert daemon_pid(mps) is None


async def test_clients_are_counted_per_card(mps: MpsConfig) -> None:
    daemon = MpsDaemon(mps, "gpu-0", [A, B])
    await daemon.start()
    clients(mps, {"4242": {A: [101, 102], B: [103]}, "4343": {A: [201]}})
    assert await daemon.check()
    assert daemon.state() == MpsReport("running", {A: 3, B: 1})
    assert not await daemon.check()


async def test_without_the_device_list_clients_are_counted_per_server(mps: MpsConfig) -> None:
    two = MpsDaemon(mps, "gpu-0", [A, B])
    await two.start()
    clients(mps, {"4242": {A: [101], B: [102]}}, device_list="unknown")
    await two.check()
    # Which card a server's client uses is not said: each card reports all of them.
    assert two.state() == MpsReport("running", {A: 2, B: 2})
    one = MpsDaemon(mps, "gpu-0", [A])  # exact with one card
    clients(mps, {"4242": {A: [101, 102]}, "4343": {A: [201]}}, device_list="unknown")
    await one.start()
    assert one.state() == MpsReport("running", {A: 3})


async def test_unreadable_client_lists_report_zero_and_warn_once(
    mps: MpsConfig, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = MpsDaemon(mps, "gpu-0", [A])
    await daemon.start()
    clients(mps, {"4242": {A: [101]}}, device_list="garbage", client_list="garbage")
    for _ in range(3):
        await daemon.check()
    assert daemon.state() == MpsReport("running", {A: 0})
    assert len(warnings(caplog, "get_device_client_list")) == 1
    assert len(warnings(caplog, "cannot read the clients")) == 1
    # Clients it cannot count keep the daemon when the node leaves mps mode.
    daemon.set_cards([])
    assert not await daemon.stop_if_idle()
    assert daemon_pid(mps) is not None


async def test_a_daemon_that_will_not_start_is_unavailable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "nvidia-cuda-mps-control"
    broken.write_text("#!/bin/sh\necho 'no GPU here' >&2\nexit 3\n")
    broken.chmod(0o755)
    cfg = MpsConfig(
        control_command=str(broken),
        pipe_host_dir=str(tmp_path / "pipe"),
        log_host_dir=str(tmp_path / "log"),
        check_interval_s=INTERVAL,
    )
    daemon = MpsDaemon(cfg, "gpu-0", [A])
    await daemon.start()
    await daemon.check()
    assert daemon.state() == MpsReport("unavailable", {A: 0})
    (line,) = warnings(caplog, "cannot start the MPS control daemon")
    assert "exited with 3: no GPU here" in line


def test_device_client_lists_are_parsed_in_either_layout() -> None:
    assert parse_device_clients(f"{A}\n  101\n  102\n{B}\n") == {A: {101, 102}, B: set()}
    assert parse_device_clients(f"{A}: 101, 102\n{B}: 103\n") == {A: {101, 102}, B: {103}}
    assert parse_device_clients("Device 1:\n7\n", order=[A, B]) == {B: {7}}
    assert parse_device_clients("") == {}
    assert parse_device_clients("101\n") is None  # a PID of no device
    assert parse_device_clients(f"{A}\nPID 101\n") is None
    assert parse_device_clients("Device 3:\n7\n", order=[A]) is None


def test_the_inventory_carries_the_state_on_the_mps_cards_only() -> None:
    cards = CARDS
    cfg = msgspec.convert({"nodeConfigs": [{"name": "gpu-0", "operatingMode": "mps"}]}, Config)
    assert mps_cards(cfg, "gpu-0", cards) == (A, B)
    assert mps_cards(cfg, "gpu-1", cards) == ()
    out = with_state(cards, MpsReport("running", {A: 2}))
    assert (out[0].mps, out[0].mps_clients) == ("running", 2)
    assert out[1] == cards[1]
    assert with_state(cards, MpsReport()) == cards


def test_the_metrics_report_the_daemon_and_its_clients(tmp_path: Path) -> None:
    base = DeviceInfo(uuid=A, index=0, vendor="nvidia", model="NVIDIA-H100", memory_mib=81920)
    other = msgspec.structs.replace(base, uuid=B, index=1)
    devices = with_state((base, other), MpsReport("running", {A: 3}))
    node = m.NodeMetrics(Metrics("test"), "gpu-0", lambda: devices, dict, tmp_path, dict, lambda: 0)

    def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples
        }

    got = samples(node.metrics.text())
    assert got[("tessera_mps_daemon_up", (("node", "gpu-0"),))] == 1
    clients = {dict(k)["deviceuuid"]: v for (n, k), v in got.items() if n == "tessera_mps_clients"}
    assert clients == {A: 3}
    devices = with_state((base,), MpsReport("unavailable", {A: 0}))
    assert samples(node.metrics.text())[("tessera_mps_daemon_up", (("node", "gpu-0"),))] == 0
    devices = (base,)  # no card in mps mode: no sample
    assert not [k for k in samples(node.metrics.text()) if k[0].startswith("tessera_mps")]
