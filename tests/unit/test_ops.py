"""The operator's tables (tools/ops.py) from hand-made views: their exact text, ``-o json``
and ``-o yaml`` giving the view back, and ``tessera explain``'s reasons and hints."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import yaml

from shared import views
from shared.config import Config
from shared.core.model import PodRef, PodUID, RequestError
from shared.core.status import Reason
from tools import ops
from tools.cli import main


def grant(pod: str, container: str = "main", **kw: Any) -> views.GrantView:
    return views.GrantView(namespace="ml", pod=pod, uid=f"uid-{pod}", container=container, **kw)


def card(index: int, model: str = "A100", **kw: Any) -> views.DeviceView:
    figures = {"memory_mib": 81920, "cores": 100, "slots": 10, "mode": "hami-core", **kw}
    return views.DeviceView(
        uuid=f"GPU-{model}-{index}", index=index, vendor="nvidia", model=model, **figures
    )


LEDGER = views.LedgerView(
    nodes=(
        views.NodeView(
            name="gpu-a",
            pods=3,
            devices=(
                card(
                    0,
                    used_memory_mib=28192,
                    used_cores=30,
                    used_slots=2,
                    grants=(
                        grant("train-0", memory_mib=20000, cores=30, bound=True, group="ml/train"),
                        grant("infer", "srv", memory_mib=8192),
                    ),
                ),
                card(
                    1,
                    used_memory_mib=81920,
                    used_cores=100,
                    used_slots=1,
                    grants=(grant("big", memory_mib=81920, cores=100, exclusive=True, bound=True),),
                ),
            ),
        ),
        views.NodeView(
            name="gpu-b",
            unschedulable=True,
            devices=(card(0, "H100", memory_mib=81559, mode="mps", healthy=False, mps="down"),),
        ),
        views.NodeView(name="gpu-c", refused="runs config 0123abcd, not this allocator's"),
    ),
    instance="alloc-1",
    taken_at=1700000000.5,
)

QUEUES = views.QueuesView(
    queues=(
        views.QueueView(
            name="default",
            deserved={"nvidia.count": 3, "nvidia.memory": 122880, "nvidia.cores": 250},
            allocated={"nvidia.count": 2, "nvidia.memory": 28192, "nvidia.cores": 30},
            request={"nvidia.count": 3, "nvidia.memory": 110112, "ascend.count": 1},
            podgroups={"Running": 1, "Pending": 1},
            usage={"nvidia.count": 0.25, "nvidia.memory": 0.125},
        ),
        views.QueueView(name="research", state="Closed", weight=2.5),
    ),
    gangs=(
        views.GangView(
            namespace="ml",
            name="huge",
            lone=True,
            pods={"pending": 1},
            waiting_s=5,
            why="too big",
            unresolvable=True,
        ),
        views.GangView(
            namespace="ml",
            name="train",
            min_member=4,
            pods={"bound": 1, "pending": 3},
            waiting_s=125,
            why="0/3 nodes are available: 3 insufficient nvidia.com/gpumem.",
        ),
    ),
)


def test_nodes_table() -> None:
    assert ops.nodes_table(LEDGER) == (
        "NAME    DEVICES   MEMORY        CORES      SLOTS   PODS   STATUS\n"
        "gpu-a   2x A100   107.5/160Gi   130/200%   3/20    3      Ready\n"
        "gpu-b   1x H100   0/79.6Gi      0/100%     0/10    0      "
        "Unschedulable (1 device unhealthy or cordoned)\n"
        "gpu-c   <none>    -             -          -       0      "
        "Refused (runs config 0123abcd, not this allocator's)\n"
    )


def test_devices_table_names_who_holds_each_card_and_marks_reservations() -> None:
    assert ops.devices_table(LEDGER) == (
        "NODE    INDEX   MODEL   MODE        MEMORY(MiB)   CORES     SLOTS   HEALTH"
        "               WHO\n"
        "gpu-a   0       A100    hami-core   28192/81920   30/100    2/10    Healthy"
        "              ml/train-0(main) 20000MiB 30%, ml/infer(srv)* 8192MiB\n"
        "gpu-a   1       A100    hami-core   81920/81920   100/100   1/10    Healthy"
        "              ml/big(main) whole\n"
        "gpu-b   0       H100    mps         0/81559       0/100     0/10    Unhealthy,mps:down"
        "   <none>\n"
        "* reserved: placed by the allocator, not yet bound\n"
    )


def test_devices_wide_adds_uuid_vendor_and_podgroup() -> None:
    lines = ops.devices_table(LEDGER, wide=True).splitlines()
    assert lines[0].split() == [
        "NODE",
        "INDEX",
        "MODEL",
        "MODE",
        "MEMORY(MiB)",
        "CORES",
        "SLOTS",
        "HEALTH",
        "UUID",
        "VENDOR",
        "WHO",
    ]
    assert "GPU-A100-0   nvidia   ml/train-0(main) 20000MiB 30% [ml/train]" in lines[1]


def test_queues_then_waiting_gangs_longest_first() -> None:
    assert ops.queues_text(QUEUES) == (
        "NAME       STATE    WEIGHT   DESERVED                     ALLOCATED"
        "                    REQUEST                                 PAST USE   PODGROUPS\n"
        "default    Open     1        nvidia: 3 gpu, 120Gi, 250%   nvidia: 2 gpu, 27.5Gi, 30%"
        "   ascend: 1 npu; nvidia: 3 gpu, 107.5Gi   25.0%      1 Pending, 1 Running\n"
        "research   Closed   2.5      <none>                       <none>"
        "                       <none>                                  <none>     <none>\n"
        "\n"
        "GANG            QUEUE     MIN   PODS                 WAITING   WHY\n"
        "ml/train        default   4     3 pending, 1 bound   2m05s"
        "     0/3 nodes are available: 3 insufficient nvidia.com/gpumem.\n"
        "ml/huge (pod)   default   1     1 pending            5s        unresolvable: too big\n"
    )
    assert ops.queues_text(QUEUES, gangs_only=True).startswith("GANG ")
    assert ops.queues_text(views.QueuesView(), gangs_only=True) == "No gangs waiting.\n"


def test_the_capacity_tree_shows_each_child_under_its_parent_and_the_real_capability() -> None:
    gpus = {"nvidia.count": 4.0}
    tree = views.QueuesView(
        plugin="capacity",
        queues=(
            views.QueueView(name="org", deserved=gpus, capability={"nvidia.count": 6.0}),
            views.QueueView(
                name="team",
                parent="org",
                deserved={"nvidia.count": 2.0},
                real_capability={"nvidia.count": 6.0},
                allocated={"nvidia.count": 3.0},
            ),
            views.QueueView(name="lost", refused='queue "lost": its parent "x" does not exist'),
        ),
    )
    lines = ops.queues_table(tree, wide=True).splitlines()
    assert lines[0].split()[:8] == [
        "NAME",
        "STATE",
        "DESERVED",
        "GUARANTEE",
        "CAPABILITY",
        "REAL",
        "CAPABILITY",
        "ALLOCATED",
    ]
    assert lines[1].startswith("org ")
    assert lines[2].startswith("  team ")
    assert "nvidia: 6 gpu" in lines[2]
    assert lines[3].split()[:2] == ["lost", "Refused"]
    assert lines[3].endswith('queue "lost": its parent "x" does not exist')


def test_totals_line() -> None:
    assert ops.totals(LEDGER, QUEUES) == (
        "nodes 3   devices 3   memory 107.5/239.6Gi (45%)   cores 130/300% (43%)   "
        "slots 3/30 (10%)   pods placed 3 (1 reserved)   gangs waiting 2\n"
    )


def test_jobs_table_lists_a_job_before_its_podgroup() -> None:
    job = {
        "metadata": {"namespace": "ml", "name": "train"},
        "spec": {"minAvailable": 4, "queue": "research"},
        "status": {"state": {"phase": "Pending"}, "pending": 4},
    }
    group = {
        "metadata": {"namespace": "ml", "name": "train"},
        "spec": {"minMember": 4, "queue": "research"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "Unschedulable", "status": "True", "message": "4/4 tasks unschedulable"}
            ],
        },
    }
    assert ops.jobs_table([job], [group], all_namespaces=True) == (
        "NAMESPACE   NAME             PHASE     MIN   RUNNING   PENDING   SUCCEEDED   FAILED"
        "   QUEUE      MESSAGE\n"
        "ml          job/train        Pending   4     0         4         0           0"
        "        research\n"
        "ml          podgroup/train   Pending   4     0         -         0           0"
        "        research   4/4 tasks unschedulable\n"
    )


@pytest.mark.parametrize("view", [LEDGER, QUEUES])
def test_json_and_yaml_give_the_view_back(view: msgspec.Struct) -> None:
    assert msgspec.json.decode(ops.dump(view, "json"), type=type(view)) == view
    assert msgspec.convert(yaml.safe_load(ops.dump(view, "yaml")), type(view)) == view


def test_the_table_never_cuts_a_name() -> None:
    long = "a-node-name-much-longer-than-its-header-" * 3
    text = ops.table(["NAME", "X"], [[long, "1"], ["b", "22"]])
    assert text.splitlines() == [
        f"{'NAME':<{len(long)}}   X",
        f"{long}   1",
        f"{'b':<{len(long)}}   22",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59, "59s"), (65, "1m05s"), (7800, "2h10m"), (273600, "3d4h")]
)
def test_duration(seconds: float, text: str) -> None:
    assert ops.duration(seconds) == text


POD: dict[str, Any] = {
    "metadata": {"namespace": "ml", "name": "big2", "uid": "u9"},
    "spec": {
        "schedulerName": "tessera",
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 200000}},
            }
        ],
    },
    "status": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
                "message": "0/2 nodes are available: 2 nvidia.com/gpumem larger than the card.",
            }
        ],
    },
}
EVENTS = [
    {"reason": "Scheduled", "message": "not this one", "lastTimestamp": "2025-01-01T00:02:00Z"},
    {"reason": "FailedScheduling", "message": "older", "lastTimestamp": "2025-01-01T00:00:00Z"},
    {
        "reason": "FailedScheduling",
        "message": "0/2 nodes are available: 2 nvidia.com/gpumem larger than the card.",
        "lastTimestamp": "2025-01-01T00:01:00Z",
        "count": 3,
    },
]
VERDICTS = views.ExplainView(
    pod=PodRef(namespace="ml", name="big2", uid=PodUID("u9")),
    message="0/3 nodes are available: 1 node(s) were unschedulable, 2 nvidia.com/gpumem "
    "larger than the card.",
    nodes=(
        views.NodeVerdict(node="gpu-c", fits=True),
        views.NodeVerdict(
            node="gpu-a",
            reasons=(Reason(kind="larger-than-card", plugin="DeviceShare"),),
            texts=("nvidia.com/gpumem larger than the card",),
            hints=("ask for at most 81920 nvidia.com/gpumem",),
        ),
        views.NodeVerdict(
            node="gpu-b",
            reasons=(
                Reason(kind="node-unschedulable", plugin="NodeUnschedulable"),
                Reason(kind="type-excluded", plugin="DeviceShare"),
            ),
            texts=("node(s) were unschedulable", "gpu type excluded"),
            hints=("uncordon the node (kubectl uncordon)",),
        ),
    ),
)


def test_explain_shows_the_last_attempt_then_every_node_with_reasons_and_hints() -> None:
    assert ops.explain_text(POD, EVENTS, VERDICTS) == (
        "Pod:        ml/big2 (uid u9)\n"
        "Scheduler:  tessera\n"
        "State:      Pending, not bound\n"
        "\n"
        "Last attempt (as the API server shows it):\n"
        "  PodScheduled: False (Unschedulable) at 2025-01-01T00:00:00Z: 0/2 nodes are available:"
        " 2 nvidia.com/gpumem larger than the card.\n"
        "  Event:        FailedScheduling x3 at 2025-01-01T00:01:00Z: 0/2 nodes are available:"
        " 2 nvidia.com/gpumem larger than the card.\n"
        "\n"
        "Now (the device-allocator tried it on every node, placing nothing):\n"
        "  0/3 nodes are available: 1 node(s) were unschedulable, 2 nvidia.com/gpumem larger"
        " than the card.\n"
        "\n"
        "NODE    FITS   PLUGIN              WHY NOT                                  WHAT WOULD"
        " MAKE IT FIT\n"
        "gpu-c   yes\n"
        "gpu-a   no     DeviceShare         nvidia.com/gpumem larger than the card   ask for at"
        " most 81920 nvidia.com/gpumem\n"
        "gpu-b   no     NodeUnschedulable   node(s) were unschedulable               uncordon the"
        " node (kubectl uncordon)\n"
        "               DeviceShare         gpu type excluded\n"
    )


def test_explain_lists_the_first_nodes_and_counts_the_rest() -> None:
    text = ops.explain_table(VERDICTS, limit=1)
    assert text.splitlines()[1:] == ["gpu-c   yes", "... and 2 more nodes (--all lists them)"]


def test_explain_of_a_pod_not_ours_and_bound_asks_nothing() -> None:
    bound = {
        **POD,
        "spec": {**POD["spec"], "schedulerName": "default-scheduler", "nodeName": "gpu-a"},
    }
    text = ops.explain_text(bound, [], None, schedulers=("tessera", "volcano"))
    assert "Scheduler:  default-scheduler (not Tessera's: tessera, volcano)" in text
    assert "State:      Pending, bound to gpu-a\n" in text
    assert "  Event:        no FailedScheduling Event\n" in text
    assert text.endswith("Now: nothing to try (the pod is bound or finished).\n")


def test_explain_query_parses_the_pod_as_the_watcher_does() -> None:
    query = ops.explain_query(Config(), POD)
    assert isinstance(query, views.ExplainQuery)
    assert query.pod == PodRef(namespace="ml", name="big2", uid=PodUID("u9"))
    [device] = query.request.containers[0].devices
    assert (device.vendor, device.memory_mib) == ("nvidia", 200000)
    assert query.spec is not None
    assert query.spec.namespace == "ml"


def test_explain_of_an_invalid_request_prints_what_the_watcher_tells() -> None:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}
    pod = {
        **POD,
        "spec": {**POD["spec"], "containers": [{"name": "typo", "resources": {"limits": limits}}]},
    }
    errors = ops.explain_query(Config(), pod)
    assert isinstance(errors, list)
    assert all(isinstance(e, RequestError) for e in errors)
    text = ops.explain_text(pod, [], errors)
    assert "Now: the request is invalid; Tessera never places it as written." in text
    assert "  invalid device request: nvidia.com/gpucores (container typo): 150" in text
    assert "  nvidia.com/gpucores (container typo): 150" in text


def test_vector_is_compact_per_vendor() -> None:
    assert ops.vector({}) == "<none>"
    assert ops.vector({"nvidia.cores": 250, "nvidia.count": 3, "nvidia.memory": 512}) == (
        "nvidia: 3 gpu, 512Mi, 250%"
    )
    assert ops.vector({"ascend.memory": 65536, "nvidia.count": 0.5}) == (
        "ascend: 64Gi; nvidia: 0.5 gpu"
    )


def test_installed_as_kubectl_tessera_it_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["/usr/local/bin/kubectl-tessera"])
    with pytest.raises(SystemExit) as exit_:
        main(["get", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: kubectl tessera get ")


def test_explain_of_a_request_refused_before_any_node() -> None:
    """Larger than every card: the allocator's one reason, unresolvable, no node table."""
    refused = views.ExplainView(
        pod=VERDICTS.pod,
        message="nvidia.com/gpumem (container main): 200000 MiB is larger than any nvidia "
        "card in the cluster (81920 MiB); ask for at most 81920",
        unresolvable=True,
    )
    text = ops.explain_text(POD, EVENTS, refused)
    assert text.endswith(
        "Now (the device-allocator tried it on every node, placing nothing):\n"
        f"  {refused.message}\n"
        "  Unresolvable: no pod leaving can help; only a new or changed node, or a changed pod.\n"
        "  No node was tried: no node could take the request as written.\n"
    )


def test_cards_without_a_slot_limit_show_none() -> None:
    """MIG and vNPU cards are limited by their instances (shared/core/ledger.py
    UNLIMITED_SLOTS): no slot figure, and they count in no slot total."""
    mig = card(0, mode="mig", slots=ops.UNLIMITED_SLOTS, used_slots=1)
    ledger = views.LedgerView(nodes=(views.NodeView(name="mig", devices=(mig, card(1))),))
    assert ops.devices_table(ledger).splitlines()[1].split()[6] == "1/-"
    assert ops.nodes_table(ledger).splitlines()[1].split()[5] == "0/10"
    assert "   slots 0/10 (0%)   " in ops.totals(ledger, None)
