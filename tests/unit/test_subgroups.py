"""Gangs of gangs (shared/core/subgroups.py): a PodGroup's ``subGroupPolicy`` read and
checked, the coordinator's readiness and queue admission by whole subgroups, the
allocator placing each subgroup whole or not at all, and what the watcher, the webhook
and the job controller make of it. The same on the real API server:
tests/integration/test_subgroups.py."""

from __future__ import annotations

from typing import Any

from services.job_controller import pods
from services.job_controller.made import JobRef
from services.job_controller.podgroup import podgroup
from services.job_controller.status import Status
from services.watcher.translate import podgroup_event
from services.webhook.configuration import configurations
from services.webhook.service import Webhook
from shared import events as ev
from shared.config import parse as parse_config
from shared.core import vcjob
from shared.core.gangs import Gangs, Member, Policy
from shared.core.ledger import Statement
from shared.core.model import GangKey, NodeName
from shared.core.placement import GangMember
from shared.core.queues import GroupSpec, QueueSpec
from shared.core.subgroups import SubGroup, SubGroupPolicy, SubGroups, read_policies, subgroup_of
from tests.unit.corekit import gpus, placer, ref, request

WHOLE = {"nvidia.com/gpu": 1}
PART = "volcano.sh/partition-id"
PREFILL = {"name": "prefill", "subGroupSize": 2, "minSubGroups": 1, "matchLabelKeys": [PART]}


def policies(*raw: dict[str, Any]) -> tuple[SubGroupPolicy, ...]:
    read, errors = read_policies(list(raw))
    assert not errors, errors
    return read


# --- reading and matching -------------------------------------------------------------


def test_a_policy_reads_with_volcanos_defaults_and_takes_pods_by_selector_and_keys() -> None:
    [bare] = policies({"name": "any", "matchLabelKeys": ["k"]})
    assert (bare.size, bare.min_subgroups) == (1, 0)  # subGroupSize nil: 1; minSubGroups nil: 0
    assert bare.subgroup({"k": "a"}) == "any/a"  # no selector: every pod of the group
    assert bare.subgroup({"k": ""}) is None  # an empty value is no subgroup
    assert bare.subgroup({}) is None
    [keyless] = policies({"name": "none"})
    assert keyless.subgroup({"k": "a"}) is None  # no matchLabelKeys: no subgroup
    both = policies(
        {
            "name": "prefill",
            "labelSelector": {
                "matchLabels": {"role": "prefill"},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cold"]}],
            },
            "matchLabelKeys": ["replica", "shard"],
        },
        {"name": "rest", "matchLabelKeys": ["replica"]},
    )
    prefill = {"role": "prefill", "replica": "0", "shard": "1"}
    assert subgroup_of(both, prefill) == (both[0], "prefill/0/1")
    # the first policy that takes a pod has it; the next one takes what it leaves
    assert subgroup_of(both, {**prefill, "tier": "cold"}) == (both[1], "rest/0")
    assert subgroup_of(both, {"role": "decode"}) is None  # loose


