"""The layer registry: one table of layers by name, read by the CLI and the sweep."""

from __future__ import annotations

import pytest

from secagg import cli
from secagg.errors import ConfigurationError, PrivacyError
from secagg.layers.plaintext import Plaintext
from secagg.layers.registry import (
    LayerOptions,
    get_layer,
    layer_names,
    make_layer,
    register_layer,
)
from secagg.privacy import CentralDP, DistributedDP, LocalDP
from secagg.secure_sum import SecureSum
from secagg.sweep import DP_LAYERS as SWEEP_DP
from secagg.sweep import PLAIN_LAYERS as SWEEP_PLAIN


def test_the_cli_and_the_sweep_read_the_registry():
    assert layer_names() == ("plaintext", "secure-sum", "homomorphic", "validated-sum",
                             "central-dp", "local-dp", "distributed-dp")
    assert cli.LAYERS == layer_names() and cli.DP_LAYERS == layer_names(dp=True)
    assert SWEEP_PLAIN == ("plaintext", "secure-sum")  # homomorphic is not sweepable
    assert SWEEP_DP == ("central-dp", "local-dp", "distributed-dp")


def test_dp_layers_wrap_their_registered_inner_layer_with_the_options():
    opts = LayerOptions(threshold=3, epsilon=2.0, delta=1e-6)
    for name, cls, inner in (("central-dp", CentralDP, Plaintext),
                             ("local-dp", LocalDP, Plaintext),
                             ("distributed-dp", DistributedDP, SecureSum)):
        layer = make_layer(name, opts)
        assert type(layer) is cls and type(layer.inner) is inner
        assert get_layer(name).dp and get_layer(name).inner == inner.name
    assert make_layer("distributed-dp", opts).inner.threshold == 3
    given = Plaintext()
    assert make_layer("central-dp", opts, inner=given).inner is given


def test_refusals_are_typed_and_name_the_problem():
    with pytest.raises(ConfigurationError, match="unknown layer 'magic'.*plaintext"):
        make_layer("magic")
    with pytest.raises(ConfigurationError, match="wraps no inner"):
        make_layer("plaintext", inner=Plaintext())
    with pytest.raises(PrivacyError, match="epsilon"):
        make_layer("central-dp", LayerOptions())
    with pytest.raises(ConfigurationError, match="already registered"):
        register_layer("plaintext")(lambda options, inner: Plaintext())
    with pytest.raises(ConfigurationError, match="inner"):
        register_layer("new-dp", dp=True, inner="nope")(lambda options, inner: Plaintext())
    assert "new-dp" not in layer_names()


# -- the one registry every reader of layer kinds asks (issue 34, point 4) --------------


@pytest.fixture
def registry():
    """The registry's table, restored after the test (a test registers layers of its own)."""
    from secagg.layers import registry as reg

    saved = dict(reg._REGISTRY)
    yield reg
    reg._REGISTRY.clear()
    reg._REGISTRY.update(saved)


class _Relabelled(Plaintext):
    """A third-party layer: Plaintext under a name of its own."""

    name = "relabelled"


def _path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def test_a_registered_layer_is_carried_on_flower_by_its_entry(registry):
    """A layer registered with a server driver runs on Flower without any table elsewhere
    being edited: the engine's check and driver come from its entry."""
    from secagg.engine import check_remote, layer_server
    from secagg.layers.plaintext import PlaintextServer

    built = []

    def server(layer, *, decryptor=None, pinned=None):
        built.append((layer, decryptor, pinned))
        return PlaintextServer(layer=layer)

    registry.register_layer("relabelled", cls=_path(_Relabelled), server=server,
                            summary="test")(lambda options, inner: _Relabelled())
    layer = make_layer("relabelled")
    assert registry.entry_for(layer).on_flower
    check_remote(layer)
    dp, drv = layer_server(layer, pinned={1: b"k" * 32})
    assert dp is None and isinstance(drv, PlaintextServer) and drv.layer is layer
    assert built == [(layer, None, {1: b"k" * 32})]
    wrapped = CentralDP(layer, noise_multiplier=1.0)  # a DP layer around it runs too
    assert layer_server(wrapped)[0] is wrapped


def test_a_layer_registered_off_flower_is_refused_there_with_its_reason(registry):
    from secagg.engine import check_remote

    registry.register_layer("relabelled", cls=_path(_Relabelled),
                            not_on_flower="it needs the clients' shared state")(
        lambda options, inner: _Relabelled())
    entry = get_layer("relabelled")
    assert not entry.on_flower and entry.audit is None
    with pytest.raises(ConfigurationError, match="does not run on Flower yet "
                       r"\(it needs the clients' shared state\)"):
        check_remote(make_layer("relabelled"))


