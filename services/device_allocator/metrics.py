"""The allocator's metrics, read from its ledger at each scrape (docs/metrics.md).

Per device, under HAMi's scheduler names and labels (``node``, ``device_uuid``,
``device_index``, ``device_type``) and Volcano's vGPU names (``devID``, ``NodeName``):
capacity, allocated memory and cores, how many containers share it. Per container
grant: HAMi's ``hami_vgpu_*_allocated`` and Volcano's per-pod figures. Core figures
are percent of the card, as both report them; memory is bytes for HAMi and MiB for
Volcano, as theirs are.

Counted as they happen: placements by result, pods preempted, the scheduling latency of
each placed pod (``decided``: from ``gang.ready`` to the decision) and of each gang
(Volcano's ``e2e_job_scheduling_latency``: from its oldest pod's creation to the
decision that placed it).
"""

from __future__ import annotations

from collections.abc import Iterator

from shared.core.ledger import Dev, Ledger
from shared.metrics import MILLISECONDS, Labels, Metrics

MIB = 1 << 20


class AllocatorMetrics:
    """The allocator's metrics: gauges read from the ledger at each scrape, and the placement
    counters and latency histograms its handlers record."""

    def __init__(self, metrics: Metrics, ledger: Ledger) -> None:
        self.ledger = ledger
        m = metrics
        for name, text, read in (
            ("hami_gpu_memory_limit_bytes", "Device memory of a card.", self._limit),
            ("hami_gpu_core_limit_ratio", "Device cores of a card (percent).", self._core_limit),
            (
                "hami_gpu_memory_allocated_bytes",
                "Device memory granted on a card.",
                self._allocated,
            ),
            ("hami_gpu_shared_count", "Containers sharing a card.", self._shared),
            (
                "hami_gpu_core_allocated_ratio",
                "Device cores granted on a card (percent).",
                self._cores,
            ),
            ("hami_node_gpu_overview", "A card's granted memory, with its limits.", self._overview),
            (
                "hami_node_gpu_memory_allocated_ratio",
                "Share of a card's memory granted (0 to 1).",
                self._ratio,
            ),
            (
                "hami_vgpu_memory_allocated_bytes",
                "Device memory granted to a container.",
                self._grant_memory,
            ),
            (
                "hami_vgpu_core_allocated_ratio",
                "Device cores granted to a container (percent).",
                self._grant_cores,
            ),
            (
                "volcano_vgpu_device_shared_number",
                "The number of vgpu tasks sharing this card.",
                self._v_shared,
            ),
            (
                "volcano_vgpu_device_allocated_memory",
                "Device memory allocated on this card (MiB).",
                self._v_memory,
            ),
            (
                "volcano_vgpu_device_allocated_cores",
                "Percentage of the card's cores allocated.",
                self._v_cores,
            ),
            (
                "volcano_vgpu_device_memory_limit",
                "Device memory of this card (MiB).",
                self._v_limit,
            ),
            (
                "volcano_vgpu_device_memory_allocation_for_a_certain_pod",
                "Device memory allocated to a pod on this card (MiB).",
                self._v_pod_memory,
            ),
            (
                "volcano_vgpu_device_core_allocation_for_a_certain_pod",
                "Device cores allocated to a pod on this card (percent).",
                self._v_pod_cores,
            ),
            ("tessera_ledger_nodes", "Nodes in the ledger.", self._nodes),
            ("tessera_ledger_devices", "Devices in the ledger, by vendor and mode.", self._devs),
            ("tessera_ledger_pods", "Pods holding grants (bound or reserved).", self._pods),
        ):
            m.gauge(name, text, read)
        self.placements = m.counter(
            "tessera_placements",
            "Placement attempts of a gang, by result (placed, unschedulable, unresolvable).",
        )
        self.preempted = m.counter("tessera_preemptions", "Pods chosen to be preempted.")
        self.stage = m.stages()
        self.place_time = m.histogram(
            "tessera_placement_duration_seconds", "Time the ledger took to place one gang."
        )
        self.job_latency = m.histogram(
            "volcano_e2e_job_scheduling_latency_milliseconds",
            "From a gang's oldest pod's creation to its placement (ms).",
            MILLISECONDS,
        )

    # --- per device ------------------------------------------------------------------------

    def _devices(self) -> Iterator[Dev]:
        for node in self.ledger.nodes.values():
            yield from node.devices

    @staticmethod
    def _labels(d: Dev) -> Labels:
        return {
            "node": d.node.name,
            "device_uuid": d.uuid,
            "device_index": str(d.index),
            "device_type": d.model,
        }

    def _limit(self) -> list[tuple[float, Labels]]:
        return [(d.total_mem * MIB, self._labels(d)) for d in self._devices()]

    def _core_limit(self) -> list[tuple[float, Labels]]:
        return [(100 if d.total_cores else 0, self._labels(d)) for d in self._devices()]

    def _allocated(self) -> list[tuple[float, Labels]]:
        return [
            (d.used_mem * MIB, {**self._labels(d), "device_cores": str(d.total_cores)})
            for d in self._devices()
        ]

    def _shared(self) -> list[tuple[float, Labels]]:
        return [(d.used_slots, self._labels(d)) for d in self._devices()]

    def _cores(self) -> list[tuple[float, Labels]]:
        return [(_percent(d.used_cores, d.total_cores), self._labels(d)) for d in self._devices()]

    def _overview(self) -> list[tuple[float, Labels]]:
        return [
            (
                d.used_mem * MIB,
                {
                    **self._labels(d),
                    "device_cores": str(d.total_cores),
                    "device_memory_limit": str(d.total_mem),
                },
            )
            for d in self._devices()
        ]

    def _ratio(self) -> list[tuple[float, Labels]]:
        return [
            (
                d.used_mem / d.total_mem,
                {"node": d.node.name, "device_uuid": d.uuid, "device_index": str(d.index)},
            )
            for d in self._devices()
            if d.total_mem
        ]

    @staticmethod
    def _v(d: Dev) -> Labels:
        return {"devID": d.uuid, "NodeName": d.node.name}

    def _v_shared(self) -> list[tuple[float, Labels]]:
        return [(d.used_slots, self._v(d)) for d in self._devices()]

    def _v_memory(self) -> list[tuple[float, Labels]]:
        return [(d.used_mem, self._v(d)) for d in self._devices()]

    def _v_cores(self) -> list[tuple[float, Labels]]:
        return [(_percent(d.used_cores, d.total_cores), self._v(d)) for d in self._devices()]

    def _v_limit(self) -> list[tuple[float, Labels]]:
        return [(d.total_mem, self._v(d)) for d in self._devices()]

    # --- per grant ---------------------------------------------------------------------------

    def _grants(self) -> Iterator[tuple[Labels, int, float]]:
        """(labels, memory MiB, cores percent of the card) of every container's grant."""
        for pod in self.ledger.pods.values():
            node = self.ledger.nodes.get(pod.node)
            for index, c in enumerate(pod.containers):
                if c.reuses:
                    continue
                for d in c.devices:
                    dev = node.by_uuid.get(d.uuid) if node is not None else None
                    total = dev.total_cores if dev is not None else 100
                    cores = 100.0 if d.exclusive else _percent(d.cores, total)
                    memory = dev.total_mem if d.exclusive and dev is not None else d.memory_mib
                    labels = {
                        "namespace": pod.pod.namespace,
                        "node": pod.node,
                        "pod": pod.pod.name,
                        "container_index": str(index),
                        "device_uuid": d.uuid,
                    }
                    yield labels, memory, cores

    def _grant_memory(self) -> list[tuple[float, Labels]]:
        return [(mib * MIB, labels) for labels, mib, _ in self._grants()]

    def _grant_cores(self) -> list[tuple[float, Labels]]:
        return [(cores, labels) for labels, _, cores in self._grants()]

    def _per_pod(self, memory: bool) -> list[tuple[float, Labels]]:
        summed: dict[tuple[str, str, str], float] = {}
        for labels, mib, cores in self._grants():
            key = (labels["device_uuid"], labels["node"], labels["pod"])
            summed[key] = summed.get(key, 0.0) + (mib if memory else cores)
        return [
            (v, {"devID": dev, "NodeName": node, "podName": pod})
            for (dev, node, pod), v in summed.items()
        ]

    def _v_pod_memory(self) -> list[tuple[float, Labels]]:
        return self._per_pod(memory=True)

    def _v_pod_cores(self) -> list[tuple[float, Labels]]:
        return self._per_pod(memory=False)

    # --- the ledger ------------------------------------------------------------------------

    def _nodes(self) -> list[tuple[float, Labels]]:
        return [(len(self.ledger.nodes), {})]

    def _devs(self) -> list[tuple[float, Labels]]:
        counts: dict[tuple[str, str], int] = {}
        for d in self._devices():
            counts[(d.vendor, d.mode)] = counts.get((d.vendor, d.mode), 0) + 1
        return [(n, {"vendor": v, "mode": m}) for (v, m), n in sorted(counts.items())]

    def _pods(self) -> list[tuple[float, Labels]]:
        return [(len(self.ledger.pods), {})]


def _percent(used: int, total: int) -> float:
    """``used`` as percent of ``total`` (cores are percent of the card already when the
    card has 100)."""
    return used * 100 / total if total else 0.0
