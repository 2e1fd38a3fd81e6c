"""The MPS control command, as the supervisor and the agent use it.

``nvidia-cuda-mps-control`` talks to the daemon of the pipe directory in its environment
(``CUDA_MPS_PIPE_DIRECTORY``), one command per invocation on stdin:

- ``get_server_list``: the PIDs of its MPS servers (one while a user is served); a failure
  ("Cannot find MPS control daemon process") means no daemon answers there;
- ``get_client_list <server PID>``: that server's client PIDs;
- ``quit``: stop the daemon.

With ``-d`` it starts a daemon instead (supervisor.py). Every invocation runs with a time
limit (:func:`execute`); an ordinary failure comes back as None or a failed
:class:`Answer`, never as an exception, and callers log it once while it lasts
(:class:`Once`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from shared.config import MpsConfig

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 10.0
"""The longest one control command (or a daemon's start) may take."""
NO_DAEMON = "Cannot find MPS control daemon process"
T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """What one invocation said: its exit code and output."""

    code: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        """It succeeded and a daemon answered."""
        return self.code == 0 and NO_DAEMON not in self.out + self.err

    def why(self) -> str:
        """What it said when it failed, in one line."""
        said = (self.err or self.out).strip().replace("\n", " ")
        return f"exit {self.code}: {said[:200] or 'no message'}"


class Once:
    """Warnings logged once while their condition lasts (one key per condition)."""

    def __init__(self) -> None:
        self._keys: set[str] = set()

    def warn(self, key: str, message: str, *args: object) -> None:
        """Log ``message`` unless ``key``'s warning is already out."""
        if key not in self._keys:
            self._keys.add(key)
            log.warning(message, *args)

    def clear(self, key: str) -> bool:
        """The condition ended; True when its warning was out (the caller may say so)."""
        if key in self._keys:
            self._keys.discard(key)
            return True
        return False

    async def guarded(self, key: str, what: str, work: Awaitable[T]) -> T | None:
        """``work``'s result, or None when it raised: logged with its trace once while it
        keeps failing (a bug in one look must not end the loop that looks again)."""
        try:
            result = await work
        except Exception:
            if key not in self._keys:
                self._keys.add(key)
                log.exception("node %s failed", what)
            return None
        self._keys.discard(key)
        return result


def pids(text: str) -> set[int] | None:
    """The integers of ``text`` (blanks, commas or colons between them), or None when
    anything else is there."""
    words = re.split(r"[\s,:]+", text.strip())
    if not all(w.isdigit() for w in words if w):
        return None
    return {int(w) for w in words if w}


async def execute(
    argv: Sequence[str], env: Mapping[str, str], stdin: bytes | None = None
) -> Answer | None:
    """Run ``argv`` to its end within :data:`COMMAND_TIMEOUT_S`; None when it took longer
    (it is killed). Its output goes to files, not pipes: a daemon it starts may keep them
    open. An OSError (no such binary) is the caller's."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=out,
            stderr=err,
            env=dict(env),
        )
        try:
            await asyncio.wait_for(proc.communicate(stdin), COMMAND_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return None
        except asyncio.CancelledError:  # the process stops: leave no caller behind
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        out.seek(0)
        err.seek(0)
        code = proc.returncode if proc.returncode is not None else -1
        return Answer(
            code, out.read().decode(errors="replace"), err.read().decode(errors="replace")
        )


class Control:
    """The control command of one node's MPS daemons: owns how it is found and run, and
    reads each daemon's servers and clients through the card's pipe directory."""

    def __init__(self, cfg: MpsConfig, node: str, once: Once) -> None:
        self.cfg = cfg
        self.node = node
        self.once = once

    def binary(self) -> str | None:
        """The control binary on the PATH, or None."""
        return shutil.which(self.cfg.control_command)

    def env(self, pipe: Path, **more: str) -> dict[str, str]:
        """The environment of a command to (or the start of) the daemon of ``pipe``."""
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), **more}

    async def run(self, binary: str, pipe: Path, *command: str) -> Answer | None:
        """One command to the daemon of ``pipe``; None when it could not be run in time."""
        what = " ".join(command)
        try:
            answer = await execute([binary], self.env(pipe), (what + "\n").encode())
        except OSError as exc:
            self.once.warn("exec", "node %s: cannot run %s: %s", self.node, binary, exc)
            return None
        self.once.clear("exec")
        if answer is None:
            log.warning(
                "node %s: `%s` to the MPS control daemon in %s took over %.0f s",
                self.node,
                what,
                pipe,
                COMMAND_TIMEOUT_S,
            )
        return answer

    async def servers(self, binary: str, pipe: Path) -> list[int] | None:
        """The server PIDs of the daemon of ``pipe``; None when no daemon answers."""
        answer = await self.run(binary, pipe, "get_server_list")
        if answer is None or not answer.ok:
            return None
        found = pids(answer.out)
        if found is None:
            self.once.warn(
                f"servers:{pipe}",
                "node %s: cannot read the MPS server list %r in %s: counted as none",
                self.node,
                answer.out[:200],
                pipe,
            )
            return []
        return sorted(found)

    async def clients(self, binary: str, pipe: Path, servers: Sequence[int]) -> int | None:
        """How many client processes the daemon of ``pipe`` serves; None when they cannot
        be read (logged once)."""
        found: set[int] = set()
        for server in servers:
            answer = await self.run(binary, pipe, "get_client_list", str(server))
            read = pids(answer.out) if answer is not None and answer.ok else None
            if read is None:
                self.once.warn(
                    f"clients:{pipe}",
                    "node %s: cannot read the clients of MPS server %d in %s (%s)",
                    self.node,
                    server,
                    pipe,
                    "no answer" if answer is None else answer.why(),
                )
                return None
            found |= read
        self.once.clear(f"clients:{pipe}")
        return len(found)

    async def quit(self, binary: str, pipe: Path) -> bool:
        """Stop the daemon of ``pipe``; True when it said it did."""
        answer = await self.run(binary, pipe, "quit")
        if answer is None or not answer.ok:
            log.warning(
                "node %s: the MPS control daemon in %s did not quit (%s)",
                self.node,
                pipe,
                "no answer" if answer is None else answer.why(),
            )
            return False
        return True
