"""How secagg's messages ride in Flower ``Message`` objects.

Every instruction and reply carries one ``ConfigRecord`` named :data:`RECORD`: small
scalars (round, phase, step, CPU seconds) and the toolkit's own wire bytes (a packed
broadcast or upload from :mod:`secagg.wire`, or a secure-sum protocol message from
:mod:`secagg.secure_sum.wire`) as ``bytes`` values. Flower adds its own envelope; its size
is measured by :func:`flower_bytes` so the two can be shown side by side.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict

from secagg.errors import ProtocolError
from secagg.link import reply_field as field  # noqa: F401 - re-exported: a checked field

#: Name of the ConfigRecord that holds secagg's fields in every message.
RECORD = "secagg"
#: Flower message type of every instruction (ClientApp action ``secagg``).
MESSAGE_TYPE = "train.secagg"



def content(**values: Any) -> RecordDict:
    """A RecordDict holding ``values`` (int, float, str, bytes, bool) in :data:`RECORD`."""
    return RecordDict({RECORD: ConfigRecord({k: v for k, v in values.items() if v is not None})})


def read(message: Message) -> ConfigRecord:
    """The :data:`RECORD` of ``message``.

    Raises:
        ProtocolError: the message carries no secagg record.
    """
    rec = message.content.config_records.get(RECORD)
    if rec is None:
        raise ProtocolError(f"Flower message without a {RECORD!r} ConfigRecord")
    return rec


def flower_bytes(message: Message) -> int:
    """Bytes of Flower's serialized objects for ``message``: the message, its RecordDict and
    each record (what Flower ships, before its HTTP/gRPC framing)."""
    n = len(message.deflate())
    if message.has_content():
        rd = message.content
        n += len(rd.deflate())
        for rec in rd.values():
            n += len(rec.deflate())
    return n
