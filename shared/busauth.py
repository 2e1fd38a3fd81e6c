"""Who may do what on the bus: one NATS user per service, and each user's permissions.

Every service connects as its own user (its name; node agents share ``node-agent``) with
a password from its own Secret, over TLS. The server lets a user publish only the events
its service produces (:data:`ROLES`), use only its own durable consumer, write only its
own KV buckets, and answer or send only its own control requests; everything else is
refused by the server, so a stranger on the network, or a compromised node, cannot
publish ``allocation.decided``. ``reader`` is for external tools: it may only subscribe
to ``tessera.v1.allocation.>`` and ask for views (shared/views.py). ``admin`` may do
anything (``tessera ping``, the tests' own checks, stream maintenance).

:func:`server_authorization` renders the ``authorization`` block of ``nats.conf`` from
this table: the local cluster (tools/localcluster.py) and the manifests
(deploy/kustomize/base/nats.yaml, checked by tests/unit/test_busauth.py) use the same.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared import events as ev
from shared import views
from shared.config import MAX_SHARDS

LEASE_BUCKET = "tessera-leases"
"""Leader leases (shared/bus.py ``Lease``)."""
RESERVATION_BUCKET = "tessera-reservations"
"""The allocator's reservations (services/device_allocator/reservations.py)."""
USAGE_BUCKET = "tessera-usage"
"""The coordinator's memory of each queue's past use (services/gang_coordinator/usage.py)."""

ADMIN = "admin"
READER = "reader"
NODE_AGENT = "node-agent"
READER_INBOX = "_INBOX_reader"
"""The reader's reply subjects: its own prefix, so it never sees the services' replies
(JetStream delivers fetched events to the fetcher's inbox; ``_INBOX.>`` would show it
all of them)."""


@dataclass(frozen=True)
class Role:
    """What one service does on the bus."""

    publishes: tuple[type[ev.Event], ...] = ()
    """The events it publishes (and no other user may)."""
    consumes: bool = True
    """It reads the stream through its own durable consumer (named as the user)."""
    writes: tuple[str, ...] = ()
    """KV buckets it writes (besides reading); every service reads the inventory."""
    requests: tuple[str, ...] = ()
    """Control subjects it sends requests to."""
    answers: tuple[str, ...] = (ev.CONTROL_PING_SUBJECT,)
    """Control subjects it answers (every service answers pings)."""
    manages_streams: bool = False
    """It may change the stream's and buckets' settings after a config change."""
    leads: bool = True
    """It runs active/standby: it writes its own key (its name) of the lease bucket."""
    shards: bool = False
    """It runs one active replica per shard (``scheduler.shards``): its lease keys are
    ``<name>.<shard>`` and its consumers ``<name>-<index>`` (:func:`shard_consumer`)."""


ROLES: Mapping[str, Role] = {
    "watcher": Role(
        publishes=(
            ev.PodPending,
            ev.PodUpdated,
            ev.PodDeleted,
            ev.PodRejected,
            ev.NodeUpdated,
            ev.NodeDeleted,
            ev.NamespaceUpdated,
            ev.DraObject,
            ev.PodGroupUpdated,
            ev.PodGroupDeleted,
            ev.HyperNodeUpdated,
            ev.HyperNodeDeleted,
            ev.PdbUpdated,
            ev.PdbDeleted,
            ev.QueueUpdated,
            ev.QueueDeleted,
            ev.JobUpdated,
            ev.JobDeleted,
        ),
        consumes=False,
        answers=(ev.CONTROL_PING_SUBJECT, ev.CONTROL_RESYNC_SUBJECT),
    ),
    "gang-coordinator": Role(
        publishes=(ev.GangReady, ev.PodWaiting),
        writes=(USAGE_BUCKET,),
        requests=(ev.CONTROL_RESYNC_SUBJECT,),
        answers=(ev.CONTROL_PING_SUBJECT, views.VIEW_QUEUES_SUBJECT),
    ),
    "device-allocator": Role(
        publishes=(
            ev.GangReady,  # a shard passes on what it cannot place (shared/core/shards.py)
            ev.GangSpan,
            ev.AllocationDecided,
            ev.AllocationFailed,
            ev.AllocationPreempting,
            ev.AllocationReleased,
        ),
        writes=(RESERVATION_BUCKET,),
        manages_streams=True,
        shards=True,
        answers=(ev.CONTROL_PING_SUBJECT, views.VIEW_LEDGER_SUBJECT, views.VIEW_EXPLAIN_SUBJECT),
    ),
    "binder": Role(publishes=(ev.AllocationBound, ev.AllocationBindFailed)),
    NODE_AGENT: Role(
        publishes=(ev.NodeInventory, ev.AllocationAdmitted), writes=("",), leads=False
    ),
    "job-controller": Role(),
}
"""Every service's role, by its user name (the service's ``NAME``). ``""`` in ``writes``
stands for the inventory bucket (its name is configuration)."""

USERS: tuple[str, ...] = (*ROLES, READER, ADMIN)
"""Every user the server knows."""


@dataclass(frozen=True)
class Permissions:
    """A NATS user's allowed subjects (``deny`` wins over ``allow``)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()
    allow_responses: bool = False

    def as_conf(self) -> dict[str, object]:
        """The user's ``permissions`` map in nats.conf."""
        # An empty allow list would allow everything: nothing allowed is a deny of ">".
        publish: dict[str, object] = {"allow": list(self.publish)} if self.publish else {}
        if self.deny_publish:
            publish["deny"] = list(self.deny_publish)
        conf: dict[str, object] = {"publish": publish, "subscribe": {"allow": list(self.subscribe)}}
        if self.allow_responses:
            conf["allow_responses"] = True
        return conf


