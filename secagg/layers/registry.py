"""The one registry of layer kinds: the layers built by name (``secagg run --layer``, the
sweep's ``grid.layers``, any third-party layer that registers itself), and what the engine,
Flower, the node and ``secagg dp-audit`` need to know of each.

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

The same entry is what every other reader of layer kinds asks, so none keeps a table of its
own: the engine and Flower (:func:`entry_for`: the entry of a layer instance, by its exact
class; ``server``: its server driver over a Link, a lazy factory so that this module imports
no driver; ``not_on_flower`` / ``flower_check``: why it, or one configuration of it, does
not run there), the node (``node_uploads``: its node steps that run the client step,
:func:`upload_steps`; ``node_params``: what a node rebuilds a noising DP layer from,
:func:`node_rebuilt`), and ``secagg dp-audit`` (``audit``: which release the audit plays,
:func:`audited_kind`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from secagg.errors import ConfigurationError
from secagg.layers.base import Layer
from secagg.stages import Stage

if TYPE_CHECKING:
    from secagg.link import LayerServer

__all__ = ["LayerEntry", "LayerOptions", "ServerFactory", "audited_kind", "entry_for",
           "carried_entries", "get_layer", "layer_names", "make_layer", "register_layer"]


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
        bound: the validated sum's L2 bound on one client's upload (None: from the spec's
            declared client-level bounds).
        cheaters: the validated sum's attack switch: clients per cohort that skip their clip
            and scale their update by 100 (demonstrations and tests).
    """

    threshold: float | int = 0.7
    graph: str | None = None
    he_scheme: str = "bfv"
    epsilon: float | None = None
    delta: float | None = None
    rounds: int | None = None
    dp: Mapping[str, Any] = field(default_factory=dict)
    dropout: float = 0.0
    bound: float | None = None
    cheaters: int = 0


Builder = Callable[[LayerOptions, "Layer | None"], Layer]


NodeUpload = Callable[..., dict[str, Any]]
"""A node step that sends a client step's upload the layer's way (see
:attr:`LayerEntry.node_uploads`)."""


class ServerFactory(Protocol):
    """Builds a carried layer's server driver over a Link (:class:`~secagg.link.LayerServer`)
    for one run: ``decryptor`` is Homomorphic's decryptor client id (None: the smallest
    connected), ``pinned`` the nodes' pinned Ed25519 public keys (client id -> 32 bytes)
    that SecureSum checks every ADVERTISE against; a driver ignores what it does not use."""

    def __call__(self, layer: Layer, *, decryptor: int | None = None,
                 pinned: Mapping[int, bytes] | None = None) -> LayerServer: ...


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
        cls: ``"module:Class"`` of the layer class the entry stands for (read without
            importing it); :func:`entry_for` matches an instance's exact class against it
            (a subclass may change what the nodes would rebuild, so it is not the entry's).
            Empty: no instance is matched (the layer runs embedded only).
        server: a carried layer's server driver factory over a Link (imported when
            called); None for a DP layer (its server part wraps its inner layer's driver)
            and for a layer with no driver.
        sums_encoded: its driver sums vectors a wrapper's clients encoded (the inner layer
            a DP layer with ``needs_encoded_sum`` may wrap on Flower).
        not_on_flower: why the layer does not run on Flower ("" when it does).
        flower_check: refuses (ConfigurationError) a configuration of the layer that does
            not run on Flower, with the reason (None: every configuration does).
        audit: which release ``secagg dp-audit`` plays for it (``"central"``, ``"local"``,
            ``"distributed"``; None: it is not audited).
        node_uploads: a carried layer's node steps that run the client step, each with how
            the upload then leaves the node (:func:`secagg.node.leave`; imported when
            called): ``(rec, spec, upload, client, part, out, cpu, store) -> reply``.
        node_params: a DP layer whose clients add noise: the parameters a node rebuilds it
            from (the keys of its ``node_params()`` besides ``layer``); empty: no node
            rebuilds it (:func:`secagg.privacy.layers.node_layer`).
        options: the layer-specific run options that configure it (``threshold``,
            ``graph``, ``he_scheme``, ``colluders``, ``bound``, ``cheaters``); ``secagg run``
            refuses one given to a layer that does not list it.
    """

    name: str
    build: Builder
    dp: bool = False
    inner: str | None = None
    sweepable: bool = True
    summary: str = ""
    cls: str = ""
    server: ServerFactory | None = None
    sums_encoded: bool = False
    not_on_flower: str = ""
    flower_check: Callable[[Layer], None] | None = None
    audit: str | None = None
    node_uploads: Mapping[str, NodeUpload] = field(default_factory=dict)
    node_params: tuple[str, ...] = ()
    options: tuple[str, ...] = ()

    @property
    def class_name(self) -> str:
        """The layer class's name (``"SecureSum"``), from :attr:`cls`."""
        return self.cls.rpartition(":")[2]

    @property
    def on_flower(self) -> bool:
        """Whether the layer runs on Flower: it declares no reason not to, and it either has
        a server driver or is a DP layer (whose parts wrap a carried layer's driver)."""
        return not self.not_on_flower and bool(self.cls) and (
            self.server is not None or self.dp)


