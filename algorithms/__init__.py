"""Federated algorithms written as uploads (see :mod:`algorithms.base`).

Each algorithm lives in its own module; this package imports them lazily by name.
"""

from __future__ import annotations

from secagg.lazy import lazy_exports

_EXPORTS = {
    "Algorithm": "algorithms.base", "Phase": "algorithms.base", "ClientState": "algorithms.base",
    "FedAvg": "algorithms.fedavg", "FedLog": "algorithms.fedlog",
    "FedProx": "algorithms.fedprox", "FedUV": "algorithms.feduv",
    "SphereFed": "algorithms.spherefed", "CCVR": "algorithms.ccvr",
    "TurboSVM": "algorithms.turbosvm",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports("algorithms", _EXPORTS, globals())