def test_a_broken_policy_is_refused_naming_each_field_and_read_without_raising() -> None:
    raw = [
        {"name": "a", "subGroupSize": 0, "minSubGroups": -1, "matchLabelKeys": [PART]},
        {"name": "a", "labelSelector": {"matchExpressions": [{"key": "k", "operator": "Has"}]}},
        {"labelSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}},
        {"name": "b", "labelSelector": {"matchLabels": {"k": 1}}, "matchLabelKeys": "k"},
        "junk",
        {"name": "c/d"},
    ]
    read, errors = read_policies(raw)
    said = {e.field: e.message for e in errors}
    assert said == {
        "spec.subGroupPolicy[0].subGroupSize": "0 must be at least 1",
        "spec.subGroupPolicy[0].minSubGroups": "-1 must be at least 0",
        "spec.subGroupPolicy[1].name": '"a" names another policy too',
        "spec.subGroupPolicy[1].labelSelector.matchExpressions[0].operator": (
            "'Has' is not one of In, NotIn, Exists, DoesNotExist"
        ),
        "spec.subGroupPolicy[2].name": "required",
        "spec.subGroupPolicy[2].labelSelector.matchExpressions[0].values": (
            "must not be empty for In"
        ),
        "spec.subGroupPolicy[3].labelSelector.matchLabels": "must map label keys to values",
        "spec.subGroupPolicy[3].matchLabelKeys": "must be a list of label keys",
        "spec.subGroupPolicy[4]": "must be an object",
        "spec.subGroupPolicy[5].name": '"c/d": a policy name has no "/"',
    }
    assert read[0].size == 1  # read as best it can be
    assert read[1].subgroup({"k": "x"}) is None  # a malformed selector takes no pod
    assert read_policies("junk")[1][0].message == "must be a list"
    assert read_policies(None) == ((), [])


# --- the coordinator --------------------------------------------------------------------


def gangs(cards: int = 8) -> Gangs:
    g = Gangs(Policy(), {"nvidia": 10})
    g.set_node(NodeName("n"), tuple(gpus(cards)))
    return g


def member(group: str, labels: dict[str, str], created: float = 0.0) -> Member:
    pod = ref()
    return Member(
        pod=pod,
        key=GangKey.of(pod, group),
        request=request(WHOLE),
        created_at=created,
        labels=labels,
    )


def prefill(g: Gangs, *parts: str, group: str = "pd") -> list[Member]:
    out = []
    for i, part in enumerate(parts):
        m = member(group, {PART: part}, created=float(i))
        g.pending(m)
        out.append(m)
    return out


def test_a_gang_waits_for_min_sub_groups_whole_and_is_told_when_too_few_exist() -> None:
    g = gangs()
    key = GangKey(namespace="ns", name="pd")
    g.groups[key] = GroupSpec(min_member=2, subgroups=policies({**PREFILL, "minSubGroups": 2}))
    first = prefill(g, "0", "0", "1")  # subgroup 1 has one pod of its two
    waiting = g.dispatch(0.0)
    assert waiting.ready == ()
    assert {m.pod.uid for m, _ in waiting.told} == {m.pod.uid for m in first}
    status = waiting.told[0][1]
    assert not status.unresolvable  # more pods may come
    assert status.message() == (
        'subGroupPolicy "prefill": 1 whole subgroup of 2 pods exists, minSubGroups is 2: '
        "the PodGroup's pods wait until enough subgroups are whole"
    )
    assert g.dispatch(1.0).told == ()  # said once
    prefill(g, "1")
    [ready] = g.dispatch(2.0).ready
    assert len(ready.members) == 4
    assert ready.subgroups is not None
    assert ready.subgroups.required == {"prefill": 2}
    assert sorted((s.name, s.need, len(s.pods)) for s in ready.subgroups.subgroups) == [
        ("prefill/0", 2, 2),
        ("prefill/1", 2, 2),
    ]


def test_a_subgroup_that_cannot_be_whole_stays_behind_and_loose_pods_count() -> None:
    g = gangs()
    key = GangKey(namespace="ns", name="pd")
    g.groups[key] = GroupSpec(min_member=3, subgroups=policies(PREFILL))
    whole, _, partial = prefill(g, "0", "0", "1")
    loose = member("pd", {"role": "router"})
    g.pending(loose)
    [ready] = g.dispatch(0.0).ready
    sent = {m.pod.uid for m in ready.members}
    assert partial.pod.uid not in sent
    assert partial.state == "pending"
    assert whole.pod.uid in sent
    assert loose.pod.uid in sent
    assert len(sent) == 3
    assert ready.subgroups is not None
    assert ready.subgroups.required == {"prefill": 1}
    [sub] = ready.subgroups.subgroups
    assert (sub.name, sub.need, sub.pods[0]) == ("prefill/0", 2, whole.pod.uid)


def test_bound_pods_of_a_subgroup_lower_its_need_and_a_whole_one_counts() -> None:
    g = gangs()
    key = GangKey(namespace="ns", name="pd")
    g.groups[key] = GroupSpec(min_member=2, subgroups=policies(PREFILL))
    a, b = prefill(g, "0", "0")
    [first] = g.dispatch(0.0).ready
    for m in first.members:
        g.decided(m.pod.uid, {"nvidia.count": 1})
        g.bound_now(m.pod.uid)
    g.forget(b.pod.uid)  # deleted; its replacement comes
    again = member("pd", {PART: "0"})
    g.pending(again)
    [ready] = g.dispatch(1.0).ready
    assert [m.pod for m in ready.members] == [again.pod]
    assert ready.subgroups == SubGroups(
        subgroups=(SubGroup(name="prefill/0", policy="prefill", need=1, pods=(again.pod.uid,)),),
        required={"prefill": 1},  # subgroup 0 is not whole without it
    )
    g.decided(again.pod.uid, {"nvidia.count": 1})
    g.bound_now(again.pod.uid)
    more = member("pd", {PART: "0"})  # a third pod of a whole subgroup: it goes alone
    g.pending(more)
    [ready] = g.dispatch(2.0).ready
    assert ready.subgroups is not None
    assert ready.subgroups.required == {"prefill": 0}
    assert ready.subgroups.subgroups[0].need == 0
    assert a.state == "bound"


def test_an_invalid_policy_holds_the_pods_and_tells_them_why() -> None:
    g = gangs()
    key = GangKey(namespace="ns", name="pd")
    why = "invalid PodGroup: spec.subGroupPolicy[0].subGroupSize: 0 must be at least 1"
    g.groups[key] = GroupSpec(min_member=1, invalid=why)
    prefill(g, "0")
    waiting = g.dispatch(0.0)
    assert waiting.ready == ()
    [(_, status)] = waiting.told
    assert status.unresolvable
    assert status.message() == why


def test_a_queue_admits_whole_subgroups_only() -> None:
    g = gangs()
    g.queues["q"] = QueueSpec(name="q", capability={"nvidia.count": 3})
    key = GangKey(namespace="ns", name="pd")
    g.groups[key] = GroupSpec(min_member=2, queue="q", subgroups=policies(PREFILL))
    prefill(g, "0", "0", "1", "1")
    [ready] = g.dispatch(0.0).ready
    assert len(ready.members) == 2  # 3 fit the capability, a whole subgroup is 2
    assert ready.subgroups is not None
    assert [s.name for s in ready.subgroups.subgroups] == ["prefill/0"]


def test_a_group_without_policies_is_sent_as_before() -> None:
    g = gangs()
    g.groups[GangKey(namespace="ns", name="pd")] = GroupSpec(min_member=2)
    prefill(g, "0", "0", "1")
    [ready] = g.dispatch(0.0).ready
    assert (len(ready.members), ready.subgroups) == (3, None)


# --- the allocator ----------------------------------------------------------------------


def gang_members(n: int) -> list[GangMember]:
    key = GangKey(namespace="ns", name="pd")
    return [GangMember(pod=ref(), request=request(WHOLE), group=key) for _ in range(n)]


def layout(members: list[GangMember], *sizes: int, required: int = 1) -> SubGroups:
    subs, at = [], 0
    for i, size in enumerate(sizes):
        pods = tuple(m.pod.uid for m in members[at : at + size])
        subs.append(SubGroup(name=f"prefill/{i}", policy="prefill", need=size, pods=pods))
        at += size
    return SubGroups(subgroups=tuple(subs), required={"prefill": required})


def test_each_subgroup_is_placed_whole_or_not_at_all() -> None:
    """Two subgroups of two on three cards: one whole subgroup, never a third pod (as a
    plain gang of minMember 2 would place)."""
    members = gang_members(4)
    pl = placer({"n": gpus(3)})
    plain = pl.place_gang(members, 2, statement=Statement(pl.ledger))
    assert plain.ok
    assert len(plain.placed) == 3
    pl = placer({"n": gpus(3)})
    result = pl.place_gang(members, 2, subgroups=layout(members, 2, 2))
    assert result.ok
    assert {p.pod.uid for p in result.placed} == {m.pod.uid for m in members[:2]}
    assert {f.pod.uid for f in result.failures} == {m.pod.uid for m in members[2:]}
    assert "subgroup prefill/1: 2 pods together" in result.failures[0].message
    assert set(pl.ledger.pods) == {m.pod.uid for m in members[:2]}  # nothing of the other


def test_min_sub_groups_not_reached_places_nothing() -> None:
    members = gang_members(4)
    pl = placer({"n": gpus(3)})
    result = pl.place_gang(members, 2, subgroups=layout(members, 2, 2, required=2))
    assert not result.ok
    assert result.message.startswith('1/2 subgroups of "prefill" unschedulable: 0/1 nodes')
    assert not pl.ledger.pods  # as before the attempt


def test_a_required_subgroup_that_does_not_fit_gives_way_to_one_that_does() -> None:
    key = GangKey(namespace="ns", name="pd")
    big = GangMember(pod=ref(), request=request({"nvidia.com/gpu": 2}), group=key)
    members = [big, *gang_members(2)]  # subgroups [big] and [one card], a loose pod
    pl = placer({"n": gpus(2)})
    pl.place(ref(), request(WHOLE))  # one card left: the first subgroup cannot fit
    result = pl.place_gang(members, 1, subgroups=layout(members, 1, 1, required=1))
    assert result.ok
    assert [p.pod for p in result.placed] == [members[1].pod]
    assert {f.pod for f in result.failures} == {big.pod, members[2].pod}


def test_loose_pods_and_min_member_hold_beside_subgroups() -> None:
    members = gang_members(5)  # subgroups of 2 and 2, one loose pod
    pl = placer({"n": gpus(3)})
    result = pl.place_gang(members, 4, subgroups=layout(members, 2, 2))
    assert not result.ok
    assert result.message.startswith("1/5 tasks in gang unschedulable")
    assert not pl.ledger.pods
    result = pl.place_gang(members, 3, subgroups=layout(members, 2, 2))
    assert result.ok
    assert len(result.placed) == 3
    assert members[4].pod.uid in pl.ledger.pods  # the loose one, and subgroup 0 whole


def test_gang_ready_without_subgroups_decodes_as_a_plain_gang() -> None:
    """``GangReady.subgroups`` is new: an event without it is a plain gang, and one with
    it survives the bus."""
    members = gang_members(2)
    event = ev.GangReady(
        gang=ev.GangRef(namespace="ns", name="pd"),
        min_member=2,
        members=(),
        subgroups=layout(members, 2),
    )
    back = ev.decode(ev.encode(event))
    assert isinstance(back, ev.GangReady)
    assert back.subgroups == event.subgroups
    plain = ev.decode(ev.encode(ev.GangReady(gang=event.gang, min_member=1, members=())))
    assert isinstance(plain, ev.GangReady)
    assert plain.subgroups is None


# --- the watcher, the webhook and the job controller ----------------------------------


def podgroup_object(*policy: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "pd", "namespace": "ns", "uid": "u"},
        "spec": {"minMember": 2, "subGroupPolicy": list(policy)},
    }


