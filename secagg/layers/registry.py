"""One registry of the layers that are built by name: ``secagg run --layer``, the sweep's
``grid.layers``, and any third-party layer that registers itself.

Each entry knows how to build its layer from :class:`LayerOptions` (the options a command
line or a sweep config can set), whether it adds DP noise (then it needs an epsilon and
wraps an inner layer, by default the registered layer named by ``inner``), and whether a
sweep may use it. The command line and the sweep read the names from here instead of
keeping tables of their own::

    from secagg.layers.registry import LayerOptions, make_layer

    layer = make_layer("distributed-dp", LayerOptions(epsilon=2.0, threshold=0.7))

A new layer registers a builder under a name (names are unique)::

    @register_layer("my-layer", summary="what it does")
    def _build(options: LayerOptions, inner: Layer | None) -> Layer:
        return MyLayer(...)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from secagg.errors import ConfigurationError
from secagg.layers.base import Layer

__all__ = ["LayerEntry", "LayerOptions", "get_layer", "layer_names", "make_layer",
           "register_layer"]


@dataclass(frozen=True)
class LayerOptions:
    """The options a layer built by name may read (each layer reads only its own).

    Attributes:
        threshold: secure-sum threshold, a fraction in (0, 1) or a count of clients.
        graph: secure-sum neighbour graph (None: the layer's default).
        he_scheme: homomorphic scheme, ``"bfv"`` or ``"ckks"``.
        epsilon, delta: a DP layer's budget (epsilon is required for DP layers).
        rounds: a DP layer's planned number of rounds (None: the run's).
        dp: further keyword arguments of the DP layers (e.g. ``adjacency``, ``seed``).
        dropout: the fraction of a cohort expected to drop (the secure sum sizes its SecAgg+
            degree for it: ``SecureSum(dropout=...)``).
    """

    threshold: float | int = 0.7
    graph: str | None = None
    he_scheme: str = "bfv"
    epsilon: float | None = None
    delta: float | None = None
    rounds: int | None = None
    dp: Mapping[str, Any] = field(default_factory=dict)
    dropout: float = 0.0


Builder = Callable[[LayerOptions, "Layer | None"], Layer]


@dataclass(frozen=True)
class LayerEntry:
    """A registered layer.

    Attributes:
        name: the name it is built by (``--layer NAME``).
        build: ``(options, inner) -> Layer``; ``inner`` is None except for DP layers.
        dp: True for a layer that adds DP noise around an inner layer.
        inner: DP layers: the registered name of the inner layer it wraps by default.
        sweepable: whether a privacy-utility sweep may put it in ``grid.layers``.
        summary: one line for listings.
    """

    name: str
    build: Builder
    dp: bool = False
    inner: str | None = None
    sweepable: bool = True
    summary: str = ""


_REGISTRY: dict[str, LayerEntry] = {}


def register_layer(name: str, *, dp: bool = False, inner: str | None = None,
                   sweepable: bool = True, summary: str = "") -> Callable[[Builder], Builder]:
    """Decorator: register ``builder`` under ``name``.

    Raises:
        ConfigurationError: ``name`` is taken, or a DP layer names no registered inner layer.
    """

    def add(builder: Builder) -> Builder:
        if name in _REGISTRY:
            raise ConfigurationError(f"a layer named {name!r} is already registered")
        if dp and (inner is None or inner not in _REGISTRY):
            raise ConfigurationError(
                f"DP layer {name!r} must name a registered inner layer, got {inner!r}")
        _REGISTRY[name] = LayerEntry(name, builder, dp, inner, sweepable, summary)
        return builder

    return add


def layer_names(*, dp: bool | None = None, sweepable: bool | None = None) -> tuple[str, ...]:
    """Registered names, in registration order; ``dp`` / ``sweepable`` filter them."""
    return tuple(e.name for e in _REGISTRY.values()
                 if (dp is None or e.dp == dp) and (sweepable is None or e.sweepable == sweepable))


def get_layer(name: str) -> LayerEntry:
    """The entry registered as ``name``.

    Raises:
        ConfigurationError: no such layer (the message lists the registered ones).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown layer {name!r}; registered: {', '.join(_REGISTRY)}") from None


def make_layer(name: str, options: LayerOptions | None = None,
               inner: Layer | None = None) -> Layer:
    """Build the layer registered as ``name``. A DP layer wraps ``inner``, or a fresh
    instance of its registered inner layer built from the same options.

    Raises:
        ConfigurationError: unknown name, or ``inner`` given for a layer that wraps none.
        PrivacyError: a DP layer without an epsilon (or with bad DP options).
    """
    entry = get_layer(name)
    options = options or LayerOptions()
    if not entry.dp:
        if inner is not None:
            raise ConfigurationError(f"layer {name!r} wraps no inner layer")
        return entry.build(options, None)
    if inner is None:
        inner = make_layer(entry.inner or "", options)
    return entry.build(options, inner)


# -- the built-in layers (in the order the command line lists them) ---------------------


@register_layer("plaintext", summary="the server sees every upload")
def _plaintext(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.layers.plaintext import Plaintext

    return Plaintext()


@register_layer("secure-sum", summary="dropout-tolerant secure aggregation: the server "
                "learns only the sum")
def _secure_sum(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.secure_sum import SecureSum

    kwargs: dict[str, Any] = {"threshold": options.threshold, "dropout": options.dropout}
    if options.graph is not None:
        kwargs["graph"] = options.graph
    return SecureSum(**kwargs)


@register_layer("homomorphic", sweepable=False,
                summary="additively homomorphic encryption (TenSEAL BFV or CKKS)")
def _homomorphic(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.homomorphic import Homomorphic

    return Homomorphic(scheme=options.he_scheme)


def _dp_kwargs(options: LayerOptions) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"epsilon": options.epsilon, "delta": options.delta}
    if options.rounds is not None:
        kwargs["rounds"] = options.rounds
    kwargs.update(options.dp)
    return kwargs


@register_layer("central-dp", dp=True, inner="plaintext",
                summary="the aggregator noises the sum")
def _central_dp(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.privacy import CentralDP

    assert inner is not None
    return CentralDP(inner, **_dp_kwargs(options))


@register_layer("local-dp", dp=True, inner="plaintext",
                summary="each client noises its own upload")
def _local_dp(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.privacy import LocalDP

    assert inner is not None
    return LocalDP(inner, **_dp_kwargs(options))


@register_layer("distributed-dp", dp=True, inner="secure-sum",
                summary="each client adds a share of the noise before secure summation")
def _distributed_dp(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.privacy import DistributedDP

    assert inner is not None
    return DistributedDP(inner, **_dp_kwargs(options))
