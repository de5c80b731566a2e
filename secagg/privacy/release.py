"""A DP release's node part, rebuilt on a node whose runtime runs the clients elsewhere.

Each DP layer declares its own parts (:mod:`secagg.privacy.layers`): the server part
(:meth:`~secagg.layers.base.Layer.server_part`) that wraps the inner layer's driver on the
aggregator, and the node part (:meth:`~secagg.privacy.layers._DPLayer.node_part`) a client
runs on its upload before it leaves. The aggregator sends the node part's parameters
(:attr:`~secagg.layers.base.ServerPart.node_params`) with every client-step instruction; a
node rebuilds the layer from them here (:func:`node_noiser`) and asks it for its part
(:func:`node_part`). Nothing here names a concrete layer: the layer is looked up by the
name in its parameters (:func:`~secagg.privacy.layers.node_layer`).
"""

from __future__ import annotations

import json

from secagg.errors import ConfigurationError, PrivacyError, ProtocolError
from secagg.layers.base import Layer, NodePart
from secagg.link import Reply, reply_field
from secagg.privacy.layers import node_layer, noise_source, wraps_secure_sum


def node_noiser(rec: Reply) -> Layer:
    """The run's DP layer on a node, rebuilt from an instruction's ``dp`` parameters
    (:func:`~secagg.privacy.layers.node_layer`) around the inner layer the instruction
    describes under ``layer`` (the session's SecureSum, whose threshold sizes a
    DistributedDP share), or around Plaintext when it describes none; parameters the node
    cannot check are a ProtocolError (an error reply: the node drops, it never noises
    less)."""
    from secagg.layers.plaintext import Plaintext
    from secagg.secure_sum.layer import SecureSum

    try:
        params = json.loads(reply_field(rec, "dp", str))
        if not isinstance(params, dict):
            raise PrivacyError("DP parameters must be a JSON object")
        inner: Layer = Plaintext()
        if "layer" in rec and wraps_secure_sum(params):
            inner = SecureSum(**json.loads(reply_field(rec, "layer", str)))
        return node_layer(params, inner)
    except (PrivacyError, ConfigurationError, ValueError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"DP parameters refused: {exc}") from None


def node_part(rec: Reply, client: int, sizing: str = "server") -> NodePart:
    """A node's part of the release for its client step's instruction ``rec``: the rebuilt
    layer's node part (:func:`node_noiser`), drawing from this node's own noise stream for
    the round and phase; ``sizing`` is how the node sizes a noise share (``"server"``,
    ``"pinned"`` or ``"alone"``)."""
    layer = node_noiser(rec)
    rng = noise_source(getattr(layer, "seed", None), reply_field(rec, "round", int),
                       reply_field(rec, "phase", str), int(client)).rng
    try:
        return layer.node_part(rng, sizing=sizing)  # type: ignore[attr-defined]
    except PrivacyError as exc:
        raise ProtocolError(f"DP parameters refused: {exc}") from None
