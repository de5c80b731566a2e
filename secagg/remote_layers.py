"""Layers over a link: what a remote runtime (Flower) can carry and how it carries it -- the
refusal of a local-only phase (:func:`check_phase`) or of a layer that does not run remotely
(:func:`check_remote`), the server side of the carrying layer (:func:`layer_server`), the DP
test (:func:`is_dp`) and a node's release as its own ledger charges it
(:func:`node_release_event`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from secagg.errors import (
    ConfigurationError,
)
from secagg.layers.base import Layer
from secagg.layers.registry import carried_entries, entry_for
from secagg.link import LayerServer
from secagg.phase import PhaseBase

if TYPE_CHECKING:
    pass

_Phase = PhaseBase


def check_phase(phase: _Phase) -> None:
    """Refuse, on a remote runtime, a phase whose spec has no fields (a "local-only"
    phase: clients compute and upload nothing, the layer is not called). A remote runtime
    reaches the nodes only through a layer's stages, so such a phase would have to become
    its own client-step exchange with no layer; it is refused before any node is contacted
    for it, instead of running it through a layer that has nothing to carry.

    Raises:
        ConfigurationError: the phase uploads nothing.
    """
    if not phase.spec().fields:
        raise ConfigurationError(
            f"phase {phase.name!r} uploads no fields (a local-only phase); the Flower "
            "runtime does not run local-only phases yet: use the embedded Federation")


def check_remote(layer: Layer) -> None:
    """Refuse a layer a remote runtime cannot carry yet (with what can be used), as the layer
    registry declares it (:mod:`secagg.layers.registry`): carried are the layers with a
    server driver (Plaintext, SecureSum without pinned identities, Homomorphic with a
    decryptor node), and the DP layers around one of them (DistributedDP around a layer
    that sums encoded vectors: SecureSum). A layer is matched by its exact class.

    Raises:
        ConfigurationError: the layer (or its inner layer) does not run remotely.
    """
    entry = entry_for(layer)
    inner = layer.wrapped
    if entry is not None and entry.dp and entry.on_flower and inner is not None:
        carriers = [e for e in carried_entries()
                    if e.sums_encoded or not layer.needs_encoded_sum]
        if entry_for(inner) not in carriers:
            raise ConfigurationError(
                f"{type(layer).__name__} around {type(inner).__name__} does not run on "
                f"Flower yet: its inner layer must be one of "
                f"{[e.class_name for e in carriers]} there")
        check_remote(inner)
        return
    if entry is None or entry.server is None or not entry.on_flower:
        why = f" ({entry.not_on_flower})" if entry is not None and entry.not_on_flower else ""
        raise ConfigurationError(
            f"layer {getattr(layer, 'name', type(layer).__name__)!r} "
            f"({type(layer).__name__}) does not run on Flower yet{why}: its client side would "
            "have to run on the nodes; use Plaintext, SecureSum or Homomorphic there (alone "
            "or inside CentralDP, LocalDP, or DistributedDP around SecureSum), or the "
            "embedded Federation"
        )
    if entry.flower_check is not None:
        entry.flower_check(layer)


#: what a Flower node's error reply says when it refuses a release by its own privacy
#: budget (secagg.flower.client); the server takes such a node out of the population
NODE_BUDGET_REFUSAL = "refused by this node's privacy budget"


def node_release_event(client: int, run: str, round: int, phase: str,
                       dp: Any, **terms: Any) -> Any:
    """The release an instruction asks a Flower node for, as the node's own ledger charges
    it (:func:`secagg.privacy.node_budget.node_event`, from the same instruction fields):
    the server keeps its copy beside the node's reported ledger head. Named here, where
    the engine keeps its privacy plumbing, so that the transport imports no privacy
    code."""
    from secagg.privacy.node_budget import node_event

    return node_event(client, run, round, phase, dp, **terms)


def is_dp(layer: Layer) -> bool:
    """Whether ``layer`` is a DP layer (:attr:`~secagg.layers.base.Layer.is_dp`)."""
    return layer.is_dp


def layer_server(layer: Layer, *, decryptor: int | None = None,
                 pinned: Mapping[int, bytes] | None = None, embedded: bool = False,
                 ) -> tuple[Layer | None, LayerServer]:
    """(the DP wrapper or None, the server side of the layer that carries the uploads) for
    a runtime whose clients are reached over a link. ``decryptor``: Homomorphic's decryptor
    client id (None: the smallest connected). ``pinned``: the nodes' pinned public keys
    (client id -> 32 bytes), which SecureSum's server checks every ADVERTISE against.
    ``embedded``: for the embedded runtime's :class:`~secagg.local_link.LocalLink`, whose
    refusals are not Flower's (:func:`check_remote`, applied otherwise): there a layer (and a
    DP wrapper) of a registered class with a server driver runs over the link.

    Raises:
        ConfigurationError: the layer does not run over this runtime's link.
    """
    if not embedded:
        check_remote(layer)
    dp = layer if layer.is_dp else None
    carrier = layer.wrapped if dp is not None and layer.wrapped is not None else layer
    entry = entry_for(carrier)
    if entry is None or entry.server is None or (dp is not None and entry_for(dp) is None) \
            or (layer.needs_encoded_sum and not entry.sums_encoded):
        raise ConfigurationError(f"layer {type(layer).__name__} has no server driver over a "
                                 "link here")
    return dp, entry.server(carrier, decryptor=decryptor, pinned=pinned)
