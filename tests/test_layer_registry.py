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
    assert layer_names() == ("plaintext", "secure-sum", "homomorphic", "central-dp",
                             "local-dp", "distributed-dp")
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