def test_an_entry_is_an_exact_class_and_its_fields_are_checked(registry):
    """A subclass may change what the nodes rebuild: it is not its base's entry (so it is
    refused on Flower), but dp-audit audits it as the DP layer it derives from."""
    from secagg.layers.registry import audited_kind, entry_for

    class Sub(SecureSum):
        pass

    class SubCentral(CentralDP):
        pass

    assert entry_for(SecureSum(threshold=2)).name == "secure-sum"
    assert entry_for(Sub(threshold=2)) is None
    assert audited_kind(SubCentral(Plaintext(), noise_multiplier=1.0)) == "central"
    assert audited_kind(Plaintext()) is None
    with pytest.raises(ConfigurationError, match="already registered"):
        registry.register_layer("again", cls="secagg.layers.plaintext:Plaintext")(
            lambda options, inner: Plaintext())
    with pytest.raises(ConfigurationError, match="module:Class"):
        registry.register_layer("again", cls="Plaintext")(lambda options, inner: Plaintext())
    with pytest.raises(ConfigurationError, match="taken"):
        registry.register_layer("again", node_uploads={"upload": print})(
            lambda options, inner: Plaintext())
    with pytest.raises(ConfigurationError, match="DP layers only"):
        registry.register_layer("again", node_params=("seed",))(
            lambda options, inner: Plaintext())
    assert "again" not in layer_names()


def test_the_node_and_dp_audit_read_the_registry(registry):
    """The node's upload steps, the DP layers a node rebuilds and the audited layers are
    the registry's; a node step registered later is found by the node."""
    from secagg.cli.dp_audit import DP_AUDIT_LAYERS
    from secagg.node import UPLOADS
    from secagg.privacy.layers import node_layer, wraps_secure_sum
    from threat_models.dp_audit import LAYER_NAMES

    assert layer_names(audited=True) == LAYER_NAMES == DP_AUDIT_LAYERS[:3]
    assert DP_AUDIT_LAYERS[3:] == ("dp-ftrl", "dp-sgd", "all")
    assert set(UPLOADS) == {"upload", "advertise", "share", "he-upload"}
    for layer in (LocalDP(Plaintext(), noise_multiplier=1.5, seed=3, public=("n",)),
                  DistributedDP(SecureSum(threshold=2), noise_multiplier=1.5, seed=3,
                                mechanism="skellam")):
        params = layer.node_params()
        rebuilt = node_layer(params, layer.inner)
        assert type(rebuilt) is type(layer) and rebuilt.node_params() == params
        assert wraps_secure_sum(params) == (layer.name == "distributed-dp")
    with pytest.raises(PrivacyError, match=r"\['distributed-dp', 'local-dp'\] only"):
        node_layer(CentralDP(Plaintext(), noise_multiplier=1.0).node_params(), Plaintext())
    with pytest.raises(PrivacyError, match=r"unknown DP parameters \['mechanism'\]"):
        node_layer({**LocalDP(Plaintext(), noise_multiplier=1.0).node_params(),
                    "mechanism": "skellam"}, Plaintext())

    def mine(rec, spec, up, client, part, out, cpu, store):
        return {"mine": True}

    registry.register_layer("relabelled", node_uploads={"my-upload": mine})(
        lambda options, inner: _Relabelled())
    assert UPLOADS["my-upload"] is mine


def test_dp_audit_builds_its_layers_from_the_registry_as_before():
    """dp-audit's layers by name are the ones a user would build by hand, and its auditors
    refuse a layer the registry does not mark as audited (typed)."""
    from threat_models.dp_audit import AuditError, SumRelease
    from threat_models.dp_audit import make_layer as audit_layer
    from threat_models.dp_audit_fields import FieldsRelease
    from threat_models.dp_audit_tree import TreeRelease

    common = {"epsilon": 2.0, "delta": 1e-6, "rounds": 1, "adjacency": "client", "seed": 5}
    by_hand = {"central-dp": CentralDP(Plaintext(), **common),
               "local-dp": LocalDP(Plaintext(), **common),
               "distributed-dp": DistributedDP(SecureSum(threshold=4), mechanism="skellam",
                                               **common)}
    for name, layer in by_hand.items():
        got = audit_layer(name, epsilon=2.0, delta=1e-6, adjacency="client",
                          mechanism="skellam", threshold=4, seed=5)
        assert type(got) is type(layer) and got.describe() == layer.describe()
    with pytest.raises(AuditError, match="unknown DP layer 'plaintext'"):
        audit_layer("plaintext", epsilon=1.0)
    with pytest.raises(AuditError, match="SumRelease audits .* got Plaintext"):
        SumRelease(Plaintext())
    with pytest.raises(AuditError, match="FieldsRelease audits .* got DistributedDP"):
        FieldsRelease(by_hand["distributed-dp"])
    with pytest.raises(AuditError, match=r"TreeRelease audits CentralDP\(tree=True\)"):
        TreeRelease(epsilon=1.0, layer=by_hand["central-dp"])


def test_secagg_run_takes_a_layers_options_from_its_entry(registry):
    """``secagg run`` refuses an option the chosen layer's entry does not list, naming the
    layers that list it; a registered layer that lists one takes it."""
    import argparse

    from secagg.cli.run_checks import _check_applies, _defaults

    assert {n: get_layer(n).options for n in layer_names() if get_layer(n).options} == {
        "secure-sum": ("threshold", "graph"), "homomorphic": ("he_scheme",),
        "validated-sum": ("bound", "cheaters"),
        "distributed-dp": ("threshold", "graph", "colluders")}
    registry.register_layer("relabelled", options=("he_scheme",))(
        lambda options, inner: _Relabelled())
    args = argparse.Namespace(**{**_defaults(), "layer": "relabelled", "group_layer": [],
                                 "he_scheme": "ckks"})
    _check_applies(args)
    args.threshold = 5
    with pytest.raises(ConfigurationError, match=r"--threshold does not apply to --layer "
                       r"relabelled: .*\(secure-sum or distributed-dp\)"):
        _check_applies(args)
