"""A node's side of every layer, whatever runtime carries its messages.

A layer's server driver (:class:`~secagg.link.LayerServer`) sends each client one
instruction per stage; this module is what a client does with it, given the instruction
(a mapping with its ``step``) and the node's private store between messages. Flower's
ClientApp (:mod:`secagg.flower.client`) and the embedded runtime's
:class:`~secagg.local_link.LocalLink` both call it, so a layer's node steps are written
once:

* :func:`runs_client_step` -- whether an instruction runs the client step (local training)
  first: ``upload`` (Plaintext), ``he-upload`` (Homomorphic), ``advertise`` (SecureSum) and
  ``share`` when it carries the step (``with_step``: the session advertised ahead);
* :func:`leave` -- after the client step, the upload leaves the node the layer's way
  (packed in the clear, encrypted, or encoded and advertised / shared);
* :func:`protocol_step` -- every other stage: the secure-sum stages (with the next
  session's ADVERTISE riding on ``unmask``), ``advertise-next``, and the HE decryptor's
  ``he-keygen`` / ``he-decrypt``.

What stays with the runtime: reading its messages, the node's identity, policy, budget and
signed statements (Flower), or the clients' in-memory state and their steps (embedded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

from secagg.errors import ProtocolError
from secagg.layers.registry import NodeUpload, upload_steps
from secagg.link import Reply, reply_field
from secagg.messages import Upload, UploadSpec
from secagg.stages import Key, Stage

NodeStore = MutableMapping[str, Any]
"""A node's private store between messages (Flower: a ConfigRecord in ``Context.state``;
embedded: a dict per client)."""


class _Uploads(Mapping[str, NodeUpload]):
    """The registered node steps that run the client step -> how the upload then leaves
    (the layer registry's ``node_uploads``: read when asked, so a layer registered later
    is found too)."""

    def __getitem__(self, step: str) -> NodeUpload:
        return upload_steps()[step]

    def __iter__(self) -> Iterator[str]:
        return iter(upload_steps())

    def __len__(self) -> int:
        return len(upload_steps())


#: the instructions that run the client step (``share`` only ``with_step``: else it is the
#: secure-sum stage), each with how the upload then leaves the node
UPLOADS: Mapping[str, NodeUpload] = _Uploads()


def runs_client_step(step: str, rec: Reply) -> bool:
    """Whether the instruction ``rec`` (of step ``step``) runs the client step before the
    layer's part (see the module docstring)."""
    return step in UPLOADS and (step != Stage.SHARE or rec.get(Key.WITH_STEP) is True)


def leave(rec: Reply, spec: UploadSpec, up: Upload, client: int, part: Any,
          out: dict[str, Any], cpu: float, store: NodeStore) -> dict[str, Any]:
    """The upload ``up`` (checked against ``spec``; under a DP release already prepared by
    the wrapping layer's node part ``part`` (None without one): e.g. noised where the node
    noises it) leaves the node the way the instruction's layer
    sends it; ``out`` holds the client step's reply fields (``cpu_s``, ``flops``,
    ``clipped``), ``cpu`` its CPU seconds. Returns the reply.

    Raises:
        ProtocolError: the instruction runs no client step, or the layer's part refuses.
    """
    step = reply_field(rec, Key.STEP, str)
    if step not in UPLOADS:
        raise ProtocolError(f"secagg step {step!r} runs no client step")
    return UPLOADS[step](rec, spec, up, client, part, out, cpu, store)


def _layer_step(step: str) -> Callable[[str, Reply, NodeStore], dict[str, Any]]:
    """The layer's node step that answers ``step`` (imported when first asked for: a
    secure-sum node never loads TenSEAL)."""
    if step.startswith("he-"):
        from secagg.homomorphic.node import decryptor_step

        return decryptor_step
    from secagg.secure_sum.node import stage

    return stage


def protocol_step(step: str, rec: Reply, store: NodeStore, client: int) -> dict[str, Any]:
    """A protocol stage that runs no client step (see the module docstring) for the node
    of client id ``client``; returns the reply.

    Raises:
        ProtocolError: an unknown step, or a message the layer's party refuses.
    """
    from secagg.secure_sum.node import advertise_next

    if step == Stage.ADVERTISE_NEXT:
        return advertise_next(rec, client, store)
    out = _layer_step(step)(step, rec, store)
    if step == Stage.UNMASK and Key.NEXT_SESSION in rec:
        out.update(advertise_next(rec, client, store))
    return out