_REGISTRY: dict[str, LayerEntry] = {}


def register_layer(name: str, *, dp: bool = False, inner: str | None = None,
                   sweepable: bool = True, summary: str = "", cls: str = "",
                   server: ServerFactory | None = None, sums_encoded: bool = False,
                   not_on_flower: str = "", flower_check: Callable[[Layer], None] | None = None,
                   audit: str | None = None, node_uploads: Mapping[str, NodeUpload] | None = None,
                   node_params: tuple[str, ...] = (),
                   options: tuple[str, ...] = ()) -> Callable[[Builder], Builder]:
    """Decorator: register ``builder`` under ``name`` (the keywords are
    :class:`LayerEntry`'s attributes).

    Raises:
        ConfigurationError: ``name`` is taken, a DP layer names no registered inner layer,
            ``cls`` is not ``"module:Class"`` or is registered already.
    """

    def add(builder: Builder) -> Builder:
        if name in _REGISTRY:
            raise ConfigurationError(f"a layer named {name!r} is already registered")
        if dp and (inner is None or inner not in _REGISTRY):
            raise ConfigurationError(
                f"DP layer {name!r} must name a registered inner layer, got {inner!r}")
        if cls and (cls.count(":") != 1 or not all(cls.split(":"))):
            raise ConfigurationError(f"layer {name!r}: cls must be 'module:Class', got {cls!r}")
        if cls and any(e.cls == cls for e in _REGISTRY.values()):
            raise ConfigurationError(f"layer class {cls!r} is already registered")
        steps = dict(node_uploads or {})
        taken = set(steps) & set(upload_steps())
        if taken:
            raise ConfigurationError(f"layer {name!r}: node steps {sorted(taken)} are taken")
        if node_params and not dp:
            raise ConfigurationError(f"layer {name!r}: node_params are for DP layers only")
        _REGISTRY[name] = LayerEntry(name, builder, dp, inner, sweepable, summary, cls,
                                     server, sums_encoded, not_on_flower, flower_check, audit,
                                     steps, tuple(node_params), tuple(options))
        return builder

    return add


def upload_steps() -> dict[str, NodeUpload]:
    """Every registered node step that runs the client step -> how the upload then leaves
    the node (the union of the entries' ``node_uploads``; step names are unique)."""
    return {step: fn for e in _REGISTRY.values() for step, fn in e.node_uploads.items()}


def node_rebuilt(name: object) -> LayerEntry | None:
    """The DP layer registered as ``name`` if a node rebuilds it to add its clients' noise
    (its ``node_params`` are declared), else None."""
    entry = _REGISTRY.get(name) if isinstance(name, str) else None
    return entry if entry is not None and entry.node_params else None


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def entry_for(layer: Layer) -> LayerEntry | None:
    """The entry registered for ``layer``'s exact class (None: none is; a subclass of a
    registered layer is not its entry's, since it may change what the nodes rebuild)."""
    path = _class_path(type(layer))
    return next((e for e in _REGISTRY.values() if e.cls == path), None)


