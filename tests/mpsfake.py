"""Driving tests/fakes/nvidia-cuda-mps-control from a test: its daemons (one per pipe
directory), its clients (``--client UID``), and whether this machine can run the
daemons as the supervisor does (``unshare``: a mount namespace per daemon) and an agent
in a PID namespace of its own."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import eventually

FAKE = Path(__file__).resolve().parent / "fakes" / "nvidia-cuda-mps-control"


def unshare_missing() -> str | None:
    """Why a mount and a PID namespace cannot be made here (None: they can)."""
    if shutil.which("unshare") is None:
        return "no unshare on the PATH"
    for probe in (
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "mount",
            "--bind",
            "/tmp",
            "/dev/shm",
        ],
        ["unshare", "--pid", "--fork", "--mount-proc", "--", "true"],
    ):
        proc = subprocess.run(probe, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return f"`{' '.join(probe)}` failed: {proc.stderr.strip()}"
    return None


def need_unshare() -> None:
    """Skip the test where namespaces cannot be made, with the reason; under CI (``$CI``
    set) fail instead, so it never goes unrun there."""
    why = unshare_missing()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"namespaces are needed here: {why}")
    pytest.skip(why)


def daemon_up(pipe: Path) -> bool:
    """A fake daemon runs for ``pipe`` (it holds its lock, seen from any PID namespace)."""
    try:
        fd = os.open(pipe / "fake-daemon.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def starts(pipe: Path) -> list[dict[str, Any]]:
    """Every start of the fake daemon of ``pipe``: its PID, environment and /dev/shm."""
    path = pipe / "fake-daemon.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


class FakeClient:
    """A CUDA process of one user, client of the fake daemon of one pipe directory."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.said: list[str] = []
        self._reader = asyncio.create_task(self._read(), name="fake MPS client")

    @classmethod
    async def start(cls, pipe: Path, uid: int) -> FakeClient:
        """A process of user ``uid`` joining the daemon of ``pipe``."""
        proc = await asyncio.create_subprocess_exec(
            str(FAKE),
            "--client",
            str(uid),
            env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.said.append(line.decode().strip())

    @property
    def state(self) -> str | None:
        """What it said last: ``ready``, ``pending``, ``lost``..."""
        return self.said[-1] if self.said else None

    async def reaches(self, state: str, timeout_s: float = 10.0) -> None:
        """Wait until the last thing it said is ``state``."""

        async def there() -> bool:
            return self.state == state

        await eventually(there, timeout_s=timeout_s, interval_s=0.05, what=f"client {state}")

    async def stop(self) -> None:
        """End it (it leaves its daemon), and its reader."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        await self.proc.wait()
        await self._reader
