"""Federated algorithms written as uploads (see :mod:`algorithms.base`).

Each algorithm lives in its own module; this package imports them lazily by name.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Algorithm": "algorithms.base", "Phase": "algorithms.base", "ClientState": "algorithms.base",
    "FedAvg": "algorithms.fedavg", "FedLog": "algorithms.fedlog",
    "FedProx": "algorithms.fedprox", "FedUV": "algorithms.feduv",
    "SphereFed": "algorithms.spherefed", "CCVR": "algorithms.ccvr",
    "TurboSVM": "algorithms.turbosvm",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'algorithms' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