def audited_kind(layer: Layer) -> str | None:
    """Which release ``secagg dp-audit`` plays for ``layer`` (the entry's ``audit``), read
    from the nearest registered class in its MRO, so that a subclass of an audited DP
    layer is audited as that layer; None: it is not audited."""
    for base in type(layer).__mro__:
        path = _class_path(base)
        entry = next((e for e in _REGISTRY.values() if e.cls == path), None)
        if entry is not None:
            return entry.audit
    return None


def layer_names(*, dp: bool | None = None, sweepable: bool | None = None,
                audited: bool | None = None) -> tuple[str, ...]:
    """Registered names, in registration order; ``dp`` / ``sweepable`` / ``audited`` (has
    an ``audit``) filter them."""
    return tuple(e.name for e in _REGISTRY.values()
                 if (dp is None or e.dp == dp) and (sweepable is None or e.sweepable == sweepable)
                 and (audited is None or (e.audit is not None) == audited))


def carried_entries() -> tuple[LayerEntry, ...]:
    """The entries whose layer carries the uploads on Flower (a server driver), in
    registration order."""
    return tuple(e for e in _REGISTRY.values() if e.server is not None and e.on_flower)


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


def _plaintext_server(layer: Layer, *, decryptor: int | None = None,
                      pinned: Mapping[int, bytes] | None = None) -> LayerServer:
    from secagg.layers.plaintext import PlaintextServer

    return PlaintextServer(layer=layer)


def _secure_sum_server(layer: Layer, *, decryptor: int | None = None,
                       pinned: Mapping[int, bytes] | None = None) -> LayerServer:
    from secagg.secure_sum.remote import SecureSumServer

    return SecureSumServer(layer=layer, pinned=pinned)  # type: ignore[arg-type]


def _homomorphic_server(layer: Layer, *, decryptor: int | None = None,
                        pinned: Mapping[int, bytes] | None = None) -> LayerServer:
    from secagg.homomorphic.remote import HomomorphicServer

    return HomomorphicServer(layer=layer, decryptor=decryptor)  # type: ignore[arg-type]


def _plaintext_upload(rec: Any, spec: Any, up: Any, client: int, part: Any,
                      out: dict[str, Any], cpu: float, store: Any) -> dict[str, Any]:
    """Plaintext: the upload packed in the clear
    (:func:`secagg.layers.plaintext.upload_on_node`)."""
    from secagg.layers.plaintext import upload_on_node

    return upload_on_node(rec, spec, up, client, part, out, cpu, store)


def _he_upload(rec: Any, spec: Any, up: Any, client: int, part: Any,
               out: dict[str, Any], cpu: float, store: Any) -> dict[str, Any]:
    """Homomorphic: the upload encrypted (:func:`secagg.homomorphic.node.encrypt`)."""
    from secagg.homomorphic.node import encrypt

    return {**out, **encrypt(rec, spec, up, store)}


def _secure_sum_upload(rec: Any, spec: Any, up: Any, client: int, part: Any,
                       out: dict[str, Any], cpu: float, store: Any) -> dict[str, Any]:
    """SecureSum: encoded, then advertised or shared (:func:`secagg.secure_sum.node.upload`)."""
    from secagg.secure_sum.node import upload

    return upload(rec, spec, up, client, part, out, cpu, store)


def _secure_sum_on_flower(layer: Layer) -> None:
    if layer.identities is not None:  # type: ignore[attr-defined]
        raise ConfigurationError(
            "SecureSum(identities=...) holds the simulated clients' private keys and does not "
            "run on Flower: there each node pins identities itself (node config identity-key "
            "and pinned-keys) and the ServerApp takes the operator's copy of the public keys "
            "(FlowerFederation(pinned_keys=...)); without pins the server model is "
            "honest-but-curious"
        )


