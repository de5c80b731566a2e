"""What a client signs about the layer parameters it was told, on every runtime: the one
definition (:func:`told_digest`) that the embedded signer (:class:`secagg.attest.Signer`),
a Flower node (:mod:`secagg.flower.node_identity`) and the audit
(:func:`secagg.attest.verify`) use; and the run tag format both runtimes share
(:func:`run_tag`).

The claim. A client's statement carries ``params["told"]``: the digest of the carrying
layer's parameters (the secure sum's threshold, graph, degree, precision and ring; the
homomorphic layer's scheme, ring degree, key holder, precision and cohort bound:
:data:`TOLD_KEYS`) as the client holds them when it sends the message -- on Flower, as the
instruction it answers carried them (``layer``, or ``next_layer`` for a key advertisement
made ahead); in one process, as the layer is described. The audit derives the same digest
from the run header's layer description, whatever wraps the carrying layer (CentralDP,
DistributedDP, LocalDP: :func:`told_params` follows ``inner``), and reports every statement
whose digest differs as ``contradicted``, naming its signer. So, against a server that
deviates from the protocol -- tells one node a lower threshold (fewer shares then rebuild
its mask), another graph or precision, leaves a parameter out, or writes a header that
states other parameters than those it told -- the audit with keys held outside the run
names each node that was told otherwise, on both runtimes. It proves nothing about
parameters a client is not told in ``layer`` (the DP noise a node is told is signed
apart, as ``noise``, and its epsilon checked from the signed closing terms;
``max_decryptions`` and ``flood_security_bits`` of a homomorphic layer are not in its
description, so not compared), nor about a statement that carries no ``told`` (a message
of a stage whose instruction carried no parameters, e.g. the consistency check).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from secagg.attest.statement import params_digest

#: The carrying layer parameters a node can be told (the union over the carrying layers:
#: :class:`~secagg.secure_sum.layer.SecureSum` and
#: :class:`~secagg.homomorphic.layer.Homomorphic`; no name means two things), each as
#: its layer's ``describe()`` states it. A parameter not given counts as ``None``, so one
#: left out of what a node was told differs from the header's value.
TOLD_KEYS = ("threshold", "graph", "k", "precision", "ring_bits",
             "scheme", "poly_modulus_degree", "key_holder", "max_clients")
#: Random bytes of a run tag (:func:`run_tag`): 128 bits, hex-encoded.
RUN_TAG_BYTES = 16


def carrying(desc: Any) -> Any:
    """The description of the layer that carries the uploads: ``desc`` with every
    wrapper's ``inner`` followed (a DP layer around a secure sum: the secure sum)."""
    seen = 0
    while isinstance(desc, Mapping) and isinstance(desc.get("inner"), Mapping) and seen < 16:
        desc, seen = desc["inner"], seen + 1
    return desc


def told_params(desc: Any) -> dict[str, Any] | None:
    """The parameters a node of a run of the layer described by ``desc`` is told (the
    carrying layer's :data:`TOLD_KEYS` it states); None when it states none (a layer that
    tells nodes no parameters, e.g. plaintext)."""
    inner = carrying(desc)
    if not isinstance(inner, Mapping) or not any(k in inner for k in TOLD_KEYS):
        return None
    return {k: inner.get(k) for k in TOLD_KEYS}


def told_digest(told: Mapping[str, Any]) -> str:
    """What a client signs as ``params["told"]``: the digest of the parameters ``told``
    (the ``layer`` JSON of an instruction, or :func:`told_params` of a description)
    restricted to :data:`TOLD_KEYS`, a missing one as ``None``."""
    return params_digest({k: told.get(k) for k in TOLD_KEYS})


def told_contradiction(params: Mapping[str, Any], layer: Any) -> bool:
    """Whether a statement's ``params`` say its signer was told other layer parameters
    than the run header's layer description ``layer`` states (a statement without
    ``told`` says nothing)."""
    if "told" not in params:
        return False
    want = told_params(layer)
    return want is None or params["told"] != told_digest(want)


def run_tag() -> str:
    """A fresh run tag, the format of both runtimes: :data:`RUN_TAG_BYTES` random bytes
    (``secrets``), hex. It binds a statement to its run; the nodes' own per-tag statement
    numbers, not its length, stop a server that reuses one."""
    return secrets.token_hex(RUN_TAG_BYTES)
