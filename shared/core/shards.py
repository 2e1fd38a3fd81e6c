"""Allocator shards: the cluster's nodes split into pools, one allocator per pool.

One allocator places every pod of a cluster while it keeps up; past that
(``scheduler.shards``, docs/sharding.md), each shard's allocator holds the ledger of its
own nodes only and places the gangs routed to it. A node belongs to the first shard
whose ``nodeSelector`` its labels match (a shard with an empty selector takes every
node left); a node no shard takes is placed by none.

Routing (the coordinator, :meth:`Shards.route`): a gang is offered to each shard its
pods could run in, one after the other, starting at a shard chosen by a hash of the
gang's key, so gangs spread evenly over the shards and a retried gang starts where it
did before. A shard that cannot place the gang whole passes it on; if no shard can,
the gang's pods are placed across shards by a two-phase reservation (each shard holds
what it can of the rest, the shard that completes ``minMember`` commits them all; the
last one aborts them otherwise): services/device_allocator/span.py.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Shard:
    """One pool: its name and the node labels that select its nodes (none: every node
    not taken by a shard before it)."""

    name: str
    node_selector: Mapping[str, str]

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with ``labels`` carries every label of the shard's selector (an empty one
        selects every node)."""
        return all(labels.get(k) == v for k, v in self.node_selector.items())


class Shards:
    """The configured shards, in order (empty: one allocator, unsharded)."""

    def __init__(self, shards: Iterable[Shard] = ()) -> None:
        self.shards = tuple(shards)
        self.names = tuple(s.name for s in self.shards)

    def __bool__(self) -> bool:
        return bool(self.shards)

    def of_node(self, labels: Mapping[str, str]) -> str | None:
        """The shard that owns a node with these labels (None: no shard takes it)."""
        for shard in self.shards:
            if shard.selects(labels):
                return shard.name
        return None

    def candidates(self, selectors: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
        """The shards that may hold a node matching every one of these pod node
        selectors (one per pod of a gang): a shard whose selector contradicts a pod's is
        out, and so is one after a shard whose selector a pod's implies (every node the
        pod could run on belongs to that earlier shard)."""
        wanted = list(selectors)
        out = []
        for i, shard in enumerate(self.shards):
            if any(
                k in sel and sel[k] != v for sel in wanted for k, v in shard.node_selector.items()
            ):
                continue
            if any(
                all(sel.get(k) == v for k, v in earlier.node_selector.items())
                for earlier in self.shards[:i]
                for sel in wanted
            ):
                continue
            out.append(shard.name)
        return tuple(out)

    def route(self, key: str, selectors: Iterable[Mapping[str, str]]) -> tuple[str, ...]:
        """The shards to offer a gang to, in order: its candidates, starting at the one
        the gang's ``key`` hashes to (stable across processes and retries)."""
        found = self.candidates(selectors)
        if not found:
            return ()
        start = zlib.crc32(key.encode()) % len(found)
        return found[start:] + found[:start]
