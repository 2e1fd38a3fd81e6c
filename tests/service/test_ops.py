"""``tessera get``, ``top`` and ``ping`` as processes on a real nats-server, a stand-in
answering the views (shared/views.py) as the allocator and the coordinator would: the
tables come out as tools/ops.py renders them; with nobody answering, NATS down or the
API server down, each command says so in one line naming the URL, within 5 s, exit 1."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest
import yaml
from nats.aio.msg import Msg

from shared import views
from shared.bus import VIEW_ERROR_HEADER, connect
from shared.config import NatsConfig
from tests.unit.test_ops import LEDGER, QUEUES
from tools import ops
from tools.localcluster import free_port, service_settings

REPO = Path(__file__).resolve().parents[2]

Answer = Callable[[bytes], msgspec.Struct | str]
"""A stand-in's answer to one request's payload: a view, or (a string) the reason it
could not make one."""


async def tessera(*args: str, timeout_s: float = 30) -> tuple[int, str, str, float]:
    """Run the CLI as a user would: exit code, stdout, stderr, seconds it took."""
    env = {k: v for k, v in os.environ.items() if k not in ("TESSERA_CONFIG", "KUBECONFIG")}
    env["HOME"] = "/nonexistent"  # no ~/.kube/config of the machine's
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.cli",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode(), time.monotonic() - started


@contextlib.asynccontextmanager
async def stand_in(cfg: NatsConfig, answers: dict[str, Answer]) -> AsyncIterator[list[bytes]]:
    """Answer each view subject as its service would; yields the payloads asked."""
    asked: list[bytes] = []
    nc = await connect(cfg, "admin")

    def responder(make: Answer) -> Callable[[Msg], object]:
        async def respond(msg: Msg) -> None:
            asked.append(msg.data)
            view = make(msg.data)
            if isinstance(view, str):
                await nc.publish(msg.reply, b"", headers={VIEW_ERROR_HEADER: view})
            else:
                await nc.publish(msg.reply, msgspec.json.encode(view))

        return respond

    for subject, make in answers.items():
        await nc.subscribe(subject, cb=responder(make))
    await nc.flush()
    try:
        yield asked
    finally:
        await nc.close()


@pytest.fixture
def config(nats_admin: NatsConfig, tmp_path: Path) -> str:
    """A tessera.yaml for the session's bus (the CLI connects as ``admin`` unless told)."""
    path = tmp_path / "tessera.yaml"
    path.write_text(yaml.safe_dump({"nats": service_settings(nats_admin)}))
    return str(path)


BOTH: dict[str, Answer] = {
    views.VIEW_LEDGER_SUBJECT: lambda _: LEDGER,
    views.VIEW_QUEUES_SUBJECT: lambda _: QUEUES,
}


async def test_get_prints_the_tables_of_the_views(nats_admin: NatsConfig, config: str) -> None:
    async with stand_in(nats_admin, BOTH) as asked:
        code, out, err, _ = await tessera("get", "devices", "--config", config)
        assert (code, err) == (0, "")
        assert out == ops.devices_table(LEDGER)
        code, out, _, _ = await tessera("get", "nodes", "--node", "gpu-a", "--config", config)
        assert out == ops.nodes_table(LEDGER)
        assert msgspec.json.decode(asked[-1], type=views.LedgerQuery).nodes == ("gpu-a",)
        code, out, _, _ = await tessera("get", "queues", "--config", config)
        assert (code, out) == (0, ops.queues_text(QUEUES))
        code, out, _, _ = await tessera("get", "devices", "-o", "json", "--config", config)
        assert msgspec.json.decode(out, type=views.LedgerView) == LEDGER


async def test_the_reader_user_may_ask_for_views(nats_admin: NatsConfig, config: str) -> None:
    """``reader`` (shared/busauth.py: external tools) publishes the request and reads
    the answer on its own inbox prefix."""
    async with stand_in(nats_admin, BOTH):
        code, out, err, _ = await tessera("get", "devices", "--user", "reader", "--config", config)
    assert (code, err) == (0, "")
    assert out == ops.devices_table(LEDGER)


