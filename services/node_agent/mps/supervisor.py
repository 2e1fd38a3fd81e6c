"""The node's MPS supervisor: ``tessera node-agent mps-control`` (``python -m
services.node_agent.mps``).

A process of its own, in its own DaemonSet (deploy/kustomize/base/mps-control.yaml), so
that restarting or upgrading the node agent never touches a daemon nor the servers of
running pods. It reads the node's devices from the same ``--source`` and config as the
agent (services/node_agent/service.py ``open_source``), and every ``checkIntervalS``:

- starts a daemon for each card in ``mps`` mode that has none (:class:`CardDaemon`), or
  adopts one that already answers in the card's pipe directory, and starts it again when
  it died;
- quits the daemon of a card that left ``mps`` mode (or the node) once it has no client;
  at its first round it also looks at the card directories a previous run left.

It never stops a daemon that has clients, and leaves every daemon running when it stops
(in its container they end with it: docs/isolation.md says when that happens).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from services.node_agent.inventory import InventorySource
from services.node_agent.mps import card_dirs, mps_cards
from services.node_agent.mps.control import COMMAND_TIMEOUT_S, Control, Once, execute
from services.node_agent.service import open_source, source_arguments
from shared.config import Config
from shared.core.model import DeviceUUID, NodeName
from shared.runtime import process_main

log = logging.getLogger(__name__)

STARTUP_S = 5.0
"""How long a daemon just started has to answer ``get_server_list``."""
PID_FILE = "nvidia-cuda-mps-control.pid"
"""In the pipe directory, written by the daemon itself."""
SHM_MOUNT = 'mount -n --bind "$1" /dev/shm && shift && exec "$@"'
"""Run in the daemon's new mount namespace: the card's shm directory on ``/dev/shm``, then
the daemon (``$1``: the directory; the rest: the daemon's command line)."""


def launch_argv(private_shm: bool, binary: str, shm: Path) -> list[str] | None:
    """The command line that starts a card's daemon; with ``private_shm``, in a mount
    namespace of its own whose ``/dev/shm`` is ``shm`` (None: no ``unshare`` here)."""
    if not private_shm:
        return [binary, "-d"]
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    private = [unshare, "--mount", "--propagation", "private", "--"]
    return [*private, "sh", "-c", SHM_MOUNT, "sh", str(shm), binary, "-d"]


class CardDaemon:
    """One card's MPS control daemon: owns its directories, starts it (or adopts one that
    answers), starts it again when it died, and quits it once the card is not ``wanted``
    (no longer in ``mps`` mode) and no client is left."""

    def __init__(self, supervisor: Supervisor, card: DeviceUUID) -> None:
        self.cfg = supervisor.cfg
        self.control = supervisor.control
        self.node = supervisor.node
        self.card = card
        self.dirs = card_dirs(self.cfg, card)
        self.wanted = True
        self.up: bool | None = None
        """Whether its daemon answered at the last look (None: not looked yet)."""
        self._start_failed = False

    async def check(self, binary: str) -> bool:
        """One look; False once there is nothing left to do (not wanted, no daemon). A
        failure is logged (once while it lasts) and the card looked at again next round."""
        what = f"{self.node}: supervising the MPS daemon of {self.card}"
        keep = await self.control.once.guarded(f"bug:{self.card}", what, self._check(binary))
        return True if keep is None else keep

    async def _check(self, binary: str) -> bool:
        servers = await self.control.servers(binary, self.dirs.pipe)
        if not self.wanted:
            return await self._retire(binary, servers)
        if servers is None:
            if self.up:
                log.warning(
                    "node %s: the MPS control daemon of %s does not answer any more: starting "
                    "it again (its clients, if any, have lost their server)",
                    self.node,
                    self.card,
                )
            await asyncio.to_thread(self._reap)
            self.up = await self._launch(binary)
            return True
        if self.up is None:
            log.info(
                "node %s: adopted the running MPS control daemon of %s (%d server(s))",
                self.node,
                self.card,
                len(servers),
            )
        self.up = True
        return True

    async def _retire(self, binary: str, servers: list[int] | None) -> bool:
        """The card left ``mps`` mode: quit its daemon once idle. Clients that cannot be
        counted keep it."""
        if servers is None:
            self.up = False
            return False
        clients = await self.control.clients(binary, self.dirs.pipe, servers) if servers else 0
        if clients != 0:
            self.control.once.warn(
                f"retire:{self.card}",
                "node %s: %s is not in mps mode any more: its MPS control daemon stops once "
                "its clients are gone",
                self.node,
                self.card,
            )
            return True
        if not await self.control.quit(binary, self.dirs.pipe):
            return True
        log.info(
            "node %s: %s left mps mode: its idle MPS control daemon stopped", self.node, self.card
        )
        self.up = False
        return False

    def _make_dirs(self) -> None:
        """The pipe and shm directories are open to every user (each pod's clients run as
        its own UID); the log directory is the daemon's."""
        for path, mode in (
            (self.dirs.pipe, 0o777),
            (self.dirs.shm, 0o1777),
            (self.dirs.log, 0o755),
        ):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(mode)

    def _reap(self) -> None:
        """A daemon that died is a zombie of the supervisor when the supervisor is its
        container's first process (the daemon's parent exits at ``-d``, so it is
        re-parented here): collect it. Only that PID, and only then."""
        if os.getpid() != 1:
            return
        try:
            pid = int((self.dirs.pipe / PID_FILE).read_text(encoding="utf-8").strip())
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        except (OSError, ValueError):
            return

    async def _launch(self, binary: str) -> bool:
        """Start the daemon for this card and wait until it answers."""
        try:
            await asyncio.to_thread(self._make_dirs)
        except OSError as exc:
            return self._failed(f"cannot create its directories: {exc}")
        argv = launch_argv(self.cfg.private_shm, binary, self.dirs.shm)
        if argv is None:
            return self._failed("no unshare on the PATH for nodeAgent.mps.privateShm")
        env = self.control.env(
            self.dirs.pipe,
            CUDA_MPS_LOG_DIRECTORY=str(self.dirs.log),
            CUDA_VISIBLE_DEVICES=self.card,
        )
        try:
            answer = await execute(argv, env)
        except OSError as exc:
            return self._failed(f"{argv[0]}: {exc}")
        if answer is None:
            return self._failed(f"{binary} -d took over {COMMAND_TIMEOUT_S:.0f} s")
        if answer.code != 0:
            return self._failed(f"{binary} -d: {answer.why()}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_S
        while await self.control.servers(binary, self.dirs.pipe) is None:
            if loop.time() > deadline:
                return self._failed(
                    f"it was started but does not answer (see {self.dirs.log}/control.log)"
                )
            await asyncio.sleep(0.1)
        self._start_failed = False
        log.info(
            "node %s: started the MPS control daemon of %s in %s",
            self.node,
            self.card,
            self.dirs.root,
        )
        return True

    def _failed(self, why: str) -> bool:
        if not self._start_failed:
            self._start_failed = True
            log.warning(
                "node %s: cannot start the MPS control daemon of %s (%s): the card is offered "
                "to no MPS pod; trying again every %g s",
                self.node,
                self.card,
                why,
                self.cfg.check_interval_s,
            )
        return False


class Supervisor:
    """The node's MPS control daemons, one :class:`CardDaemon` per card in ``mps`` mode
    (see the module's text): decides which cards get one, from the node's devices."""

    def __init__(self, cfg: Config, node: NodeName, source: InventorySource) -> None:
        self.config = cfg
        self.cfg = cfg.node_agent.mps
        self.node = node
        self.source = source
        self.control = Control(self.cfg, node, Once())
        self.daemons: dict[DeviceUUID, CardDaemon] = {}
        self._wanted: tuple[DeviceUUID, ...] = ()
        self._first = True

    async def run(self, stop: asyncio.Event) -> None:
        """A round every ``checkIntervalS`` until ``stop``; the daemons keep running after."""
        while not stop.is_set():
            await self.check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.check_interval_s)
        log.info("node %s: leaving %d MPS control daemon(s) running", self.node, len(self.daemons))

    async def check(self) -> None:
        """One round over every card (a failure is logged once and tried again)."""
        what = f"{self.node}: supervising the MPS control daemons"
        await self.control.once.guarded("bug", what, self._round())

    async def _round(self) -> None:
        try:
            devices = await asyncio.to_thread(self.source.read)
            self._wanted = mps_cards(self.config, self.node, devices)
            self.control.once.clear("read")
        except Exception as exc:  # keep the cards known: a failed read stops no daemon
            self.control.once.warn(
                "read", "node %s: cannot read the devices (%s): cards unchanged", self.node, exc
            )
        cards = {*self._wanted, *self.daemons}
        if self._first:
            cards |= set(await asyncio.to_thread(self._left_behind))
            self._first = False
        for card in cards:
            if card not in self.daemons:
                self.daemons[card] = CardDaemon(self, card)
            self.daemons[card].wanted = card in self._wanted
        binary = self.control.binary()
        if binary is None:
            if self._wanted:
                self.control.once.warn(
                    "binary",
                    "node %s: %d card(s) set to mps but no %s on the PATH: no MPS daemon runs",
                    self.node,
                    len(self._wanted),
                    self.cfg.control_command,
                )
            return
        if self.control.once.clear("binary"):
            log.info("node %s: %s is on the PATH now", self.node, binary)
        daemons = list(self.daemons.values())
        kept = await asyncio.gather(*(d.check(binary) for d in daemons))
        for daemon, keep in zip(daemons, kept, strict=True):
            if not keep:
                del self.daemons[daemon.card]

    def _left_behind(self) -> list[DeviceUUID]:
        """The cards with a pipe directory under ``hostDir`` (a previous run's)."""
        try:
            entries = list(Path(self.cfg.host_dir).iterdir())
        except OSError:
            return []
        found = []
        for entry in entries:
            with contextlib.suppress(ValueError):
                if card_dirs(self.cfg, DeviceUUID(entry.name)).pipe.is_dir():
                    found.append(DeviceUUID(entry.name))
        return found


async def run(cfg: Config, stop: asyncio.Event, args: argparse.Namespace) -> None:
    """Supervise this node's MPS daemons until ``stop``."""
    node = NodeName(args.node)
    source = open_source(cfg, args.source, node)
    try:
        await Supervisor(cfg, node, source).run(stop)
    finally:
        source.close()


def main(argv: Sequence[str] | None = None) -> None:
    """``tessera node-agent mps-control [--config FILE] [--source S] [--node N]``."""
    listed = list(argv) if argv is not None else None
    process_main("node-agent mps-control", run, listed, source_arguments)