def test_the_watcher_reads_the_policies_and_passes_a_broken_one_on_with_why() -> None:
    event = podgroup_event(podgroup_object(PREFILL))
    assert event.sub_group_policy == policies(PREFILL)
    assert not event.invalid
    broken = podgroup_event(podgroup_object({**PREFILL, "subGroupSize": -2}))
    assert broken.invalid == (
        "invalid PodGroup: spec.subGroupPolicy[0].subGroupSize: -2 must be at least 1"
    )
    ev.decode(ev.encode(broken))


def test_the_webhook_refuses_a_broken_policy_naming_the_field() -> None:
    hook = Webhook(parse_config({"scheduler": {"names": ["tessera"]}}))

    def review(obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
        request = {
            "uid": "1",
            "kind": {"group": "scheduling.volcano.sh", "kind": "PodGroup"},
            "operation": "CREATE" if old is None else "UPDATE",
            "namespace": "ns",
            "object": obj,
            "oldObject": old,
        }
        response: dict[str, Any] = hook.review({"request": request}, False)["response"]
        return response

    assert review(podgroup_object(PREFILL))["allowed"]
    refused = review(podgroup_object({**PREFILL, "minSubGroups": -1}))
    assert not refused["allowed"]
    assert refused["status"]["message"] == (
        "invalid PodGroup: spec.subGroupPolicy[0].minSubGroups: -1 must be at least 0"
    )
    bad = {"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["x"]}]}
    message = review(podgroup_object({**PREFILL, "labelSelector": bad}))["status"]["message"]
    assert "labelSelector.matchExpressions[0].values: must be empty for Exists" in message
    # an update is refused for a rule the PodGroup kept, not for one it broke already
    broken = podgroup_object({**PREFILL, "minSubGroups": -1})
    assert review({**broken, "metadata": {"name": "pd", "labels": {"a": "b"}}}, broken)["allowed"]
    worse = podgroup_object({**PREFILL, "minSubGroups": -1, "subGroupSize": 0})
    assert "subGroupSize: 0 must be at least 1" in review(worse, broken)["status"]["message"]
    cfg = parse_config({"webhook": {"url": "https://127.0.0.1:8443"}})
    _, (_, validating) = configurations(cfg, b"ca")
    hooks = {h["name"]: h for h in validating["webhooks"]}
    assert hooks["validate.podgroups.tessera.io"]["rules"][0]["resources"] == ["podgroups"]


def test_a_partition_policy_becomes_a_subgroup_policy_and_a_label_on_each_pod() -> None:
    """Volcano's job controller: a subgroup per task with ``partitionPolicy`` (size
    partitionSize, minSubGroups minPartitions, the task's pods, one subgroup per
    ``volcano.sh/partition-id``), and each pod labelled with index // partitionSize."""
    template = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    job = vcjob.read(
        {
            "tasks": [
                {
                    "name": "prefill",
                    "replicas": 4,
                    "minAvailable": 2,
                    "partitionPolicy": {
                        "totalPartitions": 2,
                        "partitionSize": 2,
                        "minPartitions": 1,
                    },
                    "template": template,
                },
                {"name": "router", "replicas": 1, "template": template},
            ]
        }
    )
    ref_ = JobRef("ml", "pd", "uid-1")
    body = podgroup(ref_, job)
    assert body["spec"]["subGroupPolicy"] == [
        {
            "name": "prefill",
            "subGroupSize": 2,
            "minSubGroups": 1,
            "labelSelector": {"matchLabels": {"volcano.sh/task-spec": "prefill"}},
            "matchLabelKeys": [PART],
        }
    ]
    labels = [
        pods.pod(ref_, job, job.tasks[0], i, Status())["metadata"]["labels"] for i in range(4)
    ]
    assert [x[PART] for x in labels] == ["0", "0", "1", "1"]
    assert PART not in pods.pod(ref_, job, job.tasks[1], 0, Status())["metadata"]["labels"]
    # the PodGroup as the watcher reads it takes the pods as the controller labels them
    [policy] = podgroup_event(
        {**body, "metadata": {**body["metadata"], "namespace": "ml"}}
    ).sub_group_policy
    assert [policy.subgroup(x) for x in labels] == [
        "prefill/0",
        "prefill/0",
        "prefill/1",
        "prefill/1",
    ]
    plain = vcjob.read({"tasks": [{"name": "w", "replicas": 1, "template": template}]})
    assert "subGroupPolicy" not in podgroup(ref_, plain)["spec"]