def _event_subjects(types: Iterable[type[ev.Event]]) -> list[str]:
    """The subjects of these events: the bare subject, or every key under it."""
    return [t.filter_subject() for t in types]


def _bucket_read(bucket: str) -> list[str]:
    """Reading a KV bucket: its stream's info, gets, and the ordered consumers that
    ``keys()`` and ``watchall()`` create (and delete) with their flow control."""
    stream = f"KV_{bucket}"
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def _consumer(api: str, stream: str, durable: str) -> list[str]:
    """Using one durable consumer: create or update it, read its state, fetch, ack, and
    reset it when its owner changes (shared/runtime.py)."""
    return [
        f"{api}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{api}.CONSUMER.INFO.{stream}.{durable}",
        f"{api}.CONSUMER.RESET.{stream}.{durable}",
        f"{api}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def shard_consumer(user: str, index: int) -> str:
    """The durable consumer of shard ``index`` (its place in ``scheduler.shards``). NATS
    permissions match whole subject tokens only, so the names are numbered, not named
    after the shard: the server knows them all without reading the config."""
    return f"{user}-{index}"


def consumers(user: str) -> list[str]:
    """Every durable consumer a service's user may use: its own, and its shards'."""
    if ROLES[user].shards:
        return [user, *(shard_consumer(user, i) for i in range(MAX_SHARDS))]
    return [user]


def permissions(user: str, *, stream: str, inventory_bucket: str) -> Permissions:
    """The permissions of ``user`` (a key of :data:`ROLES`, ``reader`` or ``admin``)."""
    if user == ADMIN:
        return Permissions(publish=(">",), subscribe=(">",))
    if user == READER:  # watch decisions, ask for views; nothing else
        return Permissions(
            publish=(views.VIEW_SUBJECTS,),
            subscribe=(f"{ev.SUBJECT_PREFIX}.allocation.>", f"{READER_INBOX}.>"),
        )
    role = ROLES[user]
    api = "$JS.API"
    publish = [
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.STREAM.CREATE.{stream}",
        *_event_subjects(role.publishes),
        *role.requests,
    ]
    deny: list[str] = []
    buckets = {inventory_bucket, *(b or inventory_bucket for b in role.writes)}
    if role.leads:
        buckets.add(LEASE_BUCKET)
    for bucket in sorted(buckets):
        publish += _bucket_read(bucket)
    for bucket in sorted({b or inventory_bucket for b in role.writes}):
        publish.append(f"$KV.{bucket}.>")
    if role.leads:  # its own lease only: no service can take another's
        publish.append(f"$KV.{LEASE_BUCKET}.{user}")
        if role.shards:
            publish.append(f"$KV.{LEASE_BUCKET}.{user}.*")
    if role.manages_streams:
        publish += [
            f"{api}.STREAM.UPDATE.{s}" for s in [stream, *(f"KV_{b}" for b in sorted(buckets))]
        ]
    if role.consumes:
        # Node agents have one consumer per node, named after it (not expressible as a
        # subject pattern): they get any consumer except the services' own.
        if user == NODE_AGENT:
            publish += _consumer(api, stream, "*")
            for other in ROLES:
                if other != NODE_AGENT:
                    for durable in consumers(other):
                        deny += _consumer(api, stream, durable)
        else:
            for durable in consumers(user):
                publish += _consumer(api, stream, durable)
    return Permissions(
        publish=tuple(publish),
        subscribe=("_INBOX.>", *role.answers),
        deny_publish=tuple(deny),
        allow_responses=True,
    )


def manages_streams(user: str) -> bool:
    """May ``user`` change the stream's settings? (Any user not in the table: the server
    has no authorization, nothing is refused.)"""
    role = ROLES.get(user)
    return role is None or role.manages_streams


def new_password() -> str:
    """A fresh password: 192 random bits as hex after a letter. nats-server parses the
    value of an environment variable as config (``123`` becomes a number, ``true`` a
    boolean), so a password must start with a letter and hold letters and digits only."""
    return "t" + secrets.token_hex(24)


def password_env(user: str) -> str:
    """The environment variable that holds ``user``'s password in the NATS server's pod."""
    return "TESSERA_BUS_" + user.upper().replace("-", "_")


def server_tls(cert_file: str, key_file: str) -> str:
    """The ``tls`` block of nats.conf: clients must use TLS and check the certificate."""
    return (
        f"tls {{\n  cert_file: {json.dumps(cert_file)}\n  key_file: {json.dumps(key_file)}\n"
        "  timeout: 5\n}\n"
    )


def server_authorization(*, stream: str, inventory_bucket: str) -> str:
    """The ``authorization`` block of nats.conf: every user with its permissions and
    its password as ``$TESSERA_BUS_<USER>``, which nats-server reads from its environment
    (filled from the ``tessera-bus`` Secret in a cluster, by tools/localcluster.py here).
    """
    lines = ["authorization {", "  users = ["]
    for user in USERS:
        perms = permissions(user, stream=stream, inventory_bucket=inventory_bucket)
        body = json.dumps(perms.as_conf(), indent=2).replace("\n", "\n      ")
        lines += [
            "    {",
            f"      user: {json.dumps(user)}",
            f"      password: ${password_env(user)}",
            f"      permissions: {body}",
            "    }",
        ]
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"
