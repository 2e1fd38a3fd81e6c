"""The network fabric an allocator places gangs with ``networkTopology`` in.

The HyperNodes are listed at start (a restarted allocator knows them before its first
gang) and followed through ``hypernode.updated``/``hypernode.deleted``; with
``scheduler.networkTopologyLabels``, more are derived from the nodes' labels. The tree
(shared/core/network.py ``build``) is made again only when a gang asks for it after a
HyperNode or a Node changed, so gangs without ``networkTopology`` and clusters without
HyperNodes pay nothing. A HyperNode that breaks a rule, or that closes a cycle, is
logged once and used as far as it can be read.
"""

from __future__ import annotations

import logging

from kubernetes_asyncio.client import ApiException

from shared import events as ev
from shared import kube
from shared.core import network
from shared.core.ledger import Ledger
from shared.core.model import NodeName
from shared.runtime import Runtime

log = logging.getLogger(__name__)

HYPERNODES = f"/apis/{network.API}/hypernodes"


class Fabric:
    """The HyperNodes known, and the tree they make over the ledger's nodes."""

    def __init__(self, rt: Runtime, ledger: Ledger) -> None:
        self.ledger = ledger
        self.labels = tuple(rt.cfg.scheduler.network_topology_labels)
        """``scheduler.networkTopologyLabels``: domains derived from node labels."""
        self.hypernodes: dict[str, network.HyperNode] = {}
        self._tree: network.Fabric | None = None
        self._told: set[str] = set()
        """The problems logged already (each once)."""

    async def read(self, api: kube.Client) -> None:
        """Every HyperNode now (none when the API server does not serve them)."""
        try:
            items, _ = await kube.list_all(api, HYPERNODES)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return
        for obj in items:
            hypernode, errors = network.read_hypernode(obj)
            if hypernode.name:
                self.updated(
                    ev.HyperNodeUpdated(
                        hypernode=hypernode,
                        invalid=network.refusal("HyperNode", errors) if errors else "",
                    )
                )

    def updated(self, event: ev.HyperNodeUpdated) -> None:
        """A HyperNode written or changed."""
        self.hypernodes[event.hypernode.name] = event.hypernode
        self._tree = None
        if event.invalid:
            self._tell(event.invalid)

    def deleted(self, name: str) -> None:
        """A HyperNode is gone."""
        if self.hypernodes.pop(name, None) is not None:
            self._tree = None

    def nodes_changed(self) -> None:
        """A Node came, went or changed its labels: the tree is made again when next asked."""
        if self.hypernodes or self.labels:
            self._tree = None

    def tree(self) -> network.Fabric:
        """The domains now (made again after a change)."""
        if self._tree is None:
            nodes = {
                NodeName(name): (host.spec.labels if host.spec is not None else {})
                for name, host in self.ledger.hosts.nodes.items()
                if name in self.ledger.nodes
            }
            written = list(self.hypernodes.values())
            derived = network.from_labels(self.labels, nodes) if self.labels else []
            names = {h.name for h in written}
            self._tree = network.build(
                [*written, *(h for h in derived if h.name not in names)], nodes
            )
            for name, why in sorted(self._tree.problems.items()):
                self._tell(f"HyperNode {name}: {why}; its members on the cycle are left out")
        return self._tree

    def _tell(self, message: str) -> None:
        if message not in self._told:
            self._told.add(message)
            log.warning("%s", message)
