"""Where a delivered message came from, read from its JetStream ack subject as nats-py
reads it (shared/bus.py ``delivery_of``)."""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from shared.bus import delivery_of

REPLIES = [
    "$JS.ACK.TESSERA.binder.3.1042.977.1795460790000000000.12",  # v1
    "$JS.ACK._.ACCHASH.TESSERA.binder.3.1042.977.1795460790000000000.12",  # v2, 11 tokens
    "$JS.ACK.hub.ACCHASH.TESSERA.binder.3.1042.977.1795460790000000000.12.rnd",  # v2, 12
]


@pytest.mark.parametrize("reply", REPLIES)
def test_the_attempt_and_stream_sequence_are_nats_pys(reply: str) -> None:
    msg = Msg(None, subject="tessera.v1.pod.deleted.ns.-", reply=reply)  # type: ignore[arg-type]
    delivery = delivery_of(msg)
    assert (delivery.attempt, delivery.stream_seq) == (3, 1042)
    assert delivery.attempt == msg.metadata.num_delivered
    assert delivery.stream_seq == msg.metadata.sequence.stream
    assert delivery.subject == msg.subject
