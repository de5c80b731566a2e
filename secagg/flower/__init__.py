"""Run secagg algorithms and layers on Flower (``pip install secagg[flower]``).

The embedded engine (:class:`secagg.federation.Federation`) runs every party in one
process. This package runs the same algorithm and layer across machines on Flower's
runtime: :func:`server_app` gives a ``flwr.serverapp.ServerApp`` that plays the server
side of every phase (broadcast, the layer's server protocol, the server step) and
:func:`client_app` gives a ``flwr.clientapp.ClientApp`` that plays one client on its node
(its own data, its own keys). Every broadcast, upload and secure-sum stage travels as a
Flower ``Message`` whose ``RecordDict`` carries this toolkit's own wire bytes; the run
returns the same :class:`~secagg.federation.Result`, cost ledger and transcript as the
embedded engine.

Layers carried: :class:`~secagg.layers.plaintext.Plaintext`,
:class:`~secagg.secure_sum.SecureSum` (without pinned identities),
:class:`~secagg.homomorphic.Homomorphic` with a decryptor node, and the DP layers around
them: :class:`~secagg.privacy.layers.CentralDP` (the ServerApp noises the sums),
:class:`~secagg.privacy.layers.LocalDP` (each node noises its own upload) and
:class:`~secagg.privacy.layers.DistributedDP` around SecureSum (each node adds its noise share
before masking). Any other layer is refused with :class:`~secagg.errors.ConfigurationError`
naming it. The server model is honest-but-curious: the ServerApp sends the nodes the
parameters of their noise (as it ships their ClientApp code, unless the SuperNodes verify
apps), so the DP guarantee holds against a server that follows the protocol and against
everyone who sees only what it releases.

flwr is imported only here, never by ``import secagg``.
"""

from __future__ import annotations

from secagg.errors import ConfigurationError

try:
    import flwr  # noqa: F401
except ImportError:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "secagg.flower needs Flower: pip install 'secagg[flower]' (flwr[simulation]>=1.41,<1.43)"
    ) from None

from secagg.lazy import lazy_exports  # noqa: E402

# lazy, so that a ClientApp process (one per message on a SuperNode) imports only its side
_EXPORTS = {
    "client_app": "secagg.flower.client", "node_partition_loader": "secagg.flower.client",
    "FlowerFederation": "secagg.flower.server", "server_app": "secagg.flower.server",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("secagg.flower", _EXPORTS, globals())