def _homomorphic_on_flower(layer: Layer) -> None:
    if layer.key_holder != "decryptor":  # type: ignore[attr-defined]
        raise ConfigurationError(
            "Homomorphic(key_holder='clients') does not run on Flower: the shared secret "
            "context would have to reach the clients without passing through the server, "
            "and Flower routes every message through it (the embedded runtime provisions "
            "it out of band, into each client's node store); use key_holder='decryptor'"
        )


@register_layer("plaintext", summary="the server sees every upload",
                cls="secagg.layers.plaintext:Plaintext", server=_plaintext_server,
                node_uploads={Stage.UPLOAD: _plaintext_upload})
def _plaintext(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.layers.plaintext import Plaintext

    return Plaintext()


@register_layer("secure-sum", summary="dropout-tolerant secure aggregation: the server "
                "learns only the sum", cls="secagg.secure_sum.layer:SecureSum",
                server=_secure_sum_server, sums_encoded=True,
                flower_check=_secure_sum_on_flower, options=("threshold", "graph"),
                node_uploads={Stage.ADVERTISE: _secure_sum_upload,
                              Stage.SHARE: _secure_sum_upload})
def _secure_sum(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.secure_sum import SecureSum

    kwargs: dict[str, Any] = {"threshold": options.threshold, "dropout": options.dropout}
    if options.graph is not None:
        kwargs["graph"] = options.graph
    return SecureSum(**kwargs)


@register_layer("homomorphic", sweepable=False,
                summary="additively homomorphic encryption (TenSEAL BFV or CKKS)",
                cls="secagg.homomorphic.layer:Homomorphic", server=_homomorphic_server,
                flower_check=_homomorphic_on_flower, node_uploads={Stage.HE_UPLOAD: _he_upload},
                options=("he_scheme",))
def _homomorphic(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.homomorphic import Homomorphic

    return Homomorphic(scheme=options.he_scheme)


@register_layer("validated-sum", sweepable=False,
                summary="two non-colluding aggregators sum secret shares and reject a client "
                "whose update breaks its L2 bound (a proof checked on shares)",
                cls="secagg.validated_sum.layer:ValidatedSum",
                not_on_flower="its server driver and node steps (aggregator B as a node role) "
                "are not written yet: the node's protocol-step dispatch (secagg/node.py) "
                "knows only the secure-sum and homomorphic steps",
                options=("bound", "cheaters"))
def _validated_sum(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.validated_sum import ValidatedSum

    return ValidatedSum(bound=options.bound, cheaters=options.cheaters)


def _dp_kwargs(options: LayerOptions) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"epsilon": options.epsilon, "delta": options.delta}
    if options.rounds is not None:
        kwargs["rounds"] = options.rounds
    kwargs.update(options.dp)
    return kwargs


#: what a node rebuilds a DP layer whose clients add noise from (``_DPLayer.node_params``)
_NODE_PARAMS = ("noise_multiplier", "delta", "adjacency", "public", "seed")


@register_layer("central-dp", dp=True, inner="plaintext",
                summary="the aggregator noises the sum",
                cls="secagg.privacy.central:CentralDP", audit="central")
def _central_dp(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.privacy import CentralDP

    assert inner is not None
    return CentralDP(inner, **_dp_kwargs(options))


@register_layer("local-dp", dp=True, inner="plaintext",
                summary="each client noises its own upload",
                cls="secagg.privacy.local:LocalDP", audit="local", node_params=_NODE_PARAMS)
def _local_dp(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.privacy import LocalDP

    assert inner is not None
    return LocalDP(inner, **_dp_kwargs(options))


@register_layer("distributed-dp", dp=True, inner="secure-sum",
                summary="each client adds a share of the noise before secure summation",
                cls="secagg.privacy.distributed:DistributedDP", audit="distributed",
                node_params=(*_NODE_PARAMS, "mechanism", "precision"),
                options=("threshold", "graph", "colluders"))
def _distributed_dp(options: LayerOptions, inner: Layer | None) -> Layer:
    from secagg.privacy import DistributedDP

    assert inner is not None
    return DistributedDP(inner, **_dp_kwargs(options))
