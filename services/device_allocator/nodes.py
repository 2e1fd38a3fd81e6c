"""The nodes an allocator places on, and what it knows of each.

A node's devices come from its agent's inventory (``node.inventory``, and the inventory
KV each heartbeat, so a missed event heals); one that runs another config than this
allocator's is refused (no placement there until both load the same tessera.yaml). Its
labels, taints and allocatable come from the Node (``node.updated``), with the devices
it cordons; namespaces' labels from ``namespace.updated``. With shards
(shared/core/shards.py), a Node's labels say which shard's it is: a node that leaves
this shard is forgotten here (its pods count on the shard it went to), one that joins
is taken in (services/device_allocator/pods.py ``Pods.adopt`` counts its pods).
"""

from __future__ import annotations

import logging

from shared import events as ev
from shared import kube
from shared.core import annotations as ann
from shared.core.hosts import node_spec
from shared.core.ledger import Ledger, Statement
from shared.core.model import NodeName
from shared.runtime import Runtime

log = logging.getLogger(__name__)


class Nodes:
    """This allocator's nodes: which are its shard's, their inventories, cordons and
    config refusals, applied to the ledger."""

    def __init__(self, rt: Runtime, ledger: Ledger, shard: str) -> None:
        self.rt = rt
        self.ledger = ledger
        self.shard = shard
        self.pools = rt.cfg.scheduler.shard_pools()
        self.refused: dict[NodeName, str] = {}
        """Nodes running another config → that config's hash."""
        self.cordons: dict[NodeName, tuple[str, ...]] = {}
        self.applied: dict[NodeName, ev.NodeInventory] = {}
        """Each node's last inventory, applied or not (another shard's node)."""
        self.node_shard: dict[NodeName, str | None] = {}
        """Each known Node's shard (by its labels); sharded only."""

    def mine(self, node: NodeName) -> bool:
        """Is ``node`` this allocator's to place on? (Every node, unsharded.)"""
        return not self.shard or self.node_shard.get(node) == self.shard

    async def read(self, api: kube.Client) -> None:
        """Every namespace's labels and every Node's spec, cordons and shard."""
        namespaces, _ = await kube.list_all(api, "/api/v1/namespaces")
        for ns in namespaces:
            meta = ns["metadata"]
            self.ledger.hosts.set_namespace(meta["name"], meta.get("labels") or {})
        async for page in kube.list_pages(api, "/api/v1/nodes", kube.NodeObject):
            for node in page:
                spec = node_spec(node)
                name = NodeName(spec.name)
                self.cordons[name] = ann.cordoned_devices(node["metadata"].get("annotations") or {})
                self.node_shard[name] = self.pools.of_node(spec.labels)
                if self.mine(name):
                    self.ledger.set_spec(spec)

    def inventory(self, inv: ev.NodeInventory) -> None:
        """A node's devices (refused when it runs another config)."""
        self.applied[inv.node] = inv
        if not self.mine(inv.node):
            return  # another shard's (applied here if the node comes to this one)
        self.ledger.set_plugin_node(inv.node, inv.device_plugin)
        if inv.config_hash != self.rt.config_hash:
            if self.refused.get(inv.node) != inv.config_hash:
                log.error(
                    "node %s runs config %s, this allocator %s: no placement there until "
                    "both load the same tessera.yaml",
                    inv.node,
                    inv.config_hash,
                    self.rt.config_hash,
                )
            self.refused[inv.node] = inv.config_hash
            self.ledger.remove_node(inv.node)
            return
        self.refused.pop(inv.node, None)
        devices = inv.devices
        if inv.dra and devices:
            # Its cards go to ResourceClaims: a grant here would be a card handed twice.
            log.info("node %s offers its devices through DRA: no grant is placed there", inv.node)
            devices = ()
        self.ledger.set_node(inv.node, devices, self.cordons.get(inv.node, ()))

    def updated(self, event: ev.NodeUpdated) -> bool:
        """A Node's labels, taints, allocatable and cordon; devices it cordons take no
        new work. True when the node has just joined this shard: the pods on it are to
        be taken in."""
        self.cordons[event.node] = event.cordoned_devices
        if event.spec is not None and self.shard:
            was = self.mine(event.node)
            self.node_shard[event.node] = self.pools.of_node(event.spec.labels)
            if was and not self.mine(event.node):
                log.info("node %s left shard %s (its labels changed)", event.node, self.shard)
                with Statement(self.ledger) as st:  # counted by the shard it went to now
                    for uid in list(self.ledger.node_pods.get(event.node, ())):
                        st.release(uid)
                    st.commit()
                self.ledger.forget_node(event.node)
                return False
            if not was and self.mine(event.node):
                log.info("node %s joined shard %s (its labels changed)", event.node, self.shard)
                self.ledger.set_spec(event.spec)
                if (inv := self.applied.get(event.node)) is not None:
                    self.inventory(inv)
                return True
        if not self.mine(event.node):
            return False
        if event.spec is not None:
            self.ledger.set_spec(event.spec)
        self.ledger.set_cordoned(event.node, event.cordoned_devices)
        return False

    def deleted(self, node: NodeName) -> None:
        """Nothing more is placed on a deleted node."""
        self.ledger.forget_node(node)
        self.applied.pop(node, None)
        self.refused.pop(node, None)
        self.node_shard.pop(node, None)

    async def reconcile_loop(self) -> None:
        """Every heartbeat, apply any node whose KV inventory differs from what the ledger
        has: a missed or lost inventory event heals within one heartbeat."""
        async for latest in self.rt.bus.inventory_heartbeats(self.rt.cfg.scheduler.heartbeat_s):
            for inv in latest.values():
                known = self.applied.get(inv.node)
                if known is None or (known.devices, known.config_hash) != (
                    inv.devices,
                    inv.config_hash,
                ):
                    log.info("inventory of %s taken from the KV (its event was missed)", inv.node)
                    self.inventory(inv)
