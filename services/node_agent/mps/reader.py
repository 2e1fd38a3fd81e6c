"""The node agent's view of its node's MPS daemons (services/node_agent/agent.py).

The agent never starts nor stops a daemon (the supervisor does, in a process of its own:
supervisor.py); it asks each card's daemon, through the card's pipe directory, for its
servers and clients every ``checkIntervalS``, and publishes per card in ``mps`` mode
(``DeviceInfo.mps`` and ``mps_clients``, :func:`with_state`):

- ``running``, with its client count, when the card's daemon answers;
- ``unavailable`` when it does not (no supervisor on the node, the daemon will not start,
  or no control binary on the agent's PATH): the card is offered to no MPS pod, and each
  case is logged once while it lasts.

A card whose state was never read carries none (``""``), which the scheduler reads as
not running either (shared/core/ledger.py ``mps_ready``). A restarted agent reads the
same daemons again: the pods' MPS servers never depended on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from services.node_agent.mps import card_dirs
from services.node_agent.mps.control import Control, Once
from shared.config import MpsConfig
from shared.core.model import DeviceInfo, DeviceUUID, MpsState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MpsReport:
    """What the inventory carries of the node's MPS daemons, per card in ``mps`` mode."""

    states: Mapping[DeviceUUID, MpsState] = field(default_factory=dict)
    """Each card's daemon: ``running`` or ``unavailable``."""
    clients: Mapping[DeviceUUID, int] = field(default_factory=dict)
    """Each card's client processes (zero when unknown)."""


def with_state(devices: Iterable[DeviceInfo], report: MpsReport) -> tuple[DeviceInfo, ...]:
    """The devices as the agent publishes them: the cards ``report`` names carry their
    daemon's state and client count; the others are left as read."""
    return tuple(
        msgspec.structs.replace(
            d, mps=report.states[d.uuid], mps_clients=report.clients.get(d.uuid, 0)
        )
        if d.uuid in report.states
        else d
        for d in devices
    )


class MpsReader:
    """Reads the daemon of each card of the node in ``mps`` mode (see the module's text):
    owns the state the agent publishes for those cards, and nothing else."""

    def __init__(self, cfg: MpsConfig, node: str, cards: Iterable[DeviceUUID] = ()) -> None:
        self.cfg = cfg
        self.node = node
        self.cards: tuple[DeviceUUID, ...] = tuple(cards)
        self.control = Control(cfg, node, Once())
        self._report = MpsReport()

    def state(self) -> MpsReport:
        """The last reading, for the cards in ``mps`` mode now."""
        return MpsReport(
            {c: s for c, s in self._report.states.items() if c in self.cards},
            {c: n for c, n in self._report.clients.items() if c in self.cards},
        )

    def set_cards(self, cards: Iterable[DeviceUUID]) -> None:
        """The cards now in ``mps`` mode (after a new reading of the devices)."""
        self.cards = tuple(cards)

    async def start(self) -> None:
        """The first reading, before the agent's first publish."""
        await self.check()

    async def supervise(self, changed: Callable[[], Awaitable[None]] | None = None) -> None:
        """Read again every ``checkIntervalS``; ``changed`` is awaited after a reading that
        changed :meth:`state`."""
        while True:
            await asyncio.sleep(self.cfg.check_interval_s)
            if await self.check() and changed is not None:
                await changed()

    async def check(self) -> bool:
        """One reading of every card; True when :meth:`state` changed. A failure keeps
        the last reading (logged once while it lasts)."""
        before = self.state()
        what = f"{self.node}: reading the MPS daemons"
        await self.control.once.guarded("bug", what, self._read())
        return self.state() != before

    async def _read(self) -> None:
        cards = self.cards
        binary = self.control.binary()
        if binary is None and cards:
            self.control.once.warn(
                "binary",
                "node %s: %d card(s) set to mps but no %s on the agent's PATH: they are "
                "offered to no MPS pod",
                self.node,
                len(cards),
                self.cfg.control_command,
            )
        elif binary is not None and self.control.once.clear("binary"):
            log.info("node %s: %s is on the PATH now", self.node, binary)
        read = await asyncio.gather(*(self._card(binary, c) for c in cards))
        self._report = MpsReport(
            {c: s for c, (s, _) in zip(cards, read, strict=True)},
            {c: n for c, (_, n) in zip(cards, read, strict=True)},
        )

    async def _card(self, binary: str | None, card: DeviceUUID) -> tuple[MpsState, int]:
        """One card's daemon: its state and client count."""
        if binary is None:
            return "unavailable", 0
        dirs = card_dirs(self.cfg, card)
        servers = await self.control.servers(binary, dirs.pipe)
        if servers is None:
            self.control.once.warn(
                f"down:{card}",
                "node %s: no MPS control daemon answers for %s in %s: the card is offered to "
                "no MPS pod until one does (the tessera-mps-control pod of this node runs it; "
                "see its log, and %s/control.log)",
                self.node,
                card,
                dirs.pipe,
                dirs.log,
            )
            return "unavailable", 0
        if self.control.once.clear(f"down:{card}"):
            log.info("node %s: the MPS control daemon of %s answers", self.node, card)
        clients = await self.control.clients(binary, dirs.pipe, servers)
        return "running", clients or 0
