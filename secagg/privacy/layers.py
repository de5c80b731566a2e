"""Differential-privacy layers: wrappers that add calibrated noise around an inner layer.

* :class:`CentralDP` — the aggregator adds Gaussian noise to the sums the inner layer
  produced. The aggregator therefore sees the un-noised sum first (under ``SecureSum`` the
  sum, under ``Plaintext`` every upload); the aggregate's notes and the transcript say so.
* :class:`LocalDP` — each client adds Gaussian noise to its own upload before it leaves;
  the inner layer carries noised uploads (transcripted as ``"noised"``).
* :class:`DistributedDP` — around ``SecureSum``: each client adds a share of integer noise
  (discrete Gaussian or Skellam) to its fixed-point-encoded vector before masking, sized so
  that the survivors' total reaches the target even when as many clients drop as the
  secure sum's threshold allows. The ring is planned with room for the noise (a 2^-40
  tail bound, see :func:`noise_tail`), and the noise actually achieved by the contributors
  is what the ledger records.

Noise level: the user gives two of (epsilon, delta, noise multiplier z); the third follows
for ``rounds * releases_per_round`` releases (:meth:`_DPLayer.plan_releases` overrides the
count). A release noises every non-public field f with sigma_f = z * sqrt(k) * Delta_f,
k the number of noised fields and Delta_f the field's L2 sensitivity (from its Bound and the
adjacency): the release is then exactly a Gaussian mechanism with multiplier z on the
joint sensitivity, whatever k. Fields with unequal :attr:`~secagg.messages.Field.dp_weight`
get sqrt(W / w_f) in place of sqrt(k) (W the weights' sum), with the same guarantee.
Fields listed in ``public`` are not noised: the transcript
says so, and the run's ledger marks each of them as released without DP noise (the run is
then not private; :meth:`_DPLayer.unnoised_fields` names them, with the reason). Every
other field needs a Bound (else :class:`InadmissibleField`). A user ``seed`` makes the noise
reproducible and marks the fields it noised as not private.

Before every release the layer asks the run's :class:`PrivacyLedger` (``ctx.privacy``, or
the layer's own) to :meth:`~PrivacyLedger.spend` the event; a release that would exceed
the budget raises :class:`BudgetExceeded` and nothing is released.

Each layer's work is split by party, and the release is orchestrated once: each layer
declares its server part (:meth:`~secagg.layers.base.Layer.server_part`: begin -- check,
budget, what the nodes need --, then the inner layer's driver, then end -- CentralDP's
noise on the sums, DistributedDP's accounting and decoding of the ring sum, the notes) and
its node part (:meth:`_DPLayer.node_part`: LocalDP noises the upload, DistributedDP encodes
it with its noise share). :meth:`_DPLayer.aggregate` runs the parts in one process; a
runtime whose clients run elsewhere (:mod:`secagg.flower`) runs each part where it belongs
and gets the same numbers. The inner layer never learns it is wrapped: it carries a spec
under a context, or sums the vectors the clients encoded (a
:class:`~secagg.layers.base.RingEncoding`). :meth:`_DPLayer.node_params` is what a client
needs to rebuild its part (:func:`node_layer`); :func:`noise_source` gives every party its
own noise stream.

The layers live one per module: :mod:`secagg.privacy.central`, :mod:`secagg.privacy.local`,
:mod:`secagg.privacy.distributed`, on :mod:`secagg.privacy.dp_base` and
:mod:`secagg.privacy.noise`; this module re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from secagg.errors import PrivacyError
from secagg.layers.base import Layer
from secagg.layers.registry import LayerOptions, get_layer, layer_names, make_layer, node_rebuilt
from secagg.privacy.central import CentralDP
from secagg.privacy.distributed import DistributedDP, DistributedRelease
from secagg.privacy.dp_base import DEFAULT_DELTA, _DPLayer, relabel
from secagg.privacy.local import LocalDP
from secagg.privacy.noise import TAIL_PROBABILITY, noise_source, noise_tail
from secagg.privacy.samplers import noise_generator

__all__ = ["DEFAULT_DELTA", "TAIL_PROBABILITY", "CentralDP", "DistributedDP",
           "DistributedRelease", "LocalDP", "_DPLayer", "node_layer", "noise_generator",
           "noise_source", "noise_tail", "relabel", "wraps_secure_sum"]


def wraps_secure_sum(params: Mapping[str, Any]) -> bool:
    """Whether the layer ``params`` rebuild on a node (:func:`node_layer`) wraps the
    session's secure sum (its threshold sizes the noise shares) rather than any layer: the
    inner layer it wraps by default (the layer registry's) sums encoded vectors."""
    entry = node_rebuilt(params.get("layer"))
    return entry is not None and get_layer(entry.inner or "").sums_encoded


def node_layer(params: Mapping[str, Any], inner: Layer) -> Layer:
    """The noise side of a DP layer, rebuilt on a client from :meth:`_DPLayer.node_params`
    (a runtime whose clients run elsewhere sends those; ``inner`` is the client's copy of
    the inner layer). Only the layers whose clients add noise can be rebuilt: those the
    layer registry gives ``node_params`` (``local-dp`` and ``distributed-dp``).

    Raises:
        PrivacyError: an unknown layer, or a parameter of the wrong type or out of range
            (a client never noises with parameters it cannot check).
    """
    if not isinstance(params, Mapping):
        raise PrivacyError(f"DP parameters must be a mapping, got {type(params).__name__}")
    entry = node_rebuilt(params.get("layer"))
    if entry is None:
        rebuilt = sorted(n for n in layer_names(dp=True) if node_rebuilt(n) is not None)
        raise PrivacyError(f"a client adds noise for {rebuilt} only, got "
                           f"{params.get('layer')!r}")
    known = {"layer", *entry.node_params}
    if set(params) - known:
        raise PrivacyError(f"unknown DP parameters {sorted(set(params) - known)}")
    public = params.get("public", [])
    seed = params.get("seed")
    if not isinstance(public, list) or (seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int))):
        raise PrivacyError("DP parameters: public must be a list of names, seed an int or None")
    dp = {k: params.get(k) for k in entry.node_params if k != "delta"}
    dp["public"] = tuple(public)
    return make_layer(entry.name, LayerOptions(delta=params.get("delta"), dp=dp), inner)