async def test_top_once_prints_totals_devices_and_queues(
    nats_admin: NatsConfig, config: str
) -> None:
    async with stand_in(nats_admin, BOTH):
        code, out, err, _ = await tessera("top", "--once", "--config", config)
    assert (code, err) == (0, "")
    assert out == "\n".join(
        [ops.totals(LEDGER, QUEUES), ops.devices_table(LEDGER), ops.queues_text(QUEUES)]
    )


async def test_top_redraws_until_ctrl_c_then_exits_0(nats_admin: NatsConfig, config: str) -> None:
    # A plain Popen read and waited for in threads: its exit is seen by waitpid itself,
    # not through asyncio's child watcher (which, late in a full run, missed it: the
    # process had exited, its loop "closed", and communicate() waited on).
    async with stand_in(nats_admin, BOTH) as asked:
        proc = subprocess.Popen(  # noqa: ASYNC220 (waited for in threads, by waitpid)
            [sys.executable, "-m", "tools.cli", "top", "--interval", "0.2", "--config", config],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Ctrl-C as a terminal sends it: a SIGINT the test process ignores by now
            # (set by an earlier test's tooling) would be ignored by the child too.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            assert proc.stdout is not None
            frames = 0
            async with asyncio.timeout(20):
                while frames < 2:
                    line = await asyncio.to_thread(proc.stdout.readline)
                    frames += line.startswith(b"tessera top ")
            proc.send_signal(signal.SIGINT)
            _, err = await asyncio.to_thread(proc.communicate, timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0
    assert err == b""
    assert len(asked) >= 4  # both views, at least twice


@pytest.mark.parametrize(
    "command",
    [["get", "devices"], ["get", "queues"], ["top", "--once"]],
    ids=["devices", "queues", "top"],
)
async def test_with_no_service_answering_one_line_within_5s(
    config: str, command: list[str]
) -> None:
    code, out, err, took = await tessera(*command, "--config", config)
    assert code == 1
    assert took < 5
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"tessera {command[0]}: no ")
    assert "answers tessera.ctl.view." in line
    assert "is it running (and active)?" in line


async def test_a_view_the_service_cannot_make_is_one_line(
    nats_admin: NatsConfig, config: str
) -> None:
    async with stand_in(nats_admin, {views.VIEW_LEDGER_SUBJECT: lambda _: "ledger rebuilding"}):
        code, _, err, _ = await tessera("get", "nodes", "--config", config)
    assert code == 1
    assert err.splitlines() == [
        "tessera get: device-allocator could not answer tessera.ctl.view.ledger: ledger rebuilding"
    ]


@pytest.mark.parametrize(
    "command",
    [["ping"], ["get", "devices"], ["get", "queues"], ["top", "--once"]],
    ids=["ping", "get-devices", "get-queues", "top"],
)
async def test_with_nats_down_one_line_naming_the_url_within_5s(command: list[str]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    code, out, err, took = await tessera(*command, "--nats", url)
    assert code == 1
    assert took < 5
    assert out == ""
    assert err.splitlines() == [
        f"tessera {command[0]}: cannot reach NATS at {url}: NoServersError()"
    ]


def kubeconfig(path: Path, server: str) -> str:
    """A kubeconfig for ``server`` (no server there: the command must say so)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return str(path)


@pytest.mark.parametrize(
    "command",
    [["get", "jobs"], ["get", "jobs", "-A"], ["explain", "pod", "ml/train-0"]],
    ids=["jobs", "jobs-all", "explain"],
)
async def test_with_the_api_server_down_one_line_naming_it_within_5s(
    tmp_path: Path, command: list[str]
) -> None:
    server = f"https://127.0.0.1:{free_port()}"
    config = kubeconfig(tmp_path / "kubeconfig", server)
    code, out, err, took = await tessera(*command, "--kubeconfig", config)
    assert code == 1
    assert took < 5
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"tessera {command[0]}: cannot reach the API server at {server}: ")


async def test_a_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    code, _, err, _ = await tessera("get", "jobs", "--kubeconfig", str(tmp_path / "none"))
    assert code == 1
    assert err.splitlines() == [
        f"tessera get: kubeconfig {tmp_path / 'none'}: no such file "
        "(pass --kubeconfig or set $KUBECONFIG)"
    ]
